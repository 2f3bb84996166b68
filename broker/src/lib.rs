//! The onceflow reference broker: a single-node Kafka-wire-protocol server with a durable log.
pub mod storage;
pub mod txn; // onceflow-txn (broker-txn helper)
