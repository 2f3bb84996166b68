//! Checkpoints: durable storage, metadata, the coordinator and loading a checkpoint for restore.

pub mod coordinator;
pub mod metadata;
pub mod restore;
pub mod storage;

pub use metadata::{CheckpointMetadata, NodeMetadata, StateFileMetadata};
pub use restore::{load_for_restore, LoadedCheckpoint};
pub use storage::{CheckpointStorage, LocalDirStorage};
