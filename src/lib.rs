//! onceflow: exactly-once stream processing in Rust.
//!
//! This facade re-exports the public API of the workspace crates; most jobs need only
//! `use onceflow::prelude::*`.

#[cfg(feature = "embedded-broker")]
pub use onceflow_broker as broker;
pub use onceflow_connectors as connectors;
pub use onceflow_operators as operators;
pub use onceflow_runtime as runtime;

/// The allocator onceflow's example jobs use and the one to give a job binary:
/// `#[global_allocator] static ALLOC: onceflow::JobAllocator = onceflow::JobAllocator;`
/// (mimalloc). A job allocates each record on one thread and frees it on another (source,
/// operators, sink); with glibc's allocator the example job spent about a quarter of its CPU
/// in malloc and free, and with this one it takes about a third less CPU per record
/// (`docs/BENCHMARKS.md`, "Job allocator").
pub use mimalloc::MiMalloc as JobAllocator;

/// The Kafka job builder: start-up checks, takeover, restore, standard flags, exit codes.
pub use onceflow_connectors::kafka::job;

/// Everything a typical job uses: the environment, configuration, operator traits and the
/// built-in connectors.
pub mod prelude {
    pub use onceflow_connectors::kafka::{
        Decoder, DeliveryMode, KafkaJob, KafkaJobArgs, KafkaMessage, KafkaOutputs, KafkaSink,
        KafkaSinkConfig, KafkaSource, SinkRecord,
    };
    pub use onceflow_connectors::{CollectSink, FileSink, FileSinkMode, Generator, MemorySource};
    pub use onceflow_operators::{
        Connect, Filter, FlatMap, KeyBy, KeyedCoProcessFunction, KeyedContext,
        KeyedProcessFunction, KeyedStream, Map, Rebalance,
    };
    pub use onceflow_runtime::{
        CheckpointEvent, CheckpointId, CompletionHook, Data, DataStream, Error, JobArgs, JobConfig,
        JobResult, Key, Operator, RestoreMode, Result, Sink, SinkFactory, Source, SourceFactory,
        SourcePoll, StopHandle, StreamEnvironment, SubtaskInfo, TwoInputs,
    };
}
