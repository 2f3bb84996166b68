//! Subtask loops (source, operator, sink) and what they share: the coordinator channel,
//! progress notifications and snapshot persistence.

pub(crate) mod operator;
pub(crate) mod sink;
pub(crate) mod source;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::checkpoint::{CheckpointStorage, StateFileMetadata};
use crate::connector::SubtaskInfo;
use crate::element::{Barrier, CheckpointId};
use crate::metrics::SubtaskMetrics;
use crate::state::format::{self, encode};
use crate::state::SubtaskSnapshot;
use crate::{Error, Result};

/// How long a subtask runs before it gives its worker thread back to tokio: timers fire
/// within about this much of their time. 1 ms cost the example job about 10 % more CPU per
/// record (more rounds through the scheduler, smaller bursts per channel); 10 ms cost nothing
/// measurable (docs/BENCHMARKS.md).
pub(crate) const TIME_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// Makes a busy subtask yield once it has run for [`TIME_SLICE`]. tokio's cooperative
/// budget (128 channel operations per poll) assumes cheap operations, but here one operation
/// carries a batch of up to 256 records, so a subtask with input waiting could keep its
/// worker for tens of milliseconds per poll. tokio fires timers and picks up tasks woken
/// from other threads (a blocking call that finished, such as a sink's drain or commit) only
/// between polls, every 61 of them when work keeps coming, so the checkpoint coordinator's
/// ticks and a sink's wake-ups came hundreds of milliseconds late under load. A yield lets
/// the worker poll its timers and I/O first.
pub(crate) struct Slice(std::time::Instant);

impl Slice {
    pub(crate) fn new() -> Self {
        Slice(std::time::Instant::now())
    }

    /// Yields if this subtask has run for [`TIME_SLICE`] since its last yield here (it may
    /// have waited in between: then the yield is one extra, cheap, round through the
    /// scheduler).
    pub(crate) async fn tick(&mut self) {
        if self.0.elapsed() >= TIME_SLICE {
            tokio::task::yield_now().await;
            self.0 = std::time::Instant::now();
        }
    }
}

/// Messages from subtasks to the checkpoint coordinator.
#[derive(Debug)]
pub(crate) enum CoordinatorMsg {
    /// A subtask finished its part of a checkpoint (state written, or failed).
    Ack {
        checkpoint: CheckpointId,
        node_uid: String,
        subtask: u32,
        result: std::result::Result<Option<StateFileMetadata>, String>,
    },
    /// A source subtask has no more input.
    SourceExhausted,
}

/// Control messages to a source subtask.
#[derive(Debug)]
pub(crate) enum SourceControl {
    /// Inject this barrier.
    Trigger(Barrier),
}

/// Job progress published by the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JobProgress {
    /// Newest complete checkpoint.
    pub completed: CheckpointId,
    /// The job is failing: stop waiting.
    pub failed: bool,
}

/// Shared by all subtasks of a job.
pub(crate) struct TaskServices {
    pub ack_tx: mpsc::UnboundedSender<CoordinatorMsg>,
    pub progress: watch::Receiver<JobProgress>,
    pub storage: Option<Arc<dyn CheckpointStorage>>,
    /// Snapshots up to this many framed bytes go into the checkpoint metadata, not a file.
    pub state_inline_threshold: usize,
    pub batch_size: usize,
    /// A completion hook decides outside the runtime which checkpoints are complete (e.g. a
    /// seal in Kafka): a failed seal may still have committed, so sinks never abort a
    /// pre-commit on their own; the next start's recovery decides.
    pub externally_sealed: bool,
    /// Where keyed operators write their state changes at each barrier, if anywhere.
    pub changelog: Option<Arc<dyn crate::state::ChangelogWriter>>,
}

/// Everything one subtask loop needs besides its inputs and outputs.
pub(crate) struct TaskContext {
    pub info: SubtaskInfo,
    pub services: Arc<TaskServices>,
    pub metrics: SubtaskMetrics,
}

impl TaskContext {
    pub fn new(info: SubtaskInfo, services: Arc<TaskServices>) -> Self {
        let metrics = SubtaskMetrics::new(&info);
        TaskContext {
            info,
            services,
            metrics,
        }
    }

    /// Wraps an error of user code with the operator's identity.
    pub fn op_err(&self, e: Error) -> Error {
        match e {
            Error::Operator { .. } | Error::ChannelClosed(_) => e,
            other => Error::Operator {
                operator: self.info.operator.clone(),
                subtask: self.info.index,
                message: other.to_string(),
            },
        }
    }

    /// An empty snapshot stamped with this subtask's identity.
    pub fn snapshot_for(&self, checkpoint: CheckpointId) -> SubtaskSnapshot {
        SubtaskSnapshot {
            node_uid: self.info.node_uid.clone(),
            subtask: self.info.index as u32,
            parallelism: self.info.parallelism as u32,
            checkpoint_id: checkpoint,
            ..Default::default()
        }
    }

    /// Persists the snapshot (in a blocking thread) and acknowledges the checkpoint.
    pub fn persist_and_ack(&self, checkpoint: CheckpointId, snapshot: Result<SubtaskSnapshot>) {
        let node_uid = self.info.node_uid.clone();
        let subtask = self.info.index as u32;
        let tx = self.services.ack_tx.clone();
        let ack = move |result| {
            // the coordinator may be gone when the job is shutting down
            let _ = tx.send(CoordinatorMsg::Ack {
                checkpoint,
                node_uid,
                subtask,
                result,
            });
        };
        let bytes = match snapshot.and_then(|s| encode(&s)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(checkpoint, operator = %self.info.operator, subtask, error = %e, "snapshot failed");
                return ack(Err(e.to_string()));
            }
        };
        self.metrics.snapshot_bytes.set(bytes.len() as f64);
        let Some(storage) = self.services.storage.clone() else {
            return ack(Ok(None));
        };
        let file = format!("{}-{}.state", self.info.node_uid, subtask);
        if format::HEADER_LEN + bytes.len() <= self.services.state_inline_threshold {
            // small: travels to the coordinator inside the metadata, no file, no fsync
            return ack(Ok(Some(StateFileMetadata::inlined(subtask, file, &bytes))));
        }
        tokio::task::spawn_blocking(move || {
            let result = storage
                .write_state(checkpoint, &file, &bytes)
                .map(|(len, crc32c)| {
                    Some(StateFileMetadata {
                        subtask,
                        file,
                        len,
                        crc32c,
                        inline: None,
                    })
                })
                .map_err(|e| e.to_string());
            ack(result);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A task that never waits on anything (a subtask whose input is always ready) still lets
    /// a timer on its thread fire, because it calls `Slice::tick`. Without the tick the timer
    /// task could not run before the busy loop ended: the loop's cap (5 s) ends it and the
    /// flag is unset.
    #[tokio::test(flavor = "current_thread")]
    async fn a_busy_subtask_lets_timers_fire() {
        let fired = Arc::new(AtomicBool::new(false));
        let timer = tokio::spawn({
            let fired = fired.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                fired.store(true, Ordering::SeqCst);
            }
        });
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut slice = Slice::new();
        while !fired.load(Ordering::SeqCst) && std::time::Instant::now() < cap {
            std::hint::spin_loop();
            slice.tick().await;
        }
        assert!(
            fired.load(Ordering::SeqCst),
            "the timer did not fire while the busy task ran"
        );
        timer.await.unwrap();
    }
}
