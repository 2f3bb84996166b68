//! Checkpoint metadata: the list of state files that make a checkpoint complete. A checkpoint
//! exists only once its metadata file has been written durably.

use serde::{Deserialize, Serialize};

use crate::element::CheckpointId;

/// One subtask's state file as recorded in the metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileMetadata {
    /// Subtask index.
    pub subtask: u32,
    /// File name inside the checkpoint.
    pub file: String,
    /// File length in bytes (frame included).
    pub len: u64,
    /// crc32c of the whole file.
    pub crc32c: u32,
}

/// One operator node in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMetadata {
    /// Stable node id.
    pub uid: String,
    /// Parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// The subtasks' state files.
    pub files: Vec<StateFileMetadata>,
}

/// Everything needed to restore a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// Checkpoint id.
    pub checkpoint_id: CheckpointId,
    /// Job name.
    pub job_name: String,
    /// Number of key groups of the job.
    pub max_parallelism: u32,
    /// When the checkpoint was triggered (ms since the Unix epoch).
    pub triggered_ms: u64,
    /// Whether it was the final checkpoint of a run.
    pub is_final: bool,
    /// Every node's state files.
    pub nodes: Vec<NodeMetadata>,
}
