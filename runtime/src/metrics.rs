//! Metric names and per-subtask handles (the `metrics` crate facade; install any recorder,
//! e.g. metrics-exporter-prometheus, to export them).

use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::connector::SubtaskInfo;

/// Records received by an operator subtask (`operator`, `subtask` labels).
pub const RECORDS_IN: &str = "onceflow_records_in_total";
/// Records emitted by an operator subtask.
pub const RECORDS_OUT: &str = "onceflow_records_out_total";
/// Time spent in user code, microseconds.
pub const BUSY_MICROS: &str = "onceflow_busy_microseconds_total";
/// Barrier alignment time, seconds (histogram).
pub const ALIGNMENT_SECONDS: &str = "onceflow_alignment_seconds";
/// Keyed state entries held by a subtask (gauge).
pub const STATE_ENTRIES: &str = "onceflow_state_entries";
/// Bytes of a subtask's last snapshot (gauge).
pub const SNAPSHOT_BYTES: &str = "onceflow_snapshot_bytes";
/// Checkpoint duration from trigger to durable metadata, seconds (histogram).
pub const CHECKPOINT_SECONDS: &str = "onceflow_checkpoint_duration_seconds";
/// Time the [`crate::CompletionHook`] took to seal a checkpoint, seconds (histogram).
pub const CHECKPOINT_SEAL_SECONDS: &str = "onceflow_checkpoint_seal_seconds";
/// Completed checkpoints.
pub const CHECKPOINTS_COMPLETED: &str = "onceflow_checkpoints_completed_total";
/// Failed checkpoints.
pub const CHECKPOINTS_FAILED: &str = "onceflow_checkpoints_failed_total";
/// Total state bytes of the last completed checkpoint (gauge).
pub const CHECKPOINT_BYTES: &str = "onceflow_checkpoint_state_bytes";

/// Metric handles of one subtask.
#[derive(Clone)]
pub struct SubtaskMetrics {
    /// Records in.
    pub records_in: Counter,
    /// Records out.
    pub records_out: Counter,
    /// Busy time.
    pub busy_micros: Counter,
    /// Alignment time.
    pub alignment: Histogram,
    /// State entries.
    pub state_entries: Gauge,
    /// Snapshot size.
    pub snapshot_bytes: Gauge,
}

impl SubtaskMetrics {
    /// Handles labelled with the subtask's operator and index.
    pub fn new(info: &SubtaskInfo) -> Self {
        let labels = [
            ("operator", info.operator.clone()),
            ("subtask", info.index.to_string()),
        ];
        SubtaskMetrics {
            records_in: counter!(RECORDS_IN, &labels),
            records_out: counter!(RECORDS_OUT, &labels),
            busy_micros: counter!(BUSY_MICROS, &labels),
            alignment: histogram!(ALIGNMENT_SECONDS, &labels),
            state_entries: gauge!(STATE_ENTRIES, &labels),
            snapshot_bytes: gauge!(SNAPSHOT_BYTES, &labels),
        }
    }

    /// Adds busy time.
    pub fn busy(&self, d: Duration) {
        self.busy_micros.increment(d.as_micros() as u64);
    }
}
