//! The loop of a sink subtask: write records, pre-commit at barriers (keeping every
//! pre-commit that is not yet committed in the snapshot), commit once the coordinator
//! reports a checkpoint complete, and wait for the final checkpoint's commit at the end.
//!
//! A sink may leave a pre-commit flushing ([`PreCommit::Flushing`]): the loop then goes on
//! writing the next records and acknowledges the checkpoint when the flush ends; the next
//! barrier and the end of the input wait for it first.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use crate::channel::{GateEvent, InputGate};
use crate::connector::{PreCommit, Sink};
use crate::element::{CheckpointId, Data};
use crate::state::format::encode;
use crate::task::{Slice, TaskContext};
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

/// A pre-commit whose flush runs while the sink writes the next checkpoint's records.
struct Flushing {
    checkpoint: CheckpointId,
    done: Pin<Box<dyn Future<Output = ()> + Send>>,
    started: Instant,
}

/// Keeps a pre-commit's result among the pending commits and stores and acknowledges its
/// checkpoint with every pre-commit not yet committed. A fatal error fails the job; any
/// other fails only the checkpoint.
fn store_pre_commit<P: Clone + serde::Serialize>(
    pending: &mut PendingCommits<P>,
    id: CheckpointId,
    result: Result<Option<P>>,
    ctx: &TaskContext,
) -> Result<()> {
    let snap = match result {
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
    Ok(())
}

/// Finishes a pre-commit whose flush ended (`f.done` resolved; it must not be polled
/// again) and acknowledges its checkpoint.
async fn finish_flushed<T, S: Sink<T>>(
    sink: &mut S,
    pending: &mut PendingCommits<S::Pending>,
    f: Flushing,
    ctx: &TaskContext,
) -> Result<()> {
    let result = sink.finish_pre_commit(f.checkpoint).await;
    tracing::trace!(
        checkpoint = f.checkpoint,
        subtask = ctx.info.index,
        flush_ms = f.started.elapsed().as_secs_f64() * 1e3,
        ok = result.is_ok(),
        "pre-commit flushed"
    );
    store_pre_commit(pending, f.checkpoint, result, ctx)
}

pub(crate) async fn run_sink<T: Data, S: Sink<T>>(
    mut sink: S,
    mut gate: InputGate<T>,
    ctx: TaskContext,
) -> Result<()> {
    let mut pending = PendingCommits::<S::Pending> { list: Vec::new() };
    let mut progress = ctx.services.progress.clone();
    let mut progress_open = true;
    let mut flushing: Option<Flushing> = None;
    let mut slice = Slice::new();
    loop {
        slice.tick().await;
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
                // `changed()` marks the value seen, so the `has_changed` check at the loop
                // top does not fire after this branch: commit here, or commits would wait
                // until the end of the job.
                if progress_open {
                    let p = *progress.borrow_and_update();
                    fatal_only(commit_up_to(&mut sink, &mut pending, p.completed, &ctx).await)?;
                }
                continue;
            }
            _ = async { flushing.as_mut().expect("guarded by the branch condition").done.as_mut().await }, if flushing.is_some() => {
                let f = flushing.take().expect("guarded by the branch condition");
                finish_flushed(&mut sink, &mut pending, f, &ctx).await?;
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
                // checkpoints are acknowledged in order: the previous flush ends first
                if let Some(mut f) = flushing.take() {
                    f.done.as_mut().await;
                    finish_flushed(&mut sink, &mut pending, f, &ctx).await?;
                }
                match sink.start_pre_commit(id).await {
                    Ok(PreCommit::Flushing(done)) => {
                        tracing::trace!(
                            checkpoint = id,
                            subtask = ctx.info.index,
                            "pre-commit flushing while the next records are written"
                        );
                        flushing = Some(Flushing {
                            checkpoint: id,
                            done,
                            started: Instant::now(),
                        });
                    }
                    Ok(PreCommit::Done(p)) => store_pre_commit(&mut pending, id, Ok(p), &ctx)?,
                    Err(e) => store_pre_commit(&mut pending, id, Err(e), &ctx)?,
                }
            }
            GateEvent::End => break,
        }
    }
    if let Some(mut f) = flushing.take() {
        f.done.as_mut().await;
        finish_flushed(&mut sink, &mut pending, f, &ctx).await?;
    }
    // Input ended after the final barrier: wait until it is complete, then commit.
    let last_barrier = pending.list.last().map(|(id, _)| *id).unwrap_or(0);
    loop {
        let p = *progress.borrow_and_update();
        match after_input_ended(
            p.completed,
            last_barrier,
            p.failed || !progress_open,
            ctx.services.externally_sealed,
        ) {
            AfterInputEnded::Commit => {
                return commit_up_to(&mut sink, &mut pending, p.completed, &ctx).await;
            }
            AfterInputEnded::LeaveForRecovery => {
                let left: Vec<CheckpointId> = pending.list.iter().map(|(id, _)| *id).collect();
                if !left.is_empty() {
                    tracing::warn!(checkpoints = ?left, "job failed after its input ended: pre-commits left for the next start's recovery");
                }
                return Ok(());
            }
            AfterInputEnded::AbortNewer => {
                for (id, p2) in std::mem::take(&mut pending.list) {
                    if id > p.completed {
                        if let Err(e) = sink.abort(p2).await {
                            tracing::warn!(checkpoint = id, error = %e, "sink abort failed");
                        }
                    }
                }
                return Ok(());
            }
            AfterInputEnded::Wait => {}
        }
        progress_open = progress.changed().await.is_ok();
    }
}

/// What a sink whose input ended does with its pre-commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterInputEnded {
    /// The last barrier's checkpoint is complete: commit everything up to it.
    Commit,
    /// The job failed and this run is the authority on completeness: abort the pre-commits
    /// of checkpoints newer than the last complete one.
    AbortNewer,
    /// The job failed, but a completion hook decides completeness outside the runtime (a seal
    /// may have committed and then failed to answer): aborting could destroy the output of a
    /// complete checkpoint, so leave every pre-commit to the next start's recovery, which
    /// restores the checkpoint the hook's record names and commits or discards them.
    LeaveForRecovery,
    /// Neither yet: wait for the coordinator's next word.
    Wait,
}

fn after_input_ended(
    completed: CheckpointId,
    last_barrier: CheckpointId,
    job_failed: bool,
    externally_sealed: bool,
) -> AfterInputEnded {
    if completed >= last_barrier {
        AfterInputEnded::Commit
    } else if !job_failed {
        AfterInputEnded::Wait
    } else if externally_sealed {
        AfterInputEnded::LeaveForRecovery
    } else {
        AfterInputEnded::AbortNewer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_job_never_aborts_on_its_own() {
        use AfterInputEnded::*;
        // the final checkpoint 5 is complete: commit, whoever seals
        assert_eq!(after_input_ended(5, 5, false, true), Commit);
        assert_eq!(after_input_ended(5, 5, true, false), Commit);
        // not yet complete, job alive: wait
        assert_eq!(after_input_ended(4, 5, false, true), Wait);
        assert_eq!(after_input_ended(4, 5, false, false), Wait);
        // the job failed before 5 completed: the runtime aborts only what it alone decides
        assert_eq!(after_input_ended(4, 5, true, false), AbortNewer);
        assert_eq!(after_input_ended(4, 5, true, true), LeaveForRecovery);
    }
}
