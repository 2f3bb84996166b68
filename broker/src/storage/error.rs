//! Errors of the storage layer, each saying whose fault it is and whether a retry can help.

use std::path::PathBuf;

/// Errors of store-level operations and of the I/O beneath partitions.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The client asked to create a topic that exists (its input error; a retry will not help).
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    /// The client named a topic that does not exist (its input error).
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    /// The topic name or partition count breaks Kafka's rules (the client's input error).
    #[error("invalid topic {0:?}")]
    InvalidTopic(String),
    /// The operating system refused an I/O operation (external; a retry may help once the
    /// disk recovers, but the partition may need a restart to recover its tail).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Persistent state is damaged beyond what recovery repairs by itself (external; operator
    /// action needed).
    #[error("corrupt storage at {path}: {reason}")]
    Corrupt {
        /// The damaged file or directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl StorageError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result of store-level operations.
pub type Result<T> = std::result::Result<T, StorageError>;

impl From<super::batch::BatchFault> for AppendError {
    fn from(fault: super::batch::BatchFault) -> Self {
        match fault {
            super::batch::BatchFault::Corrupt(m) => AppendError::CorruptMessage(m),
            super::batch::BatchFault::Invalid(m) => AppendError::InvalidRecord(m),
        }
    }
}

/// Why `Partition::append` refused a produce request. Each maps onto a Kafka error code.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// CRC mismatch, truncated or garbled batch (client's or network's fault; a resend may
    /// help) -> CORRUPT_MESSAGE (2).
    #[error("corrupt record batch: {0}")]
    CorruptMessage(String),
    /// A well-formed batch the broker refuses: magic other than 2, inconsistent counts, a
    /// control batch from a client (client's fault) -> INVALID_RECORD (87) or
    /// UNSUPPORTED_FOR_MESSAGE_FORMAT (43).
    #[error("invalid record batch: {0}")]
    InvalidRecord(String),
    /// A well-formed batch refused for some of its records (keyless records on a compacted
    /// topic) -> INVALID_RECORD with the records' indexes in the batch (Produce v8+
    /// `record_errors`, KIP-467: the client fails those records with INVALID_RECORD and the
    /// others of the batch as refused with them).
    #[error("invalid records in batch: {reason}")]
    RecordErrors {
        /// What is wrong with the listed records.
        reason: String,
        /// Indexes of the offending records within their batch.
        indexes: Vec<i32>,
    },
    /// The batch's first sequence is not the next one expected for its producer (a gap or an
    /// unknown producer state) -> OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    #[error("out of order sequence: expected {expected}, got {got}")]
    OutOfOrderSequence {
        /// The sequence the broker expected next (or 0 for a new producer/epoch).
        expected: i32,
        /// The first sequence of the refused batch.
        got: i32,
    },
    /// The producer epoch is older than the current one: a fenced zombie producer ->
    /// INVALID_PRODUCER_EPOCH (47).
    #[error("invalid producer epoch: current {current}, got {got}")]
    InvalidProducerEpoch {
        /// The partition's current epoch for this producer id.
        current: i16,
        /// The epoch in the refused batch.
        got: i16,
    },
    /// The store failed underneath (external) -> KAFKA_STORAGE_ERROR (56).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Why `Partition::read` could not serve a fetch.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The offset is below the log start or above the high watermark -> OFFSET_OUT_OF_RANGE (1).
    #[error("offset out of range: log start {log_start}, high watermark {high_watermark}")]
    OffsetOutOfRange {
        /// The first offset still in the log.
        log_start: i64,
        /// The high watermark.
        high_watermark: i64,
    },
    /// The store failed underneath (external) -> KAFKA_STORAGE_ERROR (56).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The batch at the fetch offset fails validation on disk (CRC-32C or framing): it is not
    /// served (external: the disk altered it; retrying will not help) -> CORRUPT_MESSAGE (2),
    /// which librdkafka reports to the application instead of retrying silently.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The segment file.
        path: std::path::PathBuf,
        /// Where and what.
        reason: String,
    },
}
