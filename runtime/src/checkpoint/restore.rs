//! Loading a checkpoint for restore: verify metadata and every state file. When the newest
//! complete checkpoint is corrupt the restore fails naming the file and the next older
//! checkpoint, or, where the job allows it, falls back to the newest older one that verifies
//! (its sinks' output after it is then written again).

use std::collections::HashMap;

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::storage::{verify_state, CheckpointStorage, METADATA_FILE};
use crate::config::RestoreMode;
use crate::element::CheckpointId;
use crate::state::snapshot::SubtaskSnapshot;
use crate::{Error, Result};

/// A verified checkpoint, fully loaded.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Subtask snapshots by node uid, in subtask order.
    pub nodes: HashMap<String, Vec<SubtaskSnapshot>>,
}

impl LoadedCheckpoint {
    /// The checkpoint id.
    pub fn id(&self) -> CheckpointId {
        self.metadata.checkpoint_id
    }
}

/// Loads and verifies checkpoint `id`.
pub fn load_checkpoint(
    storage: &dyn CheckpointStorage,
    id: CheckpointId,
) -> Result<LoadedCheckpoint> {
    let metadata = storage.read_metadata(id)?;
    if metadata.checkpoint_id != id {
        return Err(Error::CorruptCheckpoint {
            path: storage.location(id, METADATA_FILE),
            reason: format!("metadata names checkpoint {}", metadata.checkpoint_id),
        });
    }
    let mut nodes = HashMap::new();
    for node in &metadata.nodes {
        let mut subtasks = Vec::with_capacity(node.files.len());
        for f in &node.files {
            let ((version, payload), path) = match &f.inline {
                Some(framed) => {
                    let path = storage.location(id, METADATA_FILE);
                    (verify_state(framed, f.len, f.crc32c, &path)?, path)
                }
                None => (
                    storage.read_state(id, &f.file, f.len, f.crc32c)?,
                    storage.location(id, &f.file),
                ),
            };
            let snap = SubtaskSnapshot::decode_versioned(version, &payload).map_err(|e| {
                Error::CorruptCheckpoint {
                    path,
                    reason: e.to_string(),
                }
            })?;
            subtasks.push(snap);
        }
        subtasks.sort_by_key(|s| s.subtask);
        nodes.insert(node.uid.clone(), subtasks);
    }
    Ok(LoadedCheckpoint { metadata, nodes })
}

/// Chooses and loads the checkpoint named by `mode`. Returns it (or `None` to start fresh)
/// and the errors of checkpoints that were skipped because they did not verify: with
/// `older_if_corrupt` false, a newest complete checkpoint that does not verify fails the
/// restore ([`Error::LatestCheckpointCorrupt`]) instead of being skipped.
pub fn load_for_restore(
    storage: &dyn CheckpointStorage,
    mode: RestoreMode,
    max_parallelism: usize,
    older_if_corrupt: bool,
) -> Result<(Option<LoadedCheckpoint>, Vec<String>)> {
    let check = |c: LoadedCheckpoint| -> Result<LoadedCheckpoint> {
        if c.metadata.max_parallelism as usize != max_parallelism {
            return Err(Error::InvalidJob(format!(
                "checkpoint {} has max_parallelism {}, the job {max_parallelism}; key groups cannot be remapped",
                c.id(),
                c.metadata.max_parallelism
            )));
        }
        Ok(c)
    };
    match mode {
        RestoreMode::None => Ok((None, Vec::new())),
        RestoreMode::Checkpoint(id) => {
            if !storage.list_complete()?.contains(&id) {
                return Err(Error::CheckpointNotFound(id));
            }
            Ok((Some(check(load_checkpoint(storage, id)?)?), Vec::new()))
        }
        RestoreMode::Latest => {
            let ids = storage.list_complete()?;
            let mut errors = Vec::new();
            for id in ids.iter().rev() {
                match load_checkpoint(storage, *id) {
                    Ok(c) => {
                        for e in &errors {
                            tracing::error!(error = %e, "skipped a corrupt checkpoint");
                        }
                        return Ok((Some(check(c)?), errors));
                    }
                    // an older format is not damage: older checkpoints are no better, and
                    // starting from scratch would silently drop the job's state
                    Err(e @ Error::IncompatibleCheckpoint { .. }) => return Err(e),
                    Err(e) if !older_if_corrupt => {
                        return Err(Error::LatestCheckpointCorrupt {
                            latest: *id,
                            older: ids.iter().rev().find(|o| *o < id).copied(),
                            reason: e.to_string(),
                        })
                    }
                    Err(e) => {
                        tracing::error!(checkpoint = id, error = %e, "checkpoint does not verify, trying an older one (restore_older_if_corrupt: output after it repeats)");
                        metrics::counter!(crate::metrics::RESTORE_SKIPPED).increment(1);
                        errors.push(format!("checkpoint {id}: {e}"));
                    }
                }
            }
            if errors.is_empty() {
                Ok((None, errors))
            } else {
                Err(Error::NoValidCheckpoint(errors))
            }
        }
    }
}
