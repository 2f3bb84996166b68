//! On-disk transaction index of one partition, under `<data dir>/txn-index/<topic>-<n>/`:
//!
//! * `aborted.idx`: append-only aborted-transaction entries, 28 bytes each
//!   (`producer_id: i64, first_offset: i64, last_offset: i64, crc32c: u32` big endian),
//!   fsynced when an ABORT marker is written;
//! * `snapshot`: the open transactions at a log offset (`crc32c: u32, version: u8,
//!   offset: i64, count: u32, (producer_id: i64, first_offset: i64)*`), replaced atomically.
//!
//! Recovery loads both and replays the log tail after the snapshot offset, so markers or
//! transactional batches written after the last snapshot (or whose index entry was lost in
//! a crash) are folded back in.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::{Result, TxnError};
use super::partition_state::{AbortedTxn, PartitionTxnState};
use super::state::Reader;

const ENTRY_LEN: usize = 28;
const SNAPSHOT_VERSION: u8 = 1;
/// File of aborted-transaction entries.
pub const ABORTED_FILE: &str = "aborted.idx";
/// File of the open-transactions snapshot.
pub const SNAPSHOT_FILE: &str = "snapshot";

/// The persisted index files of one partition.
#[derive(Debug)]
pub struct PartitionIndexFiles {
    dir: PathBuf,
    aborted: File,
}

/// What was found on disk for a partition.
#[derive(Debug, Default)]
pub struct LoadedIndex {
    /// Aborted entries read from `aborted.idx` (a torn tail is dropped).
    pub aborted: Vec<AbortedTxn>,
    /// `(offset, open transactions)` of the snapshot, if one was valid.
    pub snapshot: Option<(i64, Vec<(i64, i64)>)>,
}

fn encode_entry(a: &AbortedTxn) -> [u8; ENTRY_LEN] {
    let mut b = [0u8; ENTRY_LEN];
    b[0..8].copy_from_slice(&a.producer_id.to_be_bytes());
    b[8..16].copy_from_slice(&a.first_offset.to_be_bytes());
    b[16..24].copy_from_slice(&a.last_offset.to_be_bytes());
    let crc = crc32c::crc32c(&b[0..24]);
    b[24..28].copy_from_slice(&crc.to_be_bytes());
    b
}

fn read_file(path: &Path) -> Result<Option<Vec<u8>>> {
    match File::open(path) {
        Ok(mut f) => {
            let mut v = Vec::new();
            f.read_to_end(&mut v).map_err(|e| TxnError::io(path, e))?;
            Ok(Some(v))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TxnError::io(path, e)),
    }
}

/// The directory name of a partition's index.
pub fn partition_dir(root: &Path, topic: &str, partition: i32) -> PathBuf {
    root.join(format!("{topic}-{partition}"))
}

