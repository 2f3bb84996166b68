//! The onceflow reference broker: a single-node Kafka-wire-protocol server with a durable log.
pub mod group;
