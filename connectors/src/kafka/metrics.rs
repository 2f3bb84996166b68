//! Metric names of the Kafka connectors (Prometheus through the `metrics` facade).

/// Histogram: seconds from commit request to commit done, label `mode`.
pub const TXN_COMMIT_SECONDS: &str = "onceflow_kafka_txn_commit_seconds";
/// Histogram: seconds a two-phase-commit transaction's start waited for its slot's
/// producer (near zero once the ring's producers were made ahead of use).
pub const TXN_PRODUCER_WAIT_SECONDS: &str = "onceflow_kafka_txn_producer_wait_seconds";
/// Histogram: seconds the sink waited for a two-phase commit that ran while the next
/// transaction was written (near zero when the overlap hid the commit).
pub const TXN_COMMIT_WAIT_SECONDS: &str = "onceflow_kafka_txn_commit_wait_seconds";
/// Histogram: seconds a two-phase-commit pre-commit waited for the acks of its
/// transaction's records (the flush at the barrier).
pub const PRE_COMMIT_DRAIN_SECONDS: &str = "onceflow_kafka_pre_commit_drain_seconds";
/// Gauge: age in seconds of the oldest open (not yet committed) transaction, label `subtask`.
pub const TXN_OPEN_AGE_SECONDS: &str = "onceflow_kafka_txn_open_age_seconds";
/// Gauge: the configured transaction timeout in seconds (compare with the open age).
pub const TXN_TIMEOUT_SECONDS: &str = "onceflow_kafka_txn_timeout_seconds";
/// Histogram: records per committed transaction.
pub const RECORDS_PER_TXN: &str = "onceflow_kafka_records_per_txn";
/// Counter: fencing events (ids fenced at recovery, `kind=recovery`; this producer fenced,
/// `kind=fenced`).
pub const FENCING_EVENTS: &str = "onceflow_kafka_fencing_events_total";
/// Counter: transactions committed at recovery with the raw committer.
pub const RECOVERY_COMMITS: &str = "onceflow_kafka_recovery_commits_total";
/// Gauge: consumer lag (high watermark - position) per partition, labels `topic`, `partition`.
pub const CONSUMER_LAG: &str = "onceflow_kafka_consumer_lag";
/// Counter: records produced, label `mode`.
pub const RECORDS_PRODUCED: &str = "onceflow_kafka_records_produced_total";
/// Counter: records consumed, label `topic`.
pub const RECORDS_CONSUMED: &str = "onceflow_kafka_records_consumed_total";
/// Counter: input partitions found to have lost records before the source read them
/// (deleted by retention or DeleteRecords), label `topic`; the job stops with DATA LOSS.
pub const INPUT_DELETED_BEFORE_READ: &str = "onceflow_kafka_input_deleted_before_read_total";
/// Counter: checkpoints not sealed because their transactions may have timed out (the job
/// restarts from the last sealed one).
pub const SEALS_REFUSED: &str = "onceflow_kafka_seals_refused_total";
/// Counter: start-up permission checks, label `outcome` (`passed`, `failed`, `skipped`) and
/// `method` (`describe-acls`, `probes`, `no-authorizer`, `none`).
pub const PERMISSION_CHECKS: &str = "onceflow_kafka_permission_checks_total";
/// Gauge: permissions the last start-up check found missing.
pub const PERMISSIONS_MISSING: &str = "onceflow_kafka_permissions_missing";
/// Counter: coordinator calls retried after a retriable error (coordinator loading, moved or
/// unavailable, a concurrent transaction, a timeout or a dropped connection), label `call`.
pub const COORDINATOR_RETRIES: &str = "onceflow_kafka_coordinator_retries_total";
