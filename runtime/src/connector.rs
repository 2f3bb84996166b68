//! Connector traits: a [`Source`] polls records and snapshots its position; a [`Sink`]
//! writes records and takes part in two-phase commit with the checkpoint coordinator.
//!
//! The runtime calls a sink in this order: `recover(pending of the restored checkpoint)`
//! before any record flows; then `write_batch` for records; `pre_commit(n)` when barrier n
//! reaches the sink (its result is stored in checkpoint n; a sink may split it into
//! `start_pre_commit(n)` and `finish_pre_commit(n)` to write the next records while it
//! flushes); `commit(n, pending)` once
//! checkpoint n is complete (durable), possibly again after a crash (must be idempotent);
//! `abort(pending)` for pre-commits that no complete checkpoint will ever cover.

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};

use std::future::Future;
use std::pin::Pin;

use crate::element::CheckpointId;
use crate::{Error, Result};

/// Identity of a subtask, given to factories and operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubtaskInfo {
    /// Job name.
    pub job_name: String,
    /// Operator (node) name.
    pub operator: String,
    /// Stable node uid (matches state across runs).
    pub node_uid: String,
    /// Index of this subtask, `0..parallelism`.
    pub index: usize,
    /// Parallelism of the node.
    pub parallelism: usize,
    /// Number of key groups of the job.
    pub max_parallelism: usize,
    /// Attempt number: the id of the checkpoint restored from (0 for a fresh start).
    pub restored_checkpoint: CheckpointId,
}

/// What a source's poll produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records were appended (possibly zero); poll again soon.
    Ready,
    /// Nothing available now; the runtime waits up to this long (or until a checkpoint).
    Idle(std::time::Duration),
    /// The source has no more records (after those appended by this call).
    Exhausted,
}

/// A parallel source subtask.
#[async_trait]
pub trait Source<T>: Send + 'static {
    /// The position stored in checkpoints (e.g. offsets per split).
    type Position: Serialize + DeserializeOwned + Send + Clone + 'static;

    /// Restores from the positions of every subtask of the previous run (the source picks
    /// what belongs to it, so the parallelism may change). Called before the first poll.
    fn restore(&mut self, positions: Vec<Self::Position>) -> Result<()>;

    /// Appends up to `max` records to `out`.
    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourcePoll>;

    /// The position after the last record returned by `poll` (taken at the barrier).
    fn snapshot_position(&mut self, checkpoint: CheckpointId) -> Result<Self::Position>;

    /// The source's current event-time watermark (e.g. the minimum over its partitions);
    /// the runtime forwards it downstream whenever it advances. `None` (the default): the
    /// source emits no watermarks.
    fn current_watermark(&mut self) -> Option<crate::Watermark> {
        None
    }

    /// (event time) The splits this subtask reads (e.g. its Kafka partitions), known before
    /// their first record. A per-split watermark strategy holds the watermark back for each
    /// of them from the start (until it is idle), so records of a split that is read later
    /// than the others (a backlog after a restore) are not late. Empty by default: a split
    /// becomes known with its first record.
    fn splits(&self) -> Vec<u32> {
        Vec::new()
    }

    /// (event time) Whether every split of this subtask is idle, so downstream operators
    /// should leave it out of their watermark minimum. `false` by default.
    fn is_idle(&mut self) -> bool {
        false
    }

    /// (event time) The highest event time read from each split up to the position
    /// `snapshot_position` returns, asked right after it at every barrier; the runtime stores
    /// it in the checkpoint and hands it to [`Source::resume_event_times`] on restore, so the
    /// watermark resumes where it was instead of waiting for a record of every split (a split
    /// restored at its end has none). A source with a [`crate::WatermarkStrategy`] that tracks
    /// splits answers this; empty by default.
    fn event_times(&mut self) -> Vec<(u32, i64)> {
        Vec::new()
    }

    /// (event time) The event times of the restored checkpoint ([`Source::event_times`] of
    /// every subtask of the previous run, highest per split), given after
    /// [`Source::restore`]. The source keeps those of its own splits. Ignored by default.
    fn resume_event_times(&mut self, _times: Vec<(u32, i64)>) {}

    /// (event time) For a source that keeps its position outside the checkpoint (e.g. Kafka
    /// offsets committed in a transaction, which win over the checkpoint's): the highest event
    /// time per split up to the position the next `snapshot_position` returns, given just
    /// before it by the watermark strategy wrapping this source, to be stored with that
    /// position. Ignored by default.
    fn keep_event_times(&mut self, _times: &[(u32, i64)]) {}

    /// (event time) For a source that starts from a position kept outside the checkpoint:
    /// `Some` with the event times stored with that position (see
    /// [`Source::keep_event_times`]; empty when none were), asked when the source is created
    /// and after `restore`. The checkpoint's event times are then not used: they belong to
    /// the checkpoint's positions, which may lie ahead of the position the source starts
    /// from (a checkpoint whose offsets never committed), and resuming from them would make
    /// the records in between late. `None` (the default): the source starts from the
    /// checkpoint's positions, and from its event times.
    fn kept_event_times(&self) -> Option<Vec<(u32, i64)>> {
        None
    }

    /// Checkpoint `checkpoint` is complete (e.g. to commit offsets externally). No-op by default.
    fn checkpoint_complete(&mut self, _checkpoint: CheckpointId) -> Result<()> {
        Ok(())
    }
}

