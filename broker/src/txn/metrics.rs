//! Metric names of the transaction layer (exported through the broker's Prometheus endpoint).

pub use ::metrics::{counter, gauge, histogram};

/// Gauge: transactions open or completing on the coordinator.
pub const OPEN_TRANSACTIONS: &str = "onceflow_broker_open_transactions";
/// Histogram (seconds, label `result`): first AddPartitions/AddOffsets to CompleteX.
pub const TXN_DURATION: &str = "onceflow_broker_transaction_duration_seconds";
/// Counter (label `cause`: client, timeout, fencing, recovery): transactions aborted.
pub const ABORTS: &str = "onceflow_broker_transaction_aborts_total";
/// Counter (label `result`): transactions committed or aborted (markers written).
pub const COMPLETED: &str = "onceflow_broker_transactions_completed_total";
/// Gauge (labels `topic`, `partition`): high watermark minus last stable offset.
pub const LSO_LAG: &str = "onceflow_broker_lso_lag";
/// Counter: transactional produce batches refused (partition not in the transaction,
/// fenced epoch, unknown producer).
pub const PRODUCE_REFUSED: &str = "onceflow_broker_transactional_produce_refused_total";
