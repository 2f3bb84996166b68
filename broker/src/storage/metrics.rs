//! Metrics of the log: log end offset per partition, bytes appended, fsync latency.

use metrics::{Counter, Gauge, Histogram};

/// Gauge: log end offset, labelled by topic and partition.
pub const LOG_END_OFFSET: &str = "onceflow_broker_log_end_offset";
/// Counter: bytes of record batches appended, labelled by topic and partition.
pub const BYTES_APPENDED: &str = "onceflow_broker_log_bytes_appended_total";
/// Histogram: seconds spent in fsync of log segments.
pub const FSYNC_SECONDS: &str = "onceflow_broker_log_fsync_seconds";
/// Counter: torn or corrupt tails cut during recovery.
pub const RECOVERY_TRUNCATIONS: &str = "onceflow_broker_log_recovery_truncations_total";

/// Registers descriptions with the installed recorder (call once at startup).
pub fn describe() {
    metrics::describe_gauge!(LOG_END_OFFSET, "Log end offset of a partition");
    metrics::describe_counter!(
        BYTES_APPENDED,
        "Bytes of record batches appended to a partition"
    );
    metrics::describe_histogram!(
        FSYNC_SECONDS,
        metrics::Unit::Seconds,
        "Duration of log fsyncs"
    );
    metrics::describe_counter!(
        RECOVERY_TRUNCATIONS,
        "Torn or corrupt log tails truncated on recovery"
    );
}

/// Handles of one partition's metrics.
#[derive(Debug, Clone)]
pub struct PartitionMetrics {
    /// Log end offset.
    pub log_end_offset: Gauge,
    /// Bytes appended.
    pub bytes_appended: Counter,
    /// fsync durations.
    pub fsync_seconds: Histogram,
}

impl PartitionMetrics {
    /// Handles labelled with `topic` and `partition`.
    pub fn new(topic: &str, partition: i32) -> Self {
        let labels = [
            ("topic", topic.to_string()),
            ("partition", partition.to_string()),
        ];
        PartitionMetrics {
            log_end_offset: metrics::gauge!(LOG_END_OFFSET, &labels),
            bytes_appended: metrics::counter!(BYTES_APPENDED, &labels),
            fsync_seconds: metrics::histogram!(FSYNC_SECONDS),
        }
    }
}
