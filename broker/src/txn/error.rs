//! Errors of the transaction layer: durable-state failures (external, operator action may be
//! needed) kept apart from protocol refusals, which are Kafka error codes sent to clients.

use std::path::PathBuf;

/// Failures of the transaction log, the partition transaction indexes and marker writing.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// The operating system refused an I/O operation on transaction state (external; a retry
    /// may help once the disk recovers).
    #[error("transaction state I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Persistent transaction state is damaged beyond what recovery repairs by itself
    /// (external; operator action needed).
    #[error("corrupt transaction state at {path}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The transaction log holds damage followed by valid records (external; the operator
    /// decides, with `--repair-corrupt-logs`, whether to drop the damaged bytes).
    #[error("transaction log is corrupt: {0}")]
    CorruptLog(#[from] crate::framed_log::CorruptLog),
    /// Appending a transaction marker to a partition failed (storage is external; the
    /// coordinator retries the marker later).
    #[error("writing a transaction marker to {topic}-{partition} failed: {reason}")]
    Marker {
        /// Topic of the partition.
        topic: String,
        /// Partition index.
        partition: i32,
        /// Why it failed.
        reason: String,
    },
    /// The broker's producer-id allocator failed (external: its file could not be written).
    #[error("allocating a producer id failed: {0}")]
    ProducerIds(String),
    /// Reading a partition's log while rebuilding its transaction index failed (external).
    #[error("reading {topic}-{partition} to rebuild its transaction index failed: {reason}")]
    Rebuild {
        /// Topic of the partition.
        topic: String,
        /// Partition index.
        partition: i32,
        /// Why it failed.
        reason: String,
    },
}

impl TxnError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TxnError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result of transaction-layer operations.
pub type Result<T> = std::result::Result<T, TxnError>;
