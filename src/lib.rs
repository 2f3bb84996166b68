//! onceflow: exactly-once stream processing in Rust.
//!
//! This facade re-exports the public API of the workspace crates; most jobs need only
//! `use onceflow::prelude::*`.

pub use onceflow_broker as broker;
pub use onceflow_connectors as connectors;
pub use onceflow_operators as operators;
pub use onceflow_runtime as runtime;

/// Everything a typical job uses: the environment, configuration, operator traits and the
/// built-in connectors.
pub mod prelude {
    pub use onceflow_connectors::kafka::{
        committed_checkpoint, CheckpointSeal, DeliveryMode, KafkaMessage, KafkaSink,
        KafkaSinkConfig, KafkaSource, OffsetsLink, SinkRecord,
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