/// Creates the source subtasks of a node.
pub trait SourceFactory<T>: Send + Sync + 'static {
    /// The source type.
    type Source: Source<T>;
    /// Creates subtask `info.index`.
    fn create(&self, info: &SubtaskInfo) -> Result<Self::Source>;
}

impl<T, S: Source<T>, F: Fn(&SubtaskInfo) -> Result<S> + Send + Sync + 'static> SourceFactory<T>
    for F
{
    type Source = S;
    fn create(&self, info: &SubtaskInfo) -> Result<S> {
        self(info)
    }
}

/// A parallel sink subtask taking part in two-phase commit.
#[async_trait]
pub trait Sink<T>: Send + 'static {
    /// What must be remembered in a checkpoint to finish (commit) a pre-commit later.
    type Pending: Serialize + DeserializeOwned + Send + Clone + std::fmt::Debug + 'static;

    /// Finishes the previous run: commit every `pending` (they belong to the restored, complete
    /// checkpoint) and clean up anything else a previous run left open. Subtask 0 receives the
    /// pending commits of every old subtask, the other subtasks an empty list; subtask 0's
    /// recovery finishes before the others start theirs (which then run concurrently), and
    /// all recoveries finish before any record flows.
    async fn recover(&mut self, pending: Vec<Self::Pending>) -> Result<()>;

    /// Writes records (they become visible only after commit for exactly-once sinks).
    async fn write_batch(&mut self, records: Vec<T>) -> Result<()>;

    /// Barrier `checkpoint` arrived: make everything written so far durable but invisible, and
    /// return what commit needs (`None` if nothing was written). An error fails this
    /// checkpoint, not the job: the sink must keep the data for the next pre-commit.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Option<Self::Pending>>;

    /// Barrier `checkpoint` arrived: start the pre-commit, and either finish it here
    /// ([`PreCommit::Done`], what [`Sink::pre_commit`] returns: the default) or leave its
    /// flush running ([`PreCommit::Flushing`]) so that the records of the next checkpoint are
    /// written while it runs. A sink whose pre-commit waits on I/O (a Kafka producer's
    /// delivery reports) overrides this and [`Sink::finish_pre_commit`].
    ///
    /// While a pre-commit is flushing, the runtime goes on calling `write_batch` (those
    /// records belong to the next checkpoint) and `commit` for earlier checkpoints; once the
    /// future resolves it calls `finish_pre_commit(checkpoint)`, and only then stores and
    /// acknowledges checkpoint `checkpoint`. The next barrier, and the end of the input, wait
    /// for the flush first, so at most one pre-commit is flushing at a time and checkpoints
    /// are acknowledged in order. An error fails this checkpoint, as for `pre_commit`.
    async fn start_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<PreCommit<Self::Pending>> {
        self.pre_commit(checkpoint).await.map(PreCommit::Done)
    }

    /// Ends the pre-commit that [`Sink::start_pre_commit`] left flushing, after its future
    /// resolved: what commit needs (`None` if nothing was written). An error fails checkpoint
    /// `checkpoint`; since the next checkpoint's records went elsewhere meanwhile, a sink that
    /// cannot keep the flushed records for a later pre-commit returns [`Error::Fatal`].
    async fn finish_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<Option<Self::Pending>> {
        Err(Error::Internal(format!(
            "the sink left pre-commit {checkpoint} flushing but does not implement finish_pre_commit"
        )))
    }

    /// Checkpoint `checkpoint` is complete: publish `pending`. Must be idempotent.
    async fn commit(&mut self, checkpoint: CheckpointId, pending: Self::Pending) -> Result<()>;

    /// Discards a pre-commit that no complete checkpoint covers.
    async fn abort(&mut self, pending: Self::Pending) -> Result<()>;
}

/// How [`Sink::start_pre_commit`] left a pre-commit.
pub enum PreCommit<P> {
    /// Finished: what commit needs, `None` if nothing was written since the last one.
    Done(Option<P>),
    /// Its flush runs in the background; the future resolves when it ended, successfully or
    /// not, and the runtime then calls [`Sink::finish_pre_commit`]. The future must not need
    /// the sink to make progress (it is polled while the sink writes the next records).
    Flushing(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl<P: std::fmt::Debug> std::fmt::Debug for PreCommit<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreCommit::Done(p) => f.debug_tuple("Done").field(p).finish(),
            PreCommit::Flushing(_) => f.write_str("Flushing"),
        }
    }
}

/// Creates the sink subtasks of a node.
pub trait SinkFactory<T>: Send + Sync + 'static {
    /// The sink type.
    type Sink: Sink<T>;
    /// Creates subtask `info.index`.
    fn create(&self, info: &SubtaskInfo) -> Result<Self::Sink>;
}

impl<T, S: Sink<T>, F: Fn(&SubtaskInfo) -> Result<S> + Send + Sync + 'static> SinkFactory<T> for F {
    type Sink = S;
    fn create(&self, info: &SubtaskInfo) -> Result<S> {
        self(info)
    }
}
