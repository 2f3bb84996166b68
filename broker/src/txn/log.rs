//! The durable transaction log: an append-only file of checksummed records holding every
//! state change of every transactional id, the producer-id allocation limit and the
//! coordinator epoch. Each append is fsynced before the coordinator answers the client.
//! On open the file is replayed through [`crate::framed_log`] (a torn tail from a crash is cut
//! off; damage followed by valid records refuses the open unless repair was asked for) and
//! compacted.
//!
//! Record layout (big endian): `len: u32, crc32c(payload): u32, payload[len]`, where the
//! payload starts with a type byte: 1 = upsert metadata, 2 = remove transactional id,
//! 4 = coordinator epoch (3 is reserved).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::error::{Result, TxnError};
use super::state::{Reader, TxnMetadata};
use crate::framed_log::{Appender, ByteOrder, Framing, ScanError};

/// File name of the transaction log inside the transaction directory.
pub const LOG_FILE: &str = "transactions.log";
const REC_UPSERT: u8 = 1;
const REC_REMOVE: u8 = 2;
const REC_COORD_EPOCH: u8 = 4;
/// The frame layout of the log (big endian header, payloads up to 64 MiB).
const FRAMING: Framing = Framing {
    order: ByteOrder::Big,
    max_payload: 64 << 20,
    kind: "transactions",
};

/// One entry of the transaction log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    /// The full current metadata of a transactional id.
    Upsert(TxnMetadata),
    /// The transactional id expired (Dead) and is forgotten.
    Remove(String),
    /// The coordinator epoch of this broker run.
    CoordinatorEpoch(i32),
}

impl LogRecord {
    fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(128);
        match self {
            LogRecord::Upsert(m) => {
                payload.push(REC_UPSERT);
                m.encode_into(&mut payload);
            }
            LogRecord::Remove(id) => {
                payload.push(REC_REMOVE);
                payload.extend_from_slice(&(id.len() as u32).to_be_bytes());
                payload.extend_from_slice(id.as_bytes());
            }
            LogRecord::CoordinatorEpoch(e) => {
                payload.push(REC_COORD_EPOCH);
                payload.extend_from_slice(&e.to_be_bytes());
            }
        }
        FRAMING.frame(&payload)
    }

    fn decode(payload: &[u8]) -> Option<Self> {
        let mut r = Reader::new(payload);
        let rec = match r.u8()? {
            REC_UPSERT => LogRecord::Upsert(TxnMetadata::decode(&mut r)?),
            REC_REMOVE => LogRecord::Remove(r.str()?),
            REC_COORD_EPOCH => LogRecord::CoordinatorEpoch(r.i32()?),
            _ => return None,
        };
        r.is_empty().then_some(rec)
    }
}

/// What replaying the log yields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogImage {
    /// Live transactional ids with their latest metadata.
    pub txns: HashMap<String, TxnMetadata>,
    /// Coordinator epoch of the last run (-1 if none).
    pub coordinator_epoch: i32,
}

impl LogImage {
    fn apply(&mut self, rec: LogRecord) {
        match rec {
            LogRecord::Upsert(m) => {
                self.txns.insert(m.transactional_id.clone(), m);
            }
            LogRecord::Remove(id) => {
                self.txns.remove(&id);
            }
            LogRecord::CoordinatorEpoch(e) => {
                self.coordinator_epoch = self.coordinator_epoch.max(e)
            }
        }
    }

    fn records(&self) -> Vec<LogRecord> {
        let mut out = vec![LogRecord::CoordinatorEpoch(self.coordinator_epoch)];
        let mut ids: Vec<&String> = self.txns.keys().collect();
        ids.sort();
        out.extend(
            ids.into_iter()
                .map(|id| LogRecord::Upsert(self.txns[id].clone())),
        );
        out
    }
}

/// The open transaction log (or an in-memory stand-in when the broker has no data dir).
#[derive(Debug)]
pub struct TxnLog {
    path: Option<PathBuf>,
    file: Option<Appender>,
    records_since_compaction: u64,
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| TxnError::io(dir, e))
}

