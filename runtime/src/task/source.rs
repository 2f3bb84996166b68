//! The loop of a source subtask: poll the source, inject barriers when the coordinator
//! triggers a checkpoint (recording the position), end the stream after the final barrier.

use std::time::Instant;

use tokio::sync::mpsc;

use crate::connector::{Source, SourcePoll};
use crate::element::{Data, StreamElement, Watermark};
use crate::output::Output;
use crate::state::format::encode;
use crate::task::{CoordinatorMsg, Slice, SourceControl, TaskContext};
use crate::{Error, Result};

pub(crate) async fn run_source<T: Data, S: Source<T>>(
    mut source: S,
    mut output: Output<T>,
    mut control: mpsc::UnboundedReceiver<SourceControl>,
    ctx: TaskContext,
) -> Result<()> {
    let batch_size = ctx.services.batch_size;
    let mut buf = Vec::with_capacity(batch_size);
    let mut exhausted = false;
    let mut next_ctrl: Option<SourceControl> = None;
    let mut progress = ctx.services.progress.clone();
    let mut committed = progress.borrow().completed;
    let mut last_watermark = None;
    let mut idle = false;
    let mut slice = Slice::new();
    loop {
        slice.tick().await;
        let ctrl =
            match next_ctrl.take() {
                Some(c) => Some(c),
                None if exhausted => Some(control.recv().await.ok_or_else(|| {
                    Error::ChannelClosed("checkpoint coordinator stopped".into())
                })?),
                None => control.try_recv().ok(),
            };
        if let Some(SourceControl::Trigger(barrier)) = ctrl {
            output.flush().await?;
            let id = barrier.checkpoint_id;
            let snap = source.snapshot_position(id).and_then(|p| {
                let mut s = ctx.snapshot_for(id);
                s.operator_state = Some(encode(&p)?);
                s.event_times = source.event_times();
                Ok(s)
            });
            ctx.persist_and_ack(id, snap);
            output.broadcast(|| StreamElement::Barrier(barrier)).await?;
            if barrier.is_final {
                output.broadcast(|| StreamElement::EndOfStream).await?;
                return Ok(());
            }
            continue;
        }
        if progress.has_changed().unwrap_or(false) {
            let p = *progress.borrow_and_update();
            if p.completed > committed {
                committed = p.completed;
                source
                    .checkpoint_complete(committed)
                    .map_err(|e| ctx.op_err(e))?;
            }
        }
        let start = Instant::now();
        let status = source
            .poll(&mut buf, batch_size)
            .await
            .map_err(|e| ctx.op_err(e))?;
        ctx.metrics.busy(start.elapsed());
        output.emit_all(&mut buf).await?;
        // (event time) idleness: active again before the watermark, idle after it
        let now_idle = source.is_idle();
        if idle && !now_idle {
            idle = false;
            output.broadcast(|| StreamElement::Idleness(false)).await?;
        }
        if let Some(w) = source.current_watermark() {
            if last_watermark.is_none_or(|l| w > l) {
                last_watermark = Some(w);
                output.broadcast(|| StreamElement::Watermark(w)).await?;
            }
        }
        if now_idle && !idle && !matches!(status, SourcePoll::Exhausted) {
            idle = true;
            output.broadcast(|| StreamElement::Idleness(true)).await?;
        }
        match status {
            SourcePoll::Ready => {}
            SourcePoll::Idle(wait) => {
                output.flush().await?;
                tokio::select! {
                    c = control.recv() => {
                        next_ctrl = Some(c.ok_or_else(|| Error::ChannelClosed("checkpoint coordinator stopped".into()))?);
                    }
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            SourcePoll::Exhausted => {
                if idle {
                    idle = false;
                    output.broadcast(|| StreamElement::Idleness(false)).await?;
                }
                // end of input: an event-time source releases everything downstream
                if last_watermark.is_some_and(|l| l < Watermark(i64::MAX)) {
                    last_watermark = Some(Watermark(i64::MAX));
                    output
                        .broadcast(|| StreamElement::Watermark(Watermark(i64::MAX)))
                        .await?;
                }
                output.flush().await?;
                exhausted = true;
                let _ = ctx.services.ack_tx.send(CoordinatorMsg::SourceExhausted);
            }
        }
    }
}
