//! Kafka connectors: a read_committed [`KafkaSource`] and a [`KafkaSink`] with four delivery
//! modes (see [`DeliveryMode`] and docs/KAFKA.md): checkpoint-aligned two-phase commit,
//! transactional offsets (Kafka Streams' EOS v2 model), at-least-once and none.

pub mod admin;
pub mod client_properties;
pub mod committer;
pub mod config;
pub mod job;
pub mod json;
pub mod metrics;
pub mod registry;
pub mod retry;
pub mod scale;
pub mod security;
pub mod sink;
pub mod source;

pub use client_properties::ClientProperties;
pub use config::{
    check_mode_security, validate_transaction_timeout, DeliveryMode, KafkaSinkConfig,
};
pub use job::{exit_code, JobPlacement, JobSummary, KafkaJob, KafkaJobArgs, KafkaOutputs};
pub use json::{Decoder, KafkaMessage};
pub use registry::PrefixClaim;
pub use sink::{
    committed_checkpoint, seal_transactional_id, CheckpointSeal, KafkaPending, KafkaSink,
    KafkaSinkWriter, OffsetsLink, SinkRecord, WriterKind,
};
pub use source::{KafkaPosition, KafkaSource, KafkaSourceReader};

/// Errors of the Kafka connectors.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// Invalid configuration; the message says what to change.
    #[error("invalid Kafka connector configuration: {0}")]
    Config(String),
    /// librdkafka reported an error.
    #[error("kafka client error while {context}: {source}")]
    Client {
        /// What the connector was doing.
        context: String,
        /// The librdkafka error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A protocol-level error from the raw committer.
    #[error("kafka protocol error: {0}")]
    Protocol(String),
    /// Records the job is responsible for are gone: a pre-committed transaction of a complete
    /// checkpoint can no longer be committed, or input was deleted before it was read.
    #[error("DATA LOSS: {0}")]
    DataLoss(String),
    /// A transaction that carries its checkpoint's input offsets failed and was aborted with
    /// them: nothing of it became visible, a restart replays its input (no loss, no retry).
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// A coordinator (group or transaction) kept answering a retriable error, or the cluster
    /// stayed unreachable, for longer than the retry budget ([`retry::COORDINATOR_BUDGET`]).
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// No bootstrap server answered the start-up connection check within the connect
    /// timeout; the message names every address and why.
    #[error("cluster unreachable: {0}")]
    Unreachable(String),
    /// The producer was fenced by another instance using the same transactional id.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The job failed in the runtime (a Kafka job run by [`KafkaJob`]).
    #[error(transparent)]
    Runtime(#[from] onceflow_runtime::Error),
}

/// Result type of the Kafka connectors.
pub type Result<T> = std::result::Result<T, KafkaError>;

impl KafkaError {
    pub(crate) fn client(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        KafkaError::Client {
            context: context.into(),
            source,
        }
    }
}

impl From<KafkaError> for onceflow_runtime::Error {
    fn from(e: KafkaError) -> Self {
        match e {
            // no retry can help this run: the job stops (and restarts from its checkpoint)
            KafkaError::Fenced(_) | KafkaError::DataLoss(_) | KafkaError::Aborted(_) => {
                onceflow_runtime::Error::Fatal(e.to_string())
            }
            KafkaError::Runtime(e) => e,
            _ => onceflow_runtime::Error::Connector(e.to_string()),
        }
    }
}
