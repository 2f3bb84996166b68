//! The dataflow runtime of onceflow: graph, tasks, channels, barriers, checkpoints, state,
//! recovery.
//!
//! A job is built with a [`StreamEnvironment`] into a graph of sources, operators and sinks,
//! each running `parallelism` subtasks as tokio tasks connected by bounded channels. The
//! checkpoint coordinator injects barriers at the sources; operators with several inputs align
//! them; every subtask snapshots its state; sinks pre-commit; once the metadata is durable the
//! sinks commit. See `ARCHITECTURE-runtime.md` for the protocol and the snapshot format.

pub mod channel;
pub mod checkpoint;
mod cli;
pub mod config;
pub mod connector;
pub mod element;
mod error;
mod execute;
mod graph;
pub mod keygroup;
pub mod metrics;
pub mod operator;
pub mod output;
pub mod state;
mod stream;
mod task;
pub mod watermark;

pub use cli::JobArgs;
pub use config::{
    CheckpointEvent, CompletionHook, JobConfig, RestoreMode, DEFAULT_STATE_INLINE_THRESHOLD,
};
pub use connector::{PreCommit, Sink, SinkFactory, Source, SourceFactory, SourcePoll, SubtaskInfo};
pub use element::{Barrier, CheckpointId, Data, Key, StreamElement, TwoInputs, Watermark};
pub use error::{Error, Fault, Result};
pub use execute::JobResult;
pub use graph::OperatorFactory;
pub use operator::Operator;
pub use output::Partitioning;
pub use stream::{DataStream, KeyRoute, StopHandle, StreamEnvironment};
pub use watermark::{
    BoundedOutOfOrderness, SourceWatermarks, WatermarkGenerator, WatermarkStrategy,
};

/// Re-exported for connector implementations.
pub use async_trait::async_trait;
