//! Checkpoint storage behind a trait; the local-directory implementation writes every file
//! with fsync and publishes a checkpoint by writing its metadata to a temp file, fsyncing it,
//! renaming it into place and fsyncing the directory.
//!
//! Layout: `<dir>/chk-<id:020>/<node uid>-<subtask>.state` and `.../_metadata`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::element::CheckpointId;
use crate::state::format::{decode, encode, frame, unframe, FrameKind};
use crate::{Error, Result};

/// Durable storage of checkpoints.
pub trait CheckpointStorage: Send + Sync + 'static {
    /// Prepares an empty location for checkpoint `id` (removing leftovers of a failed attempt).
    fn begin(&self, id: CheckpointId) -> Result<()>;
    /// Writes a state file (framed, synced) and returns its length and crc32c.
    fn write_state(&self, id: CheckpointId, file: &str, payload: &[u8]) -> Result<(u64, u32)>;
    /// Atomically publishes the metadata: after this returns the checkpoint is complete.
    fn commit_metadata(&self, meta: &CheckpointMetadata) -> Result<()>;
    /// Ids of checkpoints that have metadata, ascending.
    fn list_complete(&self) -> Result<Vec<CheckpointId>>;
    /// Ids of every checkpoint with any trace in storage (complete or not), ascending.
    fn list_all(&self) -> Result<Vec<CheckpointId>>;
    /// Highest id with any trace in storage (complete or not); 0 if none.
    fn highest_id(&self) -> Result<CheckpointId> {
        Ok(self.list_all()?.last().copied().unwrap_or(0))
    }
    /// Reads and verifies a checkpoint's metadata.
    fn read_metadata(&self, id: CheckpointId) -> Result<CheckpointMetadata>;
    /// Reads a state file, verifies it against `len`/`crc` and returns the payload.
    fn read_state(&self, id: CheckpointId, file: &str, len: u64, crc: u32) -> Result<Vec<u8>>;
    /// Deletes a checkpoint.
    fn discard(&self, id: CheckpointId) -> Result<()>;
    /// Human-readable location of a file (for error messages).
    fn location(&self, id: CheckpointId, file: &str) -> PathBuf;
}

/// Name of the metadata file inside a checkpoint directory.
pub const METADATA_FILE: &str = "_metadata";

/// Checkpoints in a local directory.
#[derive(Debug, Clone)]
pub struct LocalDirStorage {
    root: PathBuf,
}

impl LocalDirStorage {
    /// Storage rooted at `root` (created if missing).
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        Ok(LocalDirStorage { root })
    }

    /// Directory of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.root.join(format!("chk-{id:020}"))
    }

    fn ids(&self) -> Result<Vec<CheckpointId>> {
        let mut ids = Vec::new();
        let rd = fs::read_dir(&self.root).map_err(|e| Error::io(&self.root, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&self.root, e))?;
            let name = entry.file_name();
            if let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("chk-"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

impl CheckpointStorage for LocalDirStorage {
    fn begin(&self, id: CheckpointId) -> Result<()> {
        let dir = self.checkpoint_dir(id);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))
    }

    fn write_state(&self, id: CheckpointId, file: &str, payload: &[u8]) -> Result<(u64, u32)> {
        let bytes = frame(FrameKind::State, payload);
        let path = self.checkpoint_dir(id).join(file);
        write_synced(&path, &bytes)?;
        Ok((bytes.len() as u64, crc32c::crc32c(&bytes)))
    }

    fn commit_metadata(&self, meta: &CheckpointMetadata) -> Result<()> {
        let dir = self.checkpoint_dir(meta.checkpoint_id);
        sync_dir(&dir)?;
        let tmp = dir.join(format!("{METADATA_FILE}.tmp"));
        write_synced(&tmp, &frame(FrameKind::Metadata, &encode(meta)?))?;
        let dst = dir.join(METADATA_FILE);
        fs::rename(&tmp, &dst).map_err(|e| Error::io(&dst, e))?;
        sync_dir(&dir)?;
        sync_dir(&self.root)
    }

    fn list_complete(&self) -> Result<Vec<CheckpointId>> {
        Ok(self
            .ids()?
            .into_iter()
            .filter(|id| self.checkpoint_dir(*id).join(METADATA_FILE).exists())
            .collect())
    }

    fn list_all(&self) -> Result<Vec<CheckpointId>> {
        self.ids()
    }

    fn read_metadata(&self, id: CheckpointId) -> Result<CheckpointMetadata> {
        let path = self.location(id, METADATA_FILE);
        let bytes = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let payload = unframe(FrameKind::Metadata, &bytes, &path)?;
        decode(payload).map_err(|e| Error::CorruptCheckpoint {
            path: path.clone(),
            reason: e.to_string(),
        })
    }

    fn read_state(&self, id: CheckpointId, file: &str, len: u64, crc: u32) -> Result<Vec<u8>> {
        let path = self.location(id, file);
        let bytes = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        if bytes.len() as u64 != len {
            return Err(Error::CorruptCheckpoint {
                path,
                reason: format!(
                    "length {} differs from the {len} bytes recorded in the metadata",
                    bytes.len()
                ),
            });
        }
        if crc32c::crc32c(&bytes) != crc {
            return Err(Error::CorruptCheckpoint {
                path,
                reason: "checksum differs from the one recorded in the metadata".into(),
            });
        }
        Ok(unframe(FrameKind::State, &bytes, &path)?.to_vec())
    }

    fn discard(&self, id: CheckpointId) -> Result<()> {
        let dir = self.checkpoint_dir(id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&dir, e)),
        }
    }

    fn location(&self, id: CheckpointId, file: &str) -> PathBuf {
        self.checkpoint_dir(id).join(file)
    }
}
