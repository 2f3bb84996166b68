//! Snapshot types: what an operator hands to a checkpoint and gets back on restore.

use serde::{Deserialize, Serialize};

use crate::element::CheckpointId;

/// The keyed state of one key group: each named state table serialized on its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupSnapshot {
    /// The key group.
    pub key_group: u16,
    /// `(state name, bincode of the table's entries in this key group)`.
    pub tables: Vec<(String, Vec<u8>)>,
}

/// What an operator subtask contributes to a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorSnapshot {
    /// Keyed state, one entry per non-empty key group.
    pub key_groups: Vec<KeyGroupSnapshot>,
    /// Non-keyed operator state (opaque bytes), if any.
    pub operator_state: Option<Vec<u8>>,
}

/// The state handed to an operator subtask on restore, already re-sliced for its key-group
/// range (so a job can restore at another parallelism).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoredState {
    /// Key groups of this subtask's range that had state.
    pub key_groups: Vec<KeyGroupSnapshot>,
    /// Non-keyed states of every subtask of the previous run (in subtask order).
    pub operator_states: Vec<Vec<u8>>,
}

/// The serialized content of one subtask's state file in a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskSnapshot {
    /// Stable id of the operator node.
    pub node_uid: String,
    /// Subtask index.
    pub subtask: u32,
    /// Parallelism of the node when the snapshot was taken.
    pub parallelism: u32,
    /// Checkpoint the snapshot belongs to.
    pub checkpoint_id: CheckpointId,
    /// Keyed state per key group.
    pub key_groups: Vec<KeyGroupSnapshot>,
    /// Non-keyed operator state; a source's position.
    pub operator_state: Option<Vec<u8>>,
    /// A sink's pre-committed, not yet committed outputs: `(checkpoint, pending info)`.
    pub pending_commits: Vec<(CheckpointId, Vec<u8>)>,
}
