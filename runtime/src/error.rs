//! The runtime's error type: who is at fault (user, environment, bug) and whether a retry helps.

use std::path::PathBuf;

/// Errors of the dataflow runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The job graph or configuration is invalid (user error; retrying does not help).
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// A user function, operator or connector reported an error (may be transient).
    #[error("operator `{operator}` subtask {subtask} failed: {message}")]
    Operator {
        /// Operator name.
        operator: String,
        /// Subtask index.
        subtask: usize,
        /// What went wrong.
        message: String,
    },
    /// A connector (source or sink) failed; an external system may be at fault, a retry may help.
    #[error("connector error: {0}")]
    Connector(String),
    /// A file of a checkpoint is corrupt or truncated (the file is named).
    #[error("corrupt checkpoint file {path}: {reason}")]
    CorruptCheckpoint {
        /// The offending file.
        path: PathBuf,
        /// What failed to verify.
        reason: String,
    },
    /// A checkpoint file was written by an older onceflow whose key-group hash differs: its
    /// keyed state cannot be placed correctly, so it is refused rather than restored wrongly
    /// (the user's to resolve; a retry cannot help).
    #[error(
        "checkpoint file {path} has format version {version}, written by an older onceflow that \
         placed keys in key groups with another hash; restoring it would give keys the wrong \
         state. Finish the job with the old build (stop it: final checkpoint and commit), then \
         start this build with a new checkpoint directory (and, for Kafka jobs, a new group)"
    )]
    IncompatibleCheckpoint {
        /// The offending file.
        path: PathBuf,
        /// Its format version.
        version: u16,
    },
    /// Restored keyed state does not decode as the type the operator now asks for: the
    /// state's type changed between the build that took the checkpoint and this one (the
    /// user's to resolve; a retry cannot help).
    #[error(
        "operator `{operator}`: restored state `{state}` (key group {key_group}) does not decode \
         as {expected}: {reason}. The state's type changed since the checkpoint was taken: \
         restore it with the old type (or migrate the state), or start from an empty \
         checkpoint directory"
    )]
    StateTypeChanged {
        /// The operator (and subtask) owning the state.
        operator: String,
        /// The state's name.
        state: String,
        /// The key group whose bytes failed.
        key_group: u16,
        /// The (key, value) type the operator asked for.
        expected: String,
        /// What the decoder reported.
        reason: String,
    },
    /// A requested checkpoint does not exist or is incomplete.
    #[error("checkpoint {0} not found or incomplete")]
    CheckpointNotFound(u64),
    /// The newest complete checkpoint does not verify, and restoring an older one (whose
    /// output after it the sinks would write again) was not allowed.
    #[error("the newest complete checkpoint {latest} does not verify: {reason}; {}", match .older {
        Some(o) => format!("restoring the older checkpoint {o} would write again the output the sinks committed after it. Repair checkpoint {latest}'s files, or accept repeated output: restore {o} explicitly (--restore {o}) or allow the fallback (--restore-older-repeating-output, JobConfig::restore_older_if_corrupt)"),
        None => "no older complete checkpoint is retained".to_string(),
    })]
    LatestCheckpointCorrupt {
        /// The newest complete checkpoint.
        latest: u64,
        /// The next older complete checkpoint, if one is retained.
        older: Option<u64>,
        /// Why it does not verify (names the file).
        reason: String,
    },
    /// Every retained checkpoint failed to load; the errors name the files.
    #[error("no valid checkpoint to restore from: {}", .0.join("; "))]
    NoValidCheckpoint(Vec<String>),
    /// An I/O operation on checkpoint or sink storage failed (environment; a retry may help).
    #[error("i/o error on {path}: {source}")]
    Io {
        /// Path being accessed.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// Serializing or deserializing state failed (usually a bug or an incompatible state type).
    #[error("state serialization failed: {0}")]
    Serialization(String),
    /// A checkpoint could not be taken (the job continues).
    #[error("checkpoint {checkpoint} failed: {reason}")]
    CheckpointFailed {
        /// The checkpoint id.
        checkpoint: u64,
        /// Why it failed.
        reason: String,
    },
    /// A channel between subtasks closed unexpectedly: a peer subtask failed or was cancelled.
    #[error("channel closed: {0}")]
    ChannelClosed(String),
    /// A connector can no longer take part in this run (e.g. fenced by a newer instance, or
    /// the output of a complete checkpoint was lost): the job stops instead of retrying. A
    /// restart (restoring the last complete checkpoint) may succeed.
    #[error("fatal connector error: {0}")]
    Fatal(String),
    /// A broken runtime invariant (a bug in onceflow).
    #[error("internal error (bug): {0}")]
    Internal(String),
}

/// Who is at fault for an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The job's code or configuration.
    User,
    /// The environment: disk, network, an external system.
    External,
    /// onceflow itself.
    Bug,
}

impl Error {
    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        match self {
            Error::InvalidJob(_)
            | Error::Operator { .. }
            | Error::Serialization(_)
            | Error::StateTypeChanged { .. }
            | Error::IncompatibleCheckpoint { .. } => Fault::User,
            Error::Connector(_)
            | Error::Fatal(_)
            | Error::CorruptCheckpoint { .. }
            | Error::CheckpointNotFound(_)
            | Error::NoValidCheckpoint(_)
            | Error::LatestCheckpointCorrupt { .. }
            | Error::Io { .. }
            | Error::CheckpointFailed { .. }
            | Error::ChannelClosed(_) => Fault::External,
            Error::Internal(_) => Fault::Bug,
        }
    }

    /// Whether restarting the job (restore = latest) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Connector(_)
                | Error::Fatal(_)
                | Error::Io { .. }
                | Error::CheckpointFailed { .. }
                | Error::ChannelClosed(_)
                | Error::Operator { .. }
        )
    }

    /// Builds an [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Builds an [`Error::Serialization`] from any displayable error.
    pub fn serialization(e: impl std::fmt::Display) -> Self {
        Error::Serialization(e.to_string())
    }

    /// Builds an [`Error::Connector`] from any displayable error.
    pub fn connector(e: impl std::fmt::Display) -> Self {
        Error::Connector(e.to_string())
    }
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;