impl TxnLog {
    /// A log that keeps nothing (in-memory brokers).
    pub fn in_memory() -> Self {
        TxnLog {
            path: None,
            file: None,
            records_since_compaction: 0,
        }
    }

    /// Opens (creating) the log in `dir`, replays it, cuts off a torn tail, and rewrites it
    /// compacted. Damage followed by valid records is [`TxnError::CorruptLog`] (the file is
    /// left unchanged) unless `repair`, which drops the damaged bytes and reports them.
    /// Returns the log and the replayed image.
    pub fn open(dir: &Path, repair: bool) -> Result<(TxnLog, LogImage)> {
        std::fs::create_dir_all(dir).map_err(|e| TxnError::io(dir, e))?;
        let path = dir.join(LOG_FILE);
        let mut image = LogImage {
            coordinator_epoch: -1,
            ..LogImage::default()
        };
        let mut raw = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut raw)
                    .map_err(|e| TxnError::io(&path, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(TxnError::io(&path, e)),
        }
        let scan = FRAMING
            .scan(&path, &raw, repair, |p| {
                LogRecord::decode(p).ok_or_else(|| "undecodable record".to_string())
            })
            .map_err(|e| match e {
                ScanError::Corrupt(c) => TxnError::CorruptLog(c),
                ScanError::Undecodable(u) => TxnError::Corrupt {
                    path: path.clone(),
                    reason: format!(
                        "undecodable record at byte {} with a valid checksum",
                        u.position
                    ),
                },
            })?;
        FRAMING.report(&path, &scan);
        for rec in scan.records {
            image.apply(rec);
        }
        let mut log = TxnLog {
            path: Some(path),
            file: None,
            records_since_compaction: 0,
        };
        log.rewrite(&image)?;
        Ok((log, image))
    }

    /// Appends one record and fsyncs it. A failed write is cut back off the file; after a
    /// failed fsync the log is offline: every later append fails until a restart.
    pub fn append(&mut self, rec: &LogRecord) -> Result<()> {
        let (Some(path), Some(file)) = (&self.path, &mut self.file) else {
            return Ok(());
        };
        file.append(&rec.encode(), true)
            .map_err(|e| TxnError::io(path, e))?;
        self.records_since_compaction += 1;
        Ok(())
    }

    /// Appends one record without waiting for it to reach the disk: the next
    /// [`TxnLog::append`] (whose fsync covers everything written before it) or the kernel's
    /// writeback makes it durable. Only for records whose loss in a crash the restart
    /// repairs: CompleteCommit/CompleteAbort, without which the transaction is found in
    /// PrepareCommit/PrepareAbort and completed again (its markers are written only where
    /// the transaction is still open, so nothing twice).
    pub fn append_unsynced(&mut self, rec: &LogRecord) -> Result<()> {
        let (Some(path), Some(file)) = (&self.path, &mut self.file) else {
            return Ok(());
        };
        file.append(&rec.encode(), false)
            .map_err(|e| TxnError::io(path, e))?;
        self.records_since_compaction += 1;
        Ok(())
    }

    /// Records appended since the last compaction.
    pub fn records_since_compaction(&self) -> u64 {
        self.records_since_compaction
    }

    /// Replaces the file by one holding exactly `image` (temp file, fsync, rename, fsync dir).
    pub fn rewrite(&mut self, image: &LogImage) -> Result<()> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        if let Some(why) = self.file.as_ref().and_then(Appender::offline) {
            // what reached the disk is unknown; only a restart reads it back
            return Err(TxnError::io(
                &path,
                std::io::Error::other(format!("log offline until restart: {why}")),
            ));
        }
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let tmp = path.with_extension("log.tmp");
        let mut bytes = Vec::new();
        for rec in image.records() {
            bytes.extend_from_slice(&rec.encode());
        }
        {
            let mut f = File::create(&tmp).map_err(|e| TxnError::io(&tmp, e))?;
            f.write_all(&bytes)
                .and_then(|()| f.sync_all())
                .map_err(|e| TxnError::io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| TxnError::io(&path, e))?;
        fsync_dir(&dir)?;
        let mut f = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| TxnError::io(&path, e))?;
        let len = f
            .seek(SeekFrom::End(0))
            .map_err(|e| TxnError::io(&path, e))?;
        self.file = Some(Appender::new(f, len));
        self.records_since_compaction = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::framed_log::faulty::{Faults, FaultyFile};
    use crate::txn::state::TxnState;

