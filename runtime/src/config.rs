//! Job configuration: parallelism, key groups, checkpointing and restore policy.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::element::CheckpointId;

/// Which checkpoint a job restores from when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RestoreMode {
    /// Start from scratch; existing checkpoints are left alone (new ids continue after them).
    #[default]
    None,
    /// The newest complete checkpoint. If it does not verify, the restore fails naming it and
    /// the next older one, unless [`JobConfig::restore_older_if_corrupt`] allows restoring
    /// the newest older checkpoint that verifies (whose output after it repeats).
    Latest,
    /// Exactly this checkpoint (fails if it is missing or corrupt).
    Checkpoint(CheckpointId),
}

/// A notable checkpoint event, reported to [`JobConfig::checkpoint_listener`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointEvent {
    /// The coordinator asked the sources to inject the barrier.
    Triggered(CheckpointId),
    /// The metadata is durable; sinks are about to commit.
    Completed(CheckpointId),
    /// The checkpoint failed (the job continues).
    Failed(CheckpointId),
}

/// Callback for checkpoint events (tests and tooling).
pub type CheckpointListener = Arc<dyn Fn(CheckpointEvent) + Send + Sync>;

/// Makes a checkpoint complete somewhere outside the checkpoint directory, between "metadata
/// durable" and "published as complete".
///
/// The coordinator calls [`CompletionHook::seal`] once checkpoint n's metadata is durable and
/// before any sink is told to commit n. If it returns `Ok`, n is complete; if it fails, the
/// job fails (no sink commits n, n's files stay on disk) and a restart decides from the hook's
/// own record whether n counts. The Kafka connectors use it to record the newest complete
/// checkpoint in a Kafka transaction, so that a newer instance can fence an older one out of
/// completing checkpoints (see docs/KAFKA.md, "Taking over a running instance").
#[async_trait::async_trait]
pub trait CompletionHook: Send + Sync + 'static {
    /// Seals checkpoint `id`; an error fails the job.
    async fn seal(&self, id: CheckpointId) -> crate::Result<()>;
}

/// Default of [`JobConfig::state_inline_threshold`]: 20 KiB, Flink's default for the same.
pub const DEFAULT_STATE_INLINE_THRESHOLD: usize = 20 * 1024;

/// Configuration of one job.
#[derive(Clone)]
pub struct JobConfig {
    /// Job name (used in metadata, logs and metrics).
    pub name: String,
    /// Default parallelism of every operator.
    pub parallelism: usize,
    /// Number of key groups (upper bound of any keyed operator's parallelism).
    pub max_parallelism: usize,
    /// Periodic checkpoint interval; `None` takes only the final checkpoint at end of input.
    pub checkpoint_interval: Option<Duration>,
    /// A checkpoint that has not completed after this long fails.
    pub checkpoint_timeout: Duration,
    /// Checkpoints that may fail in a row before the job fails (Flink's
    /// `execution.checkpointing.tolerable-failed-checkpoints`); `None` tolerates any number,
    /// and a completed checkpoint resets the count. A sink that pre-commits transactions
    /// keeps every failed checkpoint's transactions open until a later one completes, so an
    /// exactly-once sink needs a bound: past it the job fails and its restart commits what
    /// the last complete checkpoint names while the broker still holds it.
    pub tolerable_failed_checkpoints: Option<u32>,
    /// Directory of durable checkpoints; `None` keeps checkpoints in memory only (no recovery).
    pub checkpoint_dir: Option<PathBuf>,
    /// Complete checkpoints kept on disk (older ones are deleted); at least 1.
    pub retained_checkpoints: usize,
    /// A subtask snapshot of at most this many bytes (framed) is kept inside the checkpoint's
    /// `_metadata` instead of a `.state` file of its own, as Flink's
    /// `state.storage.fs.memory-threshold` does: a checkpoint of small states then costs one
    /// file and its fsync instead of one per subtask. 0 writes every snapshot to a file.
    /// Default 20 KiB.
    pub state_inline_threshold: usize,
    /// Where to restore from at start.
    pub restore: RestoreMode,
    /// With [`RestoreMode::Latest`], restore the newest older checkpoint that verifies when
    /// the newest complete one does not. Off by default: the sinks of a complete checkpoint
    /// have committed its output, so a restore from an older one writes the output between
    /// the two again (an exactly-once sink's duplicates).
    pub restore_older_if_corrupt: bool,
    /// Capacity of every channel, in batches (bounded: gives backpressure).
    pub channel_capacity: usize,
    /// Maximum records per batch on a channel.
    pub batch_size: usize,
    /// Stop with a final checkpoint when the process receives SIGTERM or SIGINT (Ctrl-C); a
    /// second SIGINT exits at once.
    pub stop_on_sigterm: bool,
    /// Tokio worker threads for [`crate::StreamEnvironment::execute_blocking`] (0 = number of cores).
    pub worker_threads: usize,
    /// Optional observer of checkpoint events.
    pub checkpoint_listener: Option<CheckpointListener>,
    /// Optional seal run between "metadata durable" and "complete".
    pub completion_hook: Option<Arc<dyn CompletionHook>>,
    /// Optional changelog of keyed state: keyed operators hand it their changes at every
    /// barrier.
    pub state_changelog: Option<Arc<dyn crate::state::ChangelogWriter>>,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            name: "onceflow-job".to_string(),
            parallelism: 1,
            max_parallelism: 128,
            checkpoint_interval: None,
            checkpoint_timeout: Duration::from_secs(60),
            tolerable_failed_checkpoints: None,
            checkpoint_dir: None,
            retained_checkpoints: 3,
            state_inline_threshold: DEFAULT_STATE_INLINE_THRESHOLD,
            restore: RestoreMode::None,
            restore_older_if_corrupt: false,
            channel_capacity: 16,
            batch_size: 256,
            stop_on_sigterm: false,
            worker_threads: 0,
            checkpoint_listener: None,
            completion_hook: None,
            state_changelog: None,
        }
    }
}

