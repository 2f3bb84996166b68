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
    /// (event time) A source's highest event time read per split (partition) up to its
    /// position, so that its watermark resumes there after a restore: a split restored at
    /// its end would otherwise hold the watermark back with no record left to advance it.
    /// Empty for other nodes and in checkpoints of format 3 and older.
    pub event_times: Vec<(u32, i64)>,
}

impl SubtaskSnapshot {
    /// Decodes the payload of a state frame of format `version` (see
    /// [`crate::state::format::FORMAT_VERSION`]).
    pub fn decode_versioned(version: u16, payload: &[u8]) -> crate::Result<Self> {
        if version <= 3 {
            return crate::state::format::decode::<v3::SubtaskSnapshot>(payload)
                .map(SubtaskSnapshot::from);
        }
        crate::state::format::decode(payload)
    }
}

/// The state frame of formats 2 and 3: no event times.
mod v3 {
    use serde::Deserialize;

    use super::KeyGroupSnapshot;
    use crate::element::CheckpointId;

    #[derive(Deserialize)]
    pub struct SubtaskSnapshot {
        node_uid: String,
        subtask: u32,
        parallelism: u32,
        checkpoint_id: CheckpointId,
        key_groups: Vec<KeyGroupSnapshot>,
        operator_state: Option<Vec<u8>>,
        pending_commits: Vec<(CheckpointId, Vec<u8>)>,
    }

    impl From<SubtaskSnapshot> for super::SubtaskSnapshot {
        fn from(s: SubtaskSnapshot) -> Self {
            super::SubtaskSnapshot {
                node_uid: s.node_uid,
                subtask: s.subtask,
                parallelism: s.parallelism,
                checkpoint_id: s.checkpoint_id,
                key_groups: s.key_groups,
                operator_state: s.operator_state,
                pending_commits: s.pending_commits,
                event_times: Vec::new(),
            }
        }
    }
}