    /// A log in `dir` whose file fails as the returned [`Faults`] say.
    fn faulty_log(dir: &Path) -> (TxnLog, Arc<Faults>) {
        let (mut log, _) = TxnLog::open(dir, false).expect("open");
        let faults = Arc::new(Faults::default());
        let shared = Arc::clone(&faults);
        log.file.as_mut().expect("file").wrap_file(move |inner| {
            Box::new(FaultyFile {
                inner,
                faults: shared,
            })
        });
        (log, faults)
    }

    fn upsert(id: &str) -> LogRecord {
        LogRecord::Upsert(TxnMetadata::new(id, 1, 1000, 1))
    }

    fn ids(image: &LogImage) -> Vec<String> {
        let mut ids: Vec<String> = image.txns.keys().cloned().collect();
        ids.sort();
        ids
    }

    #[test]
    fn an_append_after_a_failed_write_reads_back_at_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, faults) = faulty_log(dir.path());
        log.append(&upsert("a")).expect("append a");
        faults.torn_write.store(true, Ordering::SeqCst);
        assert!(log.append(&upsert("b")).is_err(), "the torn write failed");
        faults.torn_write.store(false, Ordering::SeqCst);
        log.append(&upsert("c")).expect("append c");
        drop(log);
        let (_log, image) = TxnLog::open(dir.path(), false)
            .expect("reopen: the failed write left no partial frame before c");
        assert_eq!(ids(&image), ["a", "c"]);
    }

    #[test]
    fn after_a_failed_fsync_the_log_takes_no_appends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, faults) = faulty_log(dir.path());
        log.append(&upsert("a")).expect("append a");
        faults.sync.store(true, Ordering::SeqCst);
        assert!(log.append(&upsert("b")).is_err(), "the fsync failed");
        faults.sync.store(false, Ordering::SeqCst);
        let refused = log
            .append(&upsert("c"))
            .expect_err("appends after a failed fsync");
        assert!(refused.to_string().contains("offline"), "{refused}");
        assert!(log.append_unsynced(&upsert("d")).is_err());
        assert!(log.rewrite(&LogImage::default()).is_err());
        drop(log);
        let (_log, image) = TxnLog::open(dir.path(), false).expect("reopen");
        assert_eq!(ids(&image), ["a"], "the failed record was cut back off");
    }

    #[test]
    fn replays_latest_state_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, image) = TxnLog::open(dir.path(), false).expect("open");
        assert!(image.txns.is_empty());
        let mut m = TxnMetadata::new("t", 5, 1000, 1);
        log.append(&LogRecord::CoordinatorEpoch(0)).expect("append");
        log.append(&LogRecord::Upsert(m.clone())).expect("append");
        m.state = TxnState::Ongoing;
        m.partitions.insert(("x".into(), 1));
        log.append(&LogRecord::Upsert(m.clone())).expect("append");
        log.append(&LogRecord::Upsert(TxnMetadata::new("gone", 9, 1, 1)))
            .expect("append");
        log.append(&LogRecord::Remove("gone".into()))
            .expect("append");
        drop(log);
        // A torn record at the end, as a crash mid-write leaves it.
        let path = dir.path().join(LOG_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&[0, 0, 0, 40, 1, 2]).expect("write");
        drop(f);
        let (_log, image) = TxnLog::open(dir.path(), false).expect("reopen");
        assert_eq!(image.txns.len(), 1);
        assert_eq!(image.txns["t"], m);
        assert_eq!(image.coordinator_epoch, 0);
        let (_log, again) = TxnLog::open(dir.path(), false).expect("reopen compacted");
        assert_eq!(again, image);
    }
}
