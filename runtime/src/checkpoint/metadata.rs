//! Checkpoint metadata: the list of state files that make a checkpoint complete. A checkpoint
//! exists only once its metadata file has been written durably.

use serde::{Deserialize, Serialize};

use crate::element::CheckpointId;

/// One subtask's state as recorded in the metadata: a file of the checkpoint, or the framed
/// snapshot itself when it was small enough to keep in the metadata
/// ([`crate::JobConfig::state_inline_threshold`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileMetadata {
    /// Subtask index.
    pub subtask: u32,
    /// File name inside the checkpoint (the name the state would have had as a file when it
    /// is inline).
    pub file: String,
    /// File length in bytes (frame included).
    pub len: u64,
    /// crc32c of the whole file.
    pub crc32c: u32,
    /// The framed snapshot, when it is kept in the metadata instead of a file of its own.
    pub inline: Option<Vec<u8>>,
}

impl StateFileMetadata {
    /// The record of a snapshot `payload` kept inline: framed as its file would be, with that
    /// frame's length and crc32c, so that restore verifies it as it verifies a file.
    pub fn inlined(subtask: u32, file: String, payload: &[u8]) -> Self {
        let framed = crate::state::format::frame(crate::state::format::FrameKind::State, payload);
        StateFileMetadata {
            subtask,
            file,
            len: framed.len() as u64,
            crc32c: crc32c::crc32c(&framed),
            inline: Some(framed),
        }
    }
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

/// The metadata layout of format version 2, before inline state: read so that a checkpoint
/// taken by an older build still restores.
pub(crate) mod v2 {
    use serde::Deserialize;

    use crate::element::CheckpointId;

    #[derive(Deserialize)]
    pub struct StateFileMetadata {
        subtask: u32,
        file: String,
        len: u64,
        crc32c: u32,
    }

    #[derive(Deserialize)]
    pub struct NodeMetadata {
        uid: String,
        parallelism: u32,
        files: Vec<StateFileMetadata>,
    }

    #[derive(Deserialize)]
    pub struct CheckpointMetadata {
        checkpoint_id: CheckpointId,
        job_name: String,
        max_parallelism: u32,
        triggered_ms: u64,
        is_final: bool,
        nodes: Vec<NodeMetadata>,
    }

    impl From<CheckpointMetadata> for super::CheckpointMetadata {
        fn from(m: CheckpointMetadata) -> Self {
            super::CheckpointMetadata {
                checkpoint_id: m.checkpoint_id,
                job_name: m.job_name,
                max_parallelism: m.max_parallelism,
                triggered_ms: m.triggered_ms,
                is_final: m.is_final,
                nodes: m
                    .nodes
                    .into_iter()
                    .map(|n| super::NodeMetadata {
                        uid: n.uid,
                        parallelism: n.parallelism,
                        files: n
                            .files
                            .into_iter()
                            .map(|f| super::StateFileMetadata {
                                subtask: f.subtask,
                                file: f.file,
                                len: f.len,
                                crc32c: f.crc32c,
                                inline: None,
                            })
                            .collect(),
                    })
                    .collect(),
            }
        }
    }
}
