//! Connectors of onceflow: Kafka source and transactional sink, file and in-memory sources and sinks.