impl PartitionIndexFiles {
    /// Opens (creating) the index files in `dir` and loads what they hold.
    pub fn open(dir: &Path) -> Result<(Self, LoadedIndex)> {
        std::fs::create_dir_all(dir).map_err(|e| TxnError::io(dir, e))?;
        let apath = dir.join(ABORTED_FILE);
        let raw = read_file(&apath)?.unwrap_or_default();
        let mut loaded = LoadedIndex::default();
        let mut good = 0usize;
        for chunk in raw.chunks(ENTRY_LEN) {
            let mut r = Reader::new(chunk);
            let entry = (|| {
                let a = AbortedTxn {
                    producer_id: r.i64()?,
                    first_offset: r.i64()?,
                    last_offset: r.i64()?,
                };
                (r.u32()? == crc32c::crc32c(&chunk[0..24])).then_some(a)
            })();
            match entry {
                Some(a) => {
                    loaded.aborted.push(a);
                    good += ENTRY_LEN;
                }
                None => break,
            }
        }
        let aborted = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&apath)
            .map_err(|e| TxnError::io(&apath, e))?;
        if good < raw.len() {
            tracing::warn!(path = %apath.display(), "aborted index has a torn tail; cutting it off");
            aborted
                .set_len(good as u64)
                .and_then(|()| aborted.sync_data())
                .map_err(|e| TxnError::io(&apath, e))?;
        }
        let spath = dir.join(SNAPSHOT_FILE);
        if let Some(raw) = read_file(&spath)? {
            loaded.snapshot = decode_snapshot(&raw);
            if loaded.snapshot.is_none() {
                tracing::warn!(path = %spath.display(), "ignoring an unreadable txn snapshot");
            }
        }
        Ok((
            PartitionIndexFiles {
                dir: dir.to_path_buf(),
                aborted,
            },
            loaded,
        ))
    }

    /// Appends aborted entries and fsyncs them.
    pub fn append_aborted(&mut self, entries: &[AbortedTxn]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(entries.len() * ENTRY_LEN);
        for a in entries {
            buf.extend_from_slice(&encode_entry(a));
        }
        let path = self.dir.join(ABORTED_FILE);
        self.aborted
            .write_all(&buf)
            .and_then(|()| self.aborted.sync_data())
            .map_err(|e| TxnError::io(path, e))
    }

    /// Replaces the aborted file by exactly `entries` (used when recovery drops entries past
    /// a shortened log).
    pub fn rewrite_aborted(&mut self, entries: &[AbortedTxn]) -> Result<()> {
        let path = self.dir.join(ABORTED_FILE);
        self.aborted
            .set_len(0)
            .map_err(|e| TxnError::io(&path, e))?;
        self.append_aborted(entries)
    }

    /// Writes the snapshot of `state` at log offset `offset` (temp file, fsync, rename).
    pub fn write_snapshot(&self, offset: i64, state: &PartitionTxnState) -> Result<()> {
        let mut body = vec![SNAPSHOT_VERSION];
        body.extend_from_slice(&offset.to_be_bytes());
        let open: Vec<(i64, i64)> = state.open_transactions().collect();
        body.extend_from_slice(&(open.len() as u32).to_be_bytes());
        for (p, o) in open {
            body.extend_from_slice(&p.to_be_bytes());
            body.extend_from_slice(&o.to_be_bytes());
        }
        let mut out = crc32c::crc32c(&body).to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        let tmp = self.dir.join("snapshot.tmp");
        let path = self.dir.join(SNAPSHOT_FILE);
        let mut f = File::create(&tmp).map_err(|e| TxnError::io(&tmp, e))?;
        f.write_all(&out)
            .and_then(|()| f.sync_all())
            .map_err(|e| TxnError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| TxnError::io(&path, e))
    }
}

fn decode_snapshot(raw: &[u8]) -> Option<(i64, Vec<(i64, i64)>)> {
    let mut r = Reader::new(raw);
    let crc = r.u32()?;
    if crc32c::crc32c(raw.get(4..)?) != crc || r.u8()? != SNAPSHOT_VERSION {
        return None;
    }
    let offset = r.i64()?;
    let n = r.u32()?;
    let mut open = Vec::new();
    for _ in 0..n {
        open.push((r.i64()?, r.i64()?));
    }
    r.is_empty().then_some((offset, open))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::marker::MarkerKind;

    #[test]
    fn entries_and_snapshot_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut files, loaded) = PartitionIndexFiles::open(dir.path()).expect("open");
        assert!(loaded.aborted.is_empty() && loaded.snapshot.is_none());
        let mut st = PartitionTxnState::default();
        st.observe_data(1, 0);
        let a = st.observe_marker(1, MarkerKind::Abort, 3).expect("entry");
        files.append_aborted(&[a]).expect("append");
        st.observe_data(2, 4);
        files.write_snapshot(6, &st).expect("snapshot");
        drop(files);
        // Torn entry at the tail.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(ABORTED_FILE))
            .expect("open");
        f.write_all(&[1, 2, 3]).expect("write");
        drop(f);
        let (_files, loaded) = PartitionIndexFiles::open(dir.path()).expect("reopen");
        assert_eq!(loaded.aborted, vec![a]);
        assert_eq!(loaded.snapshot, Some((6, vec![(2, 4)])));
    }
}
