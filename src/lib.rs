//! onceflow: exactly-once stream processing in Rust.
//!
//! This facade re-exports the public API of the workspace crates.

pub use onceflow_broker as broker;
pub use onceflow_connectors as connectors;
pub use onceflow_operators as operators;
pub use onceflow_runtime as runtime;