impl std::fmt::Debug for JobConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobConfig")
            .field("name", &self.name)
            .field("parallelism", &self.parallelism)
            .field("max_parallelism", &self.max_parallelism)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("checkpoint_timeout", &self.checkpoint_timeout)
            .field(
                "tolerable_failed_checkpoints",
                &self.tolerable_failed_checkpoints,
            )
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("retained_checkpoints", &self.retained_checkpoints)
            .field("state_inline_threshold", &self.state_inline_threshold)
            .field("restore", &self.restore)
            .field("restore_older_if_corrupt", &self.restore_older_if_corrupt)
            .finish_non_exhaustive()
    }
}

impl JobConfig {
    /// A configuration with the given name and defaults otherwise.
    pub fn new(name: impl Into<String>) -> Self {
        JobConfig {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Sets the default parallelism.
    pub fn parallelism(mut self, p: usize) -> Self {
        self.parallelism = p;
        self
    }

    /// Sets the number of key groups.
    pub fn max_parallelism(mut self, p: usize) -> Self {
        self.max_parallelism = p;
        self
    }

    /// Enables periodic checkpoints.
    pub fn checkpoint_interval(mut self, every: Duration) -> Self {
        self.checkpoint_interval = Some(every);
        self
    }

    /// Fails a checkpoint that has not completed after `timeout` (default 60 s).
    pub fn checkpoint_timeout(mut self, timeout: Duration) -> Self {
        self.checkpoint_timeout = timeout;
        self
    }

    /// Fails the job once more than `n` checkpoints failed in a row (see
    /// [`JobConfig::tolerable_failed_checkpoints`]); `None` tolerates any number.
    pub fn tolerable_failed_checkpoints(mut self, n: Option<u32>) -> Self {
        self.tolerable_failed_checkpoints = n;
        self
    }

    /// Stores checkpoints durably in `dir`.
    pub fn checkpoint_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoint_dir = Some(dir.into());
        self
    }

    /// Sets the restore policy.
    pub fn restore(mut self, mode: RestoreMode) -> Self {
        self.restore = mode;
        self
    }

    /// Allows [`RestoreMode::Latest`] to restore an older checkpoint when the newest complete
    /// one does not verify, accepting that the output written after the older one is written
    /// again (see [`JobConfig::restore_older_if_corrupt`]).
    pub fn restore_older_if_corrupt(mut self, yes: bool) -> Self {
        self.restore_older_if_corrupt = yes;
        self
    }

    /// Sets how many complete checkpoints are kept.
    pub fn retained_checkpoints(mut self, n: usize) -> Self {
        self.retained_checkpoints = n;
        self
    }

    /// Keeps subtask snapshots of at most `bytes` inside the checkpoint metadata (see
    /// [`JobConfig::state_inline_threshold`]); 0 writes every snapshot to a file of its own.
    pub fn state_inline_threshold(mut self, bytes: usize) -> Self {
        self.state_inline_threshold = bytes;
        self
    }

    /// Stop with a final checkpoint on SIGTERM or SIGINT (Ctrl-C); a second SIGINT exits at
    /// once.
    pub fn stop_on_sigterm(mut self, yes: bool) -> Self {
        self.stop_on_sigterm = yes;
        self
    }

    /// Observes checkpoint events.
    pub fn checkpoint_listener(
        mut self,
        l: impl Fn(CheckpointEvent) + Send + Sync + 'static,
    ) -> Self {
        self.checkpoint_listener = Some(Arc::new(l));
        self
    }

    /// Seals every checkpoint with `hook` before it is published as complete.
    pub fn completion_hook(mut self, hook: Arc<dyn CompletionHook>) -> Self {
        self.completion_hook = Some(hook);
        self
    }

    /// Hands the keyed state changes of every keyed operator subtask to `writer` at each
    /// barrier.
    pub fn state_changelog(mut self, writer: Arc<dyn crate::state::ChangelogWriter>) -> Self {
        self.state_changelog = Some(writer);
        self
    }

    pub(crate) fn validate(&self) -> crate::Result<()> {
        let bad = |m: &str| Err(crate::Error::InvalidJob(m.to_string()));
        if self.parallelism == 0 {
            return bad("parallelism must be at least 1");
        }
        if self.max_parallelism == 0 || self.max_parallelism > u16::MAX as usize {
            return bad("max_parallelism must be in 1..=65535");
        }
        if self.retained_checkpoints == 0 {
            return bad("retained_checkpoints must be at least 1");
        }
        if self.channel_capacity == 0 || self.batch_size == 0 {
            return bad("channel_capacity and batch_size must be at least 1");
        }
        if self.restore != RestoreMode::None && self.checkpoint_dir.is_none() {
            return bad("restore needs a checkpoint_dir");
        }
        if self.checkpoint_interval == Some(std::time::Duration::ZERO) {
            return bad("checkpoint_interval must be positive");
        }
        if self.checkpoint_timeout.is_zero() {
            return bad("checkpoint_timeout must be positive");
        }
        Ok(())
    }
}
