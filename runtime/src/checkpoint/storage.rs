//! Checkpoint storage behind a trait; the local-directory implementation writes every file
//! with fsync and publishes a checkpoint by writing its metadata to a temp file, fsyncing it,
//! renaming it into place and fsyncing the directory.
//!
//! Layout: `<dir>/chk-<id:020>/<node uid>-<subtask>.state` and `.../_metadata`; a subtask
//! snapshot small enough to be kept inline in `_metadata` has no `.state` file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::checkpoint::metadata::{v2, CheckpointMetadata};
use crate::element::CheckpointId;
use crate::state::format::{decode, encode, frame, unframe_versioned, FrameKind};
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
    /// Reads a state file, verifies it against `len`/`crc` and returns its format version
    /// and payload.
    fn read_state(
        &self,
        id: CheckpointId,
        file: &str,
        len: u64,
        crc: u32,
    ) -> Result<(u16, Vec<u8>)>;
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

/// Verifies a framed state read from `path` (a state file, or the metadata file that holds it
/// inline) against the length and crc32c the metadata recorded, and returns its format
/// version and payload.
pub(crate) fn verify_state(
    bytes: &[u8],
    len: u64,
    crc: u32,
    path: &Path,
) -> Result<(u16, Vec<u8>)> {
    if bytes.len() as u64 != len {
        return Err(Error::CorruptCheckpoint {
            path: path.to_path_buf(),
            reason: format!(
                "length {} differs from the {len} bytes recorded in the metadata",
                bytes.len()
            ),
        });
    }
    if crc32c::crc32c(bytes) != crc {
        return Err(Error::CorruptCheckpoint {
            path: path.to_path_buf(),
            reason: "checksum differs from the one recorded in the metadata".into(),
        });
    }
    let (version, payload) = unframe_versioned(FrameKind::State, bytes, path)?;
    Ok((version, payload.to_vec()))
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
        // the state files' directory entries, if any, before the metadata that names them
        if meta
            .nodes
            .iter()
            .flat_map(|n| &n.files)
            .any(|f| f.inline.is_none())
        {
            sync_dir(&dir)?;
        }
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
        let (version, payload) = unframe_versioned(FrameKind::Metadata, &bytes, &path)?;
        let corrupt = |e: Error| Error::CorruptCheckpoint {
            path: path.clone(),
            reason: e.to_string(),
        };
        if version == 2 {
            return decode::<v2::CheckpointMetadata>(payload)
                .map(CheckpointMetadata::from)
                .map_err(corrupt);
        }
        decode(payload).map_err(corrupt)
    }

    fn read_state(
        &self,
        id: CheckpointId,
        file: &str,
        len: u64,
        crc: u32,
    ) -> Result<(u16, Vec<u8>)> {
        let path = self.location(id, file);
        let bytes = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        verify_state(&bytes, len, crc, &path)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::{NodeMetadata, StateFileMetadata};
    use crate::checkpoint::restore::load_checkpoint;
    use crate::state::SubtaskSnapshot;

    fn snapshot(subtask: u32, state: &[u8]) -> SubtaskSnapshot {
        SubtaskSnapshot {
            node_uid: "n00-op".into(),
            subtask,
            parallelism: 2,
            checkpoint_id: 7,
            operator_state: Some(state.to_vec()),
            ..Default::default()
        }
    }

    fn metadata(files: Vec<StateFileMetadata>) -> CheckpointMetadata {
        CheckpointMetadata {
            checkpoint_id: 7,
            job_name: "j".into(),
            max_parallelism: 128,
            triggered_ms: 1,
            is_final: false,
            nodes: vec![NodeMetadata {
                uid: "n00-op".into(),
                parallelism: 2,
                files,
            }],
        }
    }

    /// One subtask's state in a file, the other's inline in the metadata: both restore, with
    /// their event times, and only the first has a file.
    #[test]
    fn inline_and_file_states_restore_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let st = LocalDirStorage::new(dir.path()).unwrap();
        st.begin(7).unwrap();
        let mut on_disk = snapshot(0, b"in a file");
        on_disk.event_times = vec![(0, 1_000), (2, -5)];
        let (len, crc32c) = st
            .write_state(7, "n00-op-0.state", &encode(&on_disk).unwrap())
            .unwrap();
        let mut inline = snapshot(1, b"inline");
        inline.event_times = vec![(1, i64::MAX)];
        let inline = encode(&inline).unwrap();
        let files = vec![
            StateFileMetadata {
                subtask: 0,
                file: "n00-op-0.state".into(),
                len,
                crc32c,
                inline: None,
            },
            StateFileMetadata::inlined(1, "n00-op-1.state".into(), &inline),
        ];
        st.commit_metadata(&metadata(files)).unwrap();
        assert!(st.location(7, "n00-op-0.state").exists());
        assert!(!st.location(7, "n00-op-1.state").exists());
        let loaded = load_checkpoint(&st, 7).unwrap();
        let states: Vec<_> = loaded.nodes["n00-op"]
            .iter()
            .map(|s| s.operator_state.clone().unwrap())
            .collect();
        assert_eq!(states, vec![b"in a file".to_vec(), b"inline".to_vec()]);
        let times: Vec<_> = loaded.nodes["n00-op"]
            .iter()
            .map(|s| s.event_times.clone())
            .collect();
        assert_eq!(times, vec![vec![(0, 1_000), (2, -5)], vec![(1, i64::MAX)]]);
    }

    /// An inline state recorded with the wrong length or checksum is reported against the
    /// metadata file, as a damaged state file is against its own path.
    #[test]
    fn an_inline_state_that_does_not_match_its_record_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let st = LocalDirStorage::new(dir.path()).unwrap();
        st.begin(7).unwrap();
        let mut record = StateFileMetadata::inlined(
            0,
            "n00-op-0.state".into(),
            &encode(&snapshot(0, b"x")).unwrap(),
        );
        record.crc32c ^= 1;
        let files = vec![record];
        st.commit_metadata(&metadata(files)).unwrap();
        match load_checkpoint(&st, 7) {
            Err(Error::CorruptCheckpoint { path, reason }) => {
                assert_eq!(path, st.location(7, METADATA_FILE));
                assert!(reason.contains("checksum"), "{reason}");
            }
            other => panic!("expected a corrupt checkpoint, got {other:?}"),
        }
    }

    /// A state file written by a format-3 build (no event times) still restores, without
    /// event times.
    #[test]
    fn format_3_state_restores_without_event_times() {
        let dir = tempfile::tempdir().unwrap();
        let st = LocalDirStorage::new(dir.path()).unwrap();
        st.begin(7).unwrap();
        // the version-3 layout: bincode of the same fields without `event_times`, framed as 3
        type V3 = (
            String,
            u32,
            u32,
            u64,
            Vec<crate::state::KeyGroupSnapshot>,
            Option<Vec<u8>>,
            Vec<(u64, Vec<u8>)>,
        );
        let v3: V3 = (
            "n00-op".into(),
            0,
            2,
            7,
            Vec::new(),
            Some(b"old".to_vec()),
            Vec::new(),
        );
        let mut bytes = frame(FrameKind::State, &encode(&v3).unwrap());
        bytes[4..6].copy_from_slice(&3u16.to_le_bytes());
        fs::write(st.location(7, "n00-op-0.state"), &bytes).unwrap();
        let files = vec![StateFileMetadata {
            subtask: 0,
            file: "n00-op-0.state".into(),
            len: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
            inline: None,
        }];
        st.commit_metadata(&metadata(files)).unwrap();
        let loaded = load_checkpoint(&st, 7).unwrap();
        let snap = &loaded.nodes["n00-op"][0];
        assert_eq!(snap.operator_state.as_deref(), Some(&b"old"[..]));
        assert!(snap.event_times.is_empty());
    }

    /// Metadata written by a format-2 build (no inline field) still reads and restores.
    #[test]
    fn format_2_metadata_still_restores() {
        let dir = tempfile::tempdir().unwrap();
        let st = LocalDirStorage::new(dir.path()).unwrap();
        st.begin(7).unwrap();
        let state = encode(&snapshot(0, b"old")).unwrap();
        let (len, crc) = st.write_state(7, "n00-op-0.state", &state).unwrap();
        // the version-2 layout: bincode of the same fields without `inline`, framed as 2
        type V2File = (u32, String, u64, u32);
        type V2Node = (String, u32, Vec<V2File>);
        let v2: (u64, String, u32, u64, bool, Vec<V2Node>) = (
            7,
            "j".into(),
            128,
            1,
            false,
            vec![(
                "n00-op".into(),
                2,
                vec![(0, "n00-op-0.state".into(), len, crc)],
            )],
        );
        let mut bytes = frame(FrameKind::Metadata, &encode(&v2).unwrap());
        bytes[4..6].copy_from_slice(&2u16.to_le_bytes());
        fs::write(st.location(7, METADATA_FILE), &bytes).unwrap();
        let meta = st.read_metadata(7).unwrap();
        assert_eq!(meta.nodes[0].files[0].inline, None);
        assert_eq!(meta.nodes[0].files[0].len, len);
        let loaded = load_checkpoint(&st, 7).unwrap();
        assert_eq!(
            loaded.nodes["n00-op"][0].operator_state.as_deref(),
            Some(&b"old"[..])
        );
    }
}
