//! Metric names and per-subtask handles (the `metrics` crate facade; install any recorder,
//! e.g. metrics-exporter-prometheus, to export them), and the catalogue every exported
//! metric is described in: name, type, unit, labels, meaning and, for histograms, buckets.

use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::connector::SubtaskInfo;

/// Records received by an operator subtask (`operator`, `subtask` labels).
pub const RECORDS_IN: &str = "onceflow_records_in_total";
/// Records emitted by an operator subtask.
pub const RECORDS_OUT: &str = "onceflow_records_out_total";
/// Seconds spent in user code since the subtask started (grows; `rate()` of it is the busy
/// fraction).
pub const BUSY_SECONDS: &str = "onceflow_busy_seconds";
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
/// Unix time in seconds at which the last checkpoint completed (gauge; `time() - it` is the
/// checkpoint age).
pub const LAST_CHECKPOINT_TIME: &str = "onceflow_last_checkpoint_completed_timestamp_seconds";
/// Failed checkpoints since the last completed one (gauge).
pub const CHECKPOINTS_FAILED_IN_A_ROW: &str = "onceflow_checkpoints_failed_in_a_row";
/// Complete checkpoints passed over at restore because they did not verify.
pub const RESTORE_SKIPPED: &str = "onceflow_restore_skipped_checkpoints_total";

/// What kind of Prometheus metric a catalogue entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (`_bucket`, `_sum`, `_count` series).
    Histogram,
}

impl MetricKind {
    /// The Prometheus `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One exported metric, as docs/METRICS.md lists it and `# HELP` says it.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// The metric's name (`onceflow_` and the crate's part: `kafka_`, `scale_`, `broker_`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The base unit: `seconds`, `bytes`, or what is counted (`records`, `checkpoints`).
    pub unit: &'static str,
    /// Label names, comma-separated (empty: none).
    pub labels: &'static str,
    /// The meaning, as `# HELP` gives it.
    pub help: &'static str,
    /// Histogram bucket upper bounds (histograms only).
    pub buckets: &'static [f64],
}

/// Buckets for durations from a millisecond to two minutes.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Buckets for short waits, from 10 microseconds to 10 seconds.
pub const WAIT_BUCKETS: &[f64] = &[
    0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
];

/// A catalogue entry without buckets (a counter or a gauge).
pub const fn def(
    name: &'static str,
    kind: MetricKind,
    unit: &'static str,
    labels: &'static str,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind,
        unit,
        labels,
        help,
        buckets: &[],
    }
}

/// A histogram's catalogue entry with its bucket bounds.
pub const fn hist(
    name: &'static str,
    unit: &'static str,
    labels: &'static str,
    help: &'static str,
    buckets: &'static [f64],
) -> MetricDef {
    MetricDef {
        name,
        kind: MetricKind::Histogram,
        unit,
        labels,
        help,
        buckets,
    }
}

/// The runtime's metrics.
pub const CATALOGUE: &[MetricDef] = &[
    def(RECORDS_IN, MetricKind::Counter, "records", "operator, subtask", "Records received by an operator subtask."),
    def(RECORDS_OUT, MetricKind::Counter, "records", "operator, subtask", "Records emitted by an operator subtask."),
    def(BUSY_SECONDS, MetricKind::Gauge, "seconds", "operator, subtask", "Seconds the subtask spent in user code since it started; only grows, rate() of it is the busy fraction."),
    MetricDef {
        buckets: WAIT_BUCKETS,
        ..def(ALIGNMENT_SECONDS, MetricKind::Histogram, "seconds", "operator, subtask", "Seconds a subtask held back input channels while aligning a checkpoint barrier.")
    },
    def(STATE_ENTRIES, MetricKind::Gauge, "entries", "operator, subtask", "Keyed state entries held by a subtask."),
    def(SNAPSHOT_BYTES, MetricKind::Gauge, "bytes", "operator, subtask", "Bytes of the subtask's last snapshot."),
    MetricDef {
        buckets: DURATION_BUCKETS,
        ..def(CHECKPOINT_SECONDS, MetricKind::Histogram, "seconds", "", "Seconds from a checkpoint's trigger to its durable metadata.")
    },
    MetricDef {
        buckets: DURATION_BUCKETS,
        ..def(CHECKPOINT_SEAL_SECONDS, MetricKind::Histogram, "seconds", "", "Seconds the completion hook took to seal a checkpoint (two-phase commit: the seal of its transactions).")
    },
    def(CHECKPOINTS_COMPLETED, MetricKind::Counter, "checkpoints", "", "Completed checkpoints."),
    def(CHECKPOINTS_FAILED, MetricKind::Counter, "checkpoints", "", "Failed checkpoints (timed out, declined, or failed to persist or seal)."),
    def(CHECKPOINTS_FAILED_IN_A_ROW, MetricKind::Gauge, "checkpoints", "", "Failed checkpoints since the last completed one; the job fails once it exceeds the tolerable failed checkpoints."),
    def(LAST_CHECKPOINT_TIME, MetricKind::Gauge, "seconds", "", "Unix time at which the last checkpoint completed; time() minus it is the checkpoint age."),
    def(CHECKPOINT_BYTES, MetricKind::Gauge, "bytes", "", "State bytes of the last completed checkpoint."),
    def(RESTORE_SKIPPED, MetricKind::Counter, "checkpoints", "", "Complete checkpoints passed over at restore because they did not verify."),
];

/// Registers `# HELP` and the unit of every metric in `catalogue` with the installed recorder.
pub fn describe(catalogue: &[MetricDef]) {
    for d in catalogue {
        let name = d.name;
        let help = d.help;
        match d.kind {
            MetricKind::Counter => metrics::describe_counter!(name, help),
            MetricKind::Gauge => metrics::describe_gauge!(name, help),
            MetricKind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
}

/// Metric handles of one subtask.
#[derive(Clone)]
pub struct SubtaskMetrics {
    /// Records in.
    pub records_in: Counter,
    /// Records out.
    pub records_out: Counter,
    /// Busy time, seconds.
    pub busy_seconds: Gauge,
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
            busy_seconds: gauge!(BUSY_SECONDS, &labels),
            alignment: histogram!(ALIGNMENT_SECONDS, &labels),
            state_entries: gauge!(STATE_ENTRIES, &labels),
            snapshot_bytes: gauge!(SNAPSHOT_BYTES, &labels),
        }
    }

    /// Adds busy time.
    pub fn busy(&self, d: Duration) {
        self.busy_seconds.increment(d.as_secs_f64());
    }
}
