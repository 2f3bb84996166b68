//! Metrics of the log: log start and end offsets per partition, bytes appended, segments and
//! bytes deleted by retention, fsync latency.

use metrics::{Counter, Gauge, Histogram};

/// Gauge: log end offset, labelled by topic and partition.
pub const LOG_END_OFFSET: &str = "onceflow_broker_log_end_offset";
/// Counter: bytes of record batches appended, labelled by topic and partition.
pub const BYTES_APPENDED: &str = "onceflow_broker_log_bytes_appended_total";
/// Histogram: seconds spent in fsync of log segments.
pub const FSYNC_SECONDS: &str = "onceflow_broker_log_fsync_seconds";
/// Gauge: log start offset, labelled by topic and partition.
pub const LOG_START_OFFSET: &str = "onceflow_broker_log_start_offset";
/// Counter: segments deleted by retention or DeleteRecords, labelled by topic and partition.
pub const SEGMENTS_DELETED: &str = "onceflow_broker_log_segments_deleted_total";
/// Counter: bytes of segments deleted by retention or DeleteRecords, labelled by topic and
/// partition.
pub const BYTES_DELETED: &str = "onceflow_broker_log_bytes_deleted_total";
/// Counter: retention passes run because a segment roll took a partition past
/// `retention.bytes`, between the passes of `log.retention.check.interval.ms`.
pub const RETENTION_ROLL_PASSES: &str = "onceflow_broker_log_retention_roll_passes_total";
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
    metrics::describe_gauge!(LOG_START_OFFSET, "Log start offset of a partition");
    metrics::describe_counter!(
        SEGMENTS_DELETED,
        "Log segments deleted by retention or DeleteRecords"
    );
    metrics::describe_counter!(
        BYTES_DELETED,
        "Bytes of log segments deleted by retention or DeleteRecords"
    );
    metrics::describe_counter!(
        RETENTION_ROLL_PASSES,
        "Retention passes started by a segment roll past retention.bytes"
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
    /// Log start offset.
    pub log_start_offset: Gauge,
    /// Segments deleted by retention or DeleteRecords.
    pub segments_deleted: Counter,
    /// Bytes of the segments deleted.
    pub bytes_deleted: Counter,
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
            log_start_offset: metrics::gauge!(LOG_START_OFFSET, &labels),
            segments_deleted: metrics::counter!(SEGMENTS_DELETED, &labels),
            bytes_deleted: metrics::counter!(BYTES_DELETED, &labels),
            fsync_seconds: metrics::histogram!(FSYNC_SECONDS),
        }
    }
}
