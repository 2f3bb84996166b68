//! The loop of a sink subtask: write records, pre-commit at barriers (keeping every
//! pre-commit that is not yet committed in the snapshot), commit once the coordinator
//! reports a checkpoint complete, and wait for the final checkpoint's commit at the end.

use std::time::Instant;

use crate::channel::{GateEvent, InputGate};
use crate::connector::Sink;
use crate::element::{CheckpointId, Data};
use crate::state::format::encode;
use crate::task::TaskContext;
use crate::{Error, Result};

struct PendingCommits<P> {
    list: Vec<(CheckpointId, P)>,
}

impl<P: Clone + serde::Serialize> PendingCommits<P> {
    fn encoded(&self) -> Result<Vec<(CheckpointId, Vec<u8>)>> {
        self.list
            .iter()
            .map(|(id, p)| Ok((*id, encode(p)?)))
            .collect()
    }
}

async fn commit_up_to<T, S: Sink<T>>(
    sink: &mut S,
    pending: &mut PendingCommits<S::Pending>,
    completed: CheckpointId,
    ctx: &TaskContext,
) -> Result<()> {
    let mut keep = Vec::new();
    let mut first_err = None;
    for (id, p) in std::mem::take(&mut pending.list) {
        if id > completed {
            keep.push((id, p));
            continue;
        }
        match sink.commit(id, p.clone()).await {
            Ok(()) => tracing::debug!(checkpoint = id, subtask = ctx.info.index, "sink committed"),
            Err(e) => {
                tracing::warn!(checkpoint = id, subtask = ctx.info.index, error = %e, "sink commit failed; will retry");
                keep.push((id, p));
                first_err.get_or_insert(e);
            }
        }
    }
    pending.list = keep;
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Keeps only a fatal error (the others are retried at the next completion).
fn fatal_only(r: Result<()>) -> Result<()> {
    match r {
        Err(e @ Error::Fatal(_)) => {
            tracing::error!(error = %e, "sink cannot commit any more; the job fails");
            Err(e)
        }
        _ => Ok(()),
    }
}

pub(crate) async fn run_sink<T: Data, S: Sink<T>>(
    mut sink: S,
    mut gate: InputGate<T>,
    ctx: TaskContext,
) -> Result<()> {
    let mut pending = PendingCommits::<S::Pending> { list: Vec::new() };
    let mut progress = ctx.services.progress.clone();
    let mut progress_open = true;
    loop {
        if progress_open && progress.has_changed().unwrap_or(false) {
            let p = *progress.borrow_and_update();
            // a failing commit is retried at the next completion (it stays pending), unless
            // the sink says it cannot take part any more
            fatal_only(commit_up_to(&mut sink, &mut pending, p.completed, &ctx).await)?;
        }
        let ev = tokio::select! {
            biased;
            r = progress.changed(), if progress_open => {
                progress_open = r.is_ok();
                // onceflow-kafka-connectors fix: `changed()` marks the value seen, so the
                // `has_changed` check at the loop top never fired after this branch and
                // commits waited until the end of the job. Commit here.
                if progress_open {
                    let p = *progress.borrow_and_update();
                    fatal_only(commit_up_to(&mut sink, &mut pending, p.completed, &ctx).await)?;
                }
                continue;
            }
            ev = gate.next() => ev?,
        };
        match ev {
            GateEvent::Records(batch) => {
                let start = Instant::now();
                ctx.metrics.records_in.increment(batch.len() as u64);
                sink.write_batch(batch).await.map_err(|e| ctx.op_err(e))?;
                ctx.metrics.busy(start.elapsed());
            }
            GateEvent::Watermark(_) | GateEvent::Idleness(_) => {}
            GateEvent::Barrier { barrier, alignment } => {
                ctx.metrics.alignment.record(alignment.as_secs_f64());
                let id = barrier.checkpoint_id;
                let snap = match sink.pre_commit(id).await {
                    Ok(p) => {
                        if let Some(p) = p {
                            pending.list.push((id, p));
                        }
                        pending.encoded().map(|list| {
                            let mut s = ctx.snapshot_for(id);
                            s.pending_commits = list;
                            s
                        })
                    }
                    Err(e @ Error::Fatal(_)) => return Err(e),
                    Err(e) => Err(e),
                };
                ctx.persist_and_ack(id, snap);
            }
            GateEvent::End => break,
        }
    }
    // Input ended after the final barrier: wait until it is complete, then commit.
    let last_barrier = pending.list.last().map(|(id, _)| *id).unwrap_or(0);
    loop {
        let p = *progress.borrow_and_update();
        if p.completed >= last_barrier {
            return commit_up_to(&mut sink, &mut pending, p.completed, &ctx).await;
        }
        if p.failed || !progress_open {
            for (id, p2) in std::mem::take(&mut pending.list) {
                if id > p.completed {
                    if let Err(e) = sink.abort(p2).await {
                        tracing::warn!(checkpoint = id, error = %e, "sink abort failed");
                    }
                }
            }
            return Ok(());
        }
        progress_open = progress.changed().await.is_ok();
    }
}
