//! The loop of an operator subtask: read the gate, call the operator's hooks, snapshot at
//! aligned barriers, forward barriers and watermarks.

use std::time::Instant;

use futures::FutureExt;

use crate::channel::{GateEvent, InputGate};
use crate::element::{Data, StreamElement};
use crate::operator::Operator;
use crate::output::Output;
use crate::task::{Slice, TaskContext};
use crate::Result;

pub(crate) async fn run_operator<In: Data, Out: Data, Op: Operator<In, Out>>(
    mut op: Op,
    mut gate: InputGate<In>,
    mut output: Output<Out>,
    ctx: TaskContext,
) -> Result<()> {
    let mut out = Vec::new();
    let mut progress = ctx.services.progress.clone();
    let mut committed = progress.borrow().completed;
    let mut progress_open = true;
    let mut slice = Slice::new();
    loop {
        slice.tick().await;
        if progress_open && progress.has_changed().unwrap_or(false) {
            let p = *progress.borrow_and_update();
            if p.completed > committed {
                committed = p.completed;
                op.handle_commit(committed).map_err(|e| ctx.op_err(e))?;
            }
        }
        if let Some(deadline) = op.processing_deadline() {
            let now = Instant::now();
            if deadline <= now {
                op.on_processing_time(now, &mut out)
                    .map_err(|e| ctx.op_err(e))?;
                output.emit_all(&mut out).await?;
                continue;
            }
        }
        let ev = match gate.next().now_or_never() {
            Some(ev) => ev?,
            None => {
                output.flush().await?;
                let deadline = op.processing_deadline().map(tokio::time::Instant::from_std);
                tokio::select! {
                    biased;
                    r = progress.changed(), if progress_open => {
                        progress_open = r.is_ok();
                        continue;
                    }
                    _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() => continue,
                    ev = gate.next() => ev?,
                }
            }
        };
        match ev {
            GateEvent::Records(batch) => {
                let start = Instant::now();
                ctx.metrics.records_in.increment(batch.len() as u64);
                for r in batch {
                    op.process(r, &mut out).map_err(|e| ctx.op_err(e))?;
                }
                ctx.metrics.busy(start.elapsed());
                output.emit_all(&mut out).await?;
            }
            GateEvent::Watermark(w) => {
                let fwd = op
                    .handle_watermark(w, &mut out)
                    .map_err(|e| ctx.op_err(e))?;
                output.emit_all(&mut out).await?;
                if let Some(fw) = fwd {
                    output.broadcast(|| StreamElement::Watermark(fw)).await?;
                }
            }
            // (event time) forward idleness so downstream minimums skip this subtask
            GateEvent::Idleness(idle) => {
                output.broadcast(|| StreamElement::Idleness(idle)).await?;
            }
            GateEvent::Barrier { barrier, alignment } => {
                ctx.metrics.alignment.record(alignment.as_secs_f64());
                let id = barrier.checkpoint_id;
                let snap = op.snapshot(id).map(|s| {
                    let mut snap = ctx.snapshot_for(id);
                    snap.key_groups = s.key_groups;
                    snap.operator_state = s.operator_state;
                    snap
                });
                // the changes released by this barrier reach the changelog before the barrier
                // is acknowledged, so they are there when the checkpoint completes
                let snap = match (&ctx.services.changelog, snap) {
                    (Some(changelog), Ok(snap)) => op
                        .take_state_changes()
                        .and_then(|changes| match changes {
                            Some(changes) => changelog.write_for_checkpoint(
                                id,
                                &ctx.info.node_uid,
                                ctx.info.index,
                                changes,
                            ),
                            None => Ok(()),
                        })
                        .map(|()| snap),
                    (_, snap) => snap,
                };
                ctx.metrics.state_entries.set(op.state_entries() as f64);
                ctx.persist_and_ack(id, snap);
                output.broadcast(|| StreamElement::Barrier(barrier)).await?;
            }
            GateEvent::End => {
                op.finish(&mut out).map_err(|e| ctx.op_err(e))?;
                output.emit_all(&mut out).await?;
                output.broadcast(|| StreamElement::EndOfStream).await?;
                return Ok(());
            }
        }
    }
}
