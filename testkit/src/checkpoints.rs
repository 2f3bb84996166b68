//! What a job's checkpoint directory says a restart will do: the newest complete checkpoint
//! and the input positions its sources recorded. Read while the job is stopped (SIGSTOP or
//! dead), these tell which output records a restart replays, without guessing from timing.

use std::collections::HashMap;
use std::path::Path;

use onceflow_connectors::kafka::KafkaPosition;
use onceflow_runtime::checkpoint::restore::load_checkpoint;
use onceflow_runtime::checkpoint::{CheckpointStorage, LocalDirStorage};
use onceflow_runtime::state::format::decode;

use crate::clients::read_topic;

/// Ids of the complete checkpoints in `dir` (metadata durable), ascending.
pub fn complete_checkpoints(dir: &Path) -> Vec<u64> {
    if !dir.exists() {
        return Vec::new();
    }
    LocalDirStorage::new(dir)
        .and_then(|s| s.list_complete())
        .unwrap_or_else(|e| panic!("list checkpoints in {}: {e}", dir.display()))
}

/// The newest complete checkpoint in `dir`.
pub fn latest_complete(dir: &Path) -> Option<u64> {
    complete_checkpoints(dir).last().copied()
}

/// Highest checkpoint id with any trace in `dir` (complete or not); 0 if none. A run that
/// restores continues numbering after it.
pub fn highest_checkpoint_id(dir: &Path) -> u64 {
    if !dir.exists() {
        return 0;
    }
    LocalDirStorage::new(dir)
        .and_then(|s| s.highest_id())
        .unwrap_or_else(|e| panic!("list checkpoints in {}: {e}", dir.display()))
}

/// Next input offset per partition of `topic` that checkpoint `id` in `dir` recorded (the
/// sources' snapshots), i.e. where a restore of `id` starts reading.
pub fn source_positions(dir: &Path, id: u64, topic: &str) -> HashMap<i32, i64> {
    try_source_positions(dir, id, topic)
        .unwrap_or_else(|e| panic!("load checkpoint {id} from {}: {e}", dir.display()))
}

/// [`source_positions`] of a job that may still be running: checkpoint `id` may have been
/// discarded (retention) since it was listed, which is an error here, not a panic.
pub fn try_source_positions(dir: &Path, id: u64, topic: &str) -> Result<HashMap<i32, i64>, String> {
    let storage = LocalDirStorage::new(dir).map_err(|e| e.to_string())?;
    let loaded = load_checkpoint(&storage, id).map_err(|e| e.to_string())?;
    let mut positions = HashMap::new();
    for snap in loaded.nodes.values().flatten() {
        let Some(state) = &snap.operator_state else {
            continue;
        };
        // only the sources store a KafkaPosition; other operator state does not decode as one
        let Ok(pos) = decode::<KafkaPosition>(state) else {
            continue;
        };
        if pos.topic == topic {
            positions.extend(pos.offsets);
        }
    }
    Ok(positions)
}

/// Where every valid input record sits: id -> (partition, offset), read from `topic`.
pub fn input_offsets(bootstrap: &str, topic: &str) -> HashMap<u64, (i32, i64)> {
    read_topic(bootstrap, topic, true)
        .into_iter()
        .filter_map(|c| {
            let v: serde_json::Value = serde_json::from_slice(&c.value).ok()?;
            Some((v.get("id")?.as_u64()?, (c.partition, c.offset)))
        })
        .collect()
}

/// Output ids whose input lies at or after `positions` (read again by a restore of the
/// checkpoint with these positions). Partitions the checkpoint has no position for count as
/// not replayed.
pub fn replayed_ids(
    output_ids: impl IntoIterator<Item = u64>,
    inputs: &HashMap<u64, (i32, i64)>,
    positions: &HashMap<i32, i64>,
) -> Vec<u64> {
    output_ids
        .into_iter()
        .filter(|id| {
            inputs
                .get(id)
                .and_then(|(p, o)| positions.get(p).map(|next| o >= next))
                .unwrap_or(false)
        })
        .collect()
}
