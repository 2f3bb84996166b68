//! The broker's library error type.

use crate::storage::StorageError;

/// Errors from starting or running the broker (not Kafka protocol errors, which are error
/// codes inside responses).
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The listen (or metrics) address could not be bound: the user's configuration or the
    /// environment (port in use); retrying with another address can help.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address that failed.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The storage could not be opened or flushed (disk problem or corrupt data dir).
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// Some other I/O failure of the broker itself (producer id file, socket setup).
    #[error("{context}: {source}")]
    Io {
        /// What the broker was doing.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The configuration is invalid (the user's mistake; fix the flag).
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Result type of the broker library.
pub type Result<T> = std::result::Result<T, BrokerError>;
