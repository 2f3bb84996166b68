//! The group offsets file: an append-only sequence of checksummed records.
//!
//! Each record is framed as `len: u32 LE | crc32c(payload): u32 LE | payload`. The payload is
//! one [`LogRecord`] (a kind byte, then its fields; strings are `u32 LE length | UTF-8`,
//! integers little-endian). Reading goes through [`crate::framed_log`]: a torn tail (what a
//! crash in the middle of an append leaves) is cut; an invalid frame followed by a valid one is
//! corruption and refuses the open unless repair was asked for. On open the store rewrites the
//! file as a snapshot of the live state (temp file, fsync, rename), which keeps it compact.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::offsets::{CommittedOffset, TopicPartition};
use super::{GroupError, Result};
use crate::framed_log::{Appender, ByteOrder, Framing, ScanError};

const KIND_COMMIT: u8 = 1;
const KIND_STAGE: u8 = 2;
const KIND_COMPLETE: u8 = 3;
const KIND_GENERATION: u8 = 4;
const KIND_DELETE_TOPIC: u8 = 5;

/// The frame layout of the offsets file (little endian header, payloads up to 256 MiB).
const FRAMING: Framing = Framing {
    order: ByteOrder::Little,
    max_payload: 256 * 1024 * 1024,
    kind: "group_offsets",
};

/// One record of the offsets file.
#[derive(Debug, Clone, PartialEq)]
pub enum LogRecord {
    /// Offsets committed by OffsetCommit (or a snapshot entry).
    Commit {
        /// Group id.
        group: String,
        /// The committed offsets.
        offsets: Vec<(TopicPartition, CommittedOffset)>,
    },
    /// Transactional offsets staged by TxnOffsetCommit, pending until the marker.
    Stage {
        /// Group id.
        group: String,
        /// The transaction's producer id.
        producer_id: i64,
        /// The pending offsets.
        offsets: Vec<(TopicPartition, CommittedOffset)>,
    },
    /// The transaction marker: pending offsets of `producer_id` applied or dropped.
    Complete {
        /// Group id.
        group: String,
        /// The transaction's producer id.
        producer_id: i64,
        /// Commit (true) or abort.
        commit: bool,
    },
    /// A topic was deleted: every group's committed offsets for it are dropped.
    DeleteTopic {
        /// Topic name.
        topic: String,
    },
    /// A group reached a new generation.
    Generation {
        /// Group id.
        group: String,
        /// The generation.
        generation: i32,
        /// The group's protocol type.
        protocol_type: String,
    },
}

impl LogRecord {
    /// Encodes the record as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(64);
        match self {
            LogRecord::Commit { group, offsets } => {
                payload.push(KIND_COMMIT);
                put_str(&mut payload, group);
                put_offsets(&mut payload, offsets);
            }
            LogRecord::Stage {
                group,
                producer_id,
                offsets,
            } => {
                payload.push(KIND_STAGE);
                put_str(&mut payload, group);
                payload.extend_from_slice(&producer_id.to_le_bytes());
                put_offsets(&mut payload, offsets);
            }
            LogRecord::Complete {
                group,
                producer_id,
                commit,
            } => {
                payload.push(KIND_COMPLETE);
                put_str(&mut payload, group);
                payload.extend_from_slice(&producer_id.to_le_bytes());
                payload.push(u8::from(*commit));
            }
            LogRecord::DeleteTopic { topic } => {
                payload.push(KIND_DELETE_TOPIC);
                put_str(&mut payload, topic);
            }
            LogRecord::Generation {
                group,
                generation,
                protocol_type,
            } => {
                payload.push(KIND_GENERATION);
                put_str(&mut payload, group);
                payload.extend_from_slice(&generation.to_le_bytes());
                put_str(&mut payload, protocol_type);
            }
        }
        FRAMING.frame(&payload)
    }

    /// Decodes one payload (without the frame).
    pub fn decode(payload: &[u8]) -> std::result::Result<Self, String> {
        let mut r = Reader { buf: payload };
        let kind = r.u8()?;
        let record = match kind {
            KIND_COMMIT => LogRecord::Commit {
                group: r.string()?,
                offsets: r.offsets()?,
            },
            KIND_STAGE => LogRecord::Stage {
                group: r.string()?,
                producer_id: r.i64()?,
                offsets: r.offsets()?,
            },
            KIND_COMPLETE => LogRecord::Complete {
                group: r.string()?,
                producer_id: r.i64()?,
                commit: r.u8()? != 0,
            },
            KIND_DELETE_TOPIC => LogRecord::DeleteTopic { topic: r.string()? },
            KIND_GENERATION => LogRecord::Generation {
                group: r.string()?,
                generation: r.i32()?,
                protocol_type: r.string()?,
            },
            other => return Err(format!("unknown record kind {other}")),
        };
        if !r.buf.is_empty() {
            return Err(format!("{} trailing bytes", r.buf.len()));
        }
        Ok(record)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

fn put_offsets(out: &mut Vec<u8>, offsets: &[(TopicPartition, CommittedOffset)]) {
    let n = u32::try_from(offsets.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&n.to_le_bytes());
    for (tp, committed) in offsets.iter().take(n as usize) {
        put_str(out, &tp.topic);
        out.extend_from_slice(&tp.partition.to_le_bytes());
        out.extend_from_slice(&committed.offset.to_le_bytes());
        out.extend_from_slice(&committed.leader_epoch.to_le_bytes());
        put_str(out, &committed.metadata);
        out.extend_from_slice(&committed.commit_timestamp_ms.to_le_bytes());
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "truncated: wanted {n} bytes, {} left",
                self.buf.len()
            ));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn i32(&mut self) -> std::result::Result<i32, String> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> std::result::Result<i64, String> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("invalid UTF-8: {e}"))
    }

    fn offsets(&mut self) -> std::result::Result<Vec<(TopicPartition, CommittedOffset)>, String> {
        let n = self.u32()? as usize;
        // Each entry is at least 32 bytes: bound the allocation by what the buffer can hold.
        let mut out = Vec::with_capacity(n.min(self.buf.len() / 32));
        for _ in 0..n {
            let topic = self.string()?;
            let partition = self.i32()?;
            let offset = self.i64()?;
            let leader_epoch = self.i32()?;
            let metadata = self.string()?;
            let commit_timestamp_ms = self.i64()?;
            out.push((
                TopicPartition { topic, partition },
                CommittedOffset {
                    offset,
                    leader_epoch,
                    metadata,
                    commit_timestamp_ms,
                },
            ));
        }
        Ok(out)
    }
}

/// The open offsets file, positioned for appends.
#[derive(Debug)]
pub struct OffsetsLog {
    path: PathBuf,
    file: Appender,
    fsync_every_write: bool,
}

impl OffsetsLog {
    /// The file's name inside its directory.
    pub const FILE_NAME: &'static str = "offsets.log";

    /// Reads every intact record of `dir/offsets.log` (creating the directory if needed).
    /// A torn tail is left out (the caller's rewrite drops it). Damage followed by valid
    /// records is [`GroupError::CorruptLog`] unless `repair`, which skips the damaged bytes
    /// and reports them. Returns the records in file order.
    pub fn replay(dir: &Path, repair: bool) -> Result<Vec<LogRecord>> {
        std::fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
        let path = dir.join(Self::FILE_NAME);
        let mut data = Vec::new();
        match File::open(&path) {
            Ok(mut file) => {
                file.read_to_end(&mut data)
                    .map_err(|source| io_err(&path, source))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(io_err(&path, source)),
        }
        let scan = FRAMING
            .scan(&path, &data, repair, LogRecord::decode)
            .map_err(|e| match e {
                ScanError::Corrupt(c) => GroupError::CorruptLog(c),
                ScanError::Undecodable(u) => GroupError::Corrupt {
                    path: path.clone(),
                    position: u.position,
                    reason: u.reason,
                },
            })?;
        FRAMING.report(&path, &scan);
        Ok(scan.records)
    }

    /// Atomically replaces `dir/offsets.log` with `records` (temp file, fsync, rename, fsync of
    /// the directory) and opens it for appends.
    pub fn rewrite(dir: &Path, records: &[LogRecord], fsync_every_write: bool) -> Result<Self> {
        let path = dir.join(Self::FILE_NAME);
        let tmp = dir.join("offsets.log.tmp");
        let mut bytes = Vec::new();
        for record in records {
            bytes.extend_from_slice(&record.encode());
        }
        {
            let mut file = File::create(&tmp).map_err(|source| io_err(&tmp, source))?;
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(|source| io_err(&tmp, source))?;
        }
        std::fs::rename(&tmp, &path).map_err(|source| io_err(&path, source))?;
        if let Ok(d) = File::open(dir) {
            // Directory fsync makes the rename durable; not every platform supports it.
            let _ = d.sync_all();
        }
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|source| io_err(&path, source))?;
        let len = file
            .seek(SeekFrom::End(0))
            .map_err(|source| io_err(&path, source))?;
        Ok(Self {
            path,
            file: Appender::new(file, len),
            fsync_every_write,
        })
    }

    /// Appends one record; with `fsync_every_write` it is on disk when this returns, otherwise
    /// it is in the OS page cache (which survives a kill -9 of the broker).
    pub fn append(&mut self, record: &LogRecord) -> Result<()> {
        self.append_with(record, self.fsync_every_write)
    }

    /// Appends one record, fsyncing it only if `sync`. A failed write is cut back off the
    /// file; after a failed fsync the file is offline: every later append and sync fails
    /// until a restart.
    pub fn append_with(&mut self, record: &LogRecord, sync: bool) -> Result<()> {
        self.file
            .append(&record.encode(), sync)
            .map_err(|source| io_err(&self.path, source))
    }

    /// Forces appended records to disk; a failure takes the file offline.
    pub fn sync(&mut self) -> Result<()> {
        self.file
            .sync()
            .map_err(|source| io_err(&self.path, source))
    }

    /// The file's current size in bytes.
    pub fn len(&self) -> u64 {
        self.file.len()
    }

    /// Whether the file holds no records.
    pub fn is_empty(&self) -> bool {
        self.file.is_empty()
    }

    /// The directory holding the file.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }
}

fn io_err(path: &Path, source: std::io::Error) -> GroupError {
    GroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::framed_log::faulty::{Faults, FaultyFile};

    fn sample_offsets() -> Vec<(TopicPartition, CommittedOffset)> {
        vec![(
            TopicPartition {
                topic: "t".into(),
                partition: 3,
            },
            CommittedOffset {
                offset: 42,
                leader_epoch: -1,
                metadata: "m".into(),
                commit_timestamp_ms: 7,
            },
        )]
    }

    #[test]
    fn records_round_trip() {
        let records = vec![
            LogRecord::Commit {
                group: "g".into(),
                offsets: sample_offsets(),
            },
            LogRecord::Stage {
                group: "g".into(),
                producer_id: 9,
                offsets: sample_offsets(),
            },
            LogRecord::Complete {
                group: "g".into(),
                producer_id: 9,
                commit: true,
            },
            LogRecord::Generation {
                group: "g".into(),
                generation: 4,
                protocol_type: "consumer".into(),
            },
            LogRecord::DeleteTopic { topic: "t".into() },
        ];
        for record in records {
            let frame = record.encode();
            assert_eq!(LogRecord::decode(&frame[8..]).unwrap(), record);
        }
    }

    #[test]
    fn garbage_payload_is_an_error_not_a_panic() {
        assert!(LogRecord::decode(&[]).is_err());
        assert!(LogRecord::decode(&[KIND_COMMIT, 255, 255, 255, 255]).is_err());
        assert!(LogRecord::decode(&[KIND_COMMIT, 0, 0, 0, 0, 255, 255, 255, 255]).is_err());
        assert!(LogRecord::decode(&[77]).is_err());
    }

    /// An empty log in `dir` whose file fails as the returned [`Faults`] say.
    fn faulty_log(dir: &Path) -> (OffsetsLog, Arc<Faults>) {
        std::fs::create_dir_all(dir).unwrap();
        let mut log = OffsetsLog::rewrite(dir, &[], true).unwrap();
        let faults = Arc::new(Faults::default());
        let shared = Arc::clone(&faults);
        log.file.wrap_file(move |inner| {
            Box::new(FaultyFile {
                inner,
                faults: shared,
            })
        });
        (log, faults)
    }

    fn commit(group: &str) -> LogRecord {
        LogRecord::Commit {
            group: group.into(),
            offsets: sample_offsets(),
        }
    }

    #[test]
    fn an_append_after_a_failed_write_reads_back_at_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, faults) = faulty_log(dir.path());
        log.append(&commit("a")).unwrap();
        faults.torn_write.store(true, Ordering::SeqCst);
        assert!(log.append(&commit("b")).is_err(), "the torn write failed");
        faults.torn_write.store(false, Ordering::SeqCst);
        log.append(&commit("c")).unwrap();
        drop(log);
        let records = OffsetsLog::replay(dir.path(), false)
            .expect("replay: the failed write left no partial frame before c");
        assert_eq!(records, vec![commit("a"), commit("c")]);
    }

    #[test]
    fn after_a_failed_fsync_the_log_takes_no_appends() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, faults) = faulty_log(dir.path());
        log.append(&commit("a")).unwrap();
        // a write without fsync, then the fsync that should cover it fails
        log.append_with(&commit("b"), false).unwrap();
        faults.sync.store(true, Ordering::SeqCst);
        assert!(log.sync().is_err());
        faults.sync.store(false, Ordering::SeqCst);
        let refused = log.append(&commit("c")).unwrap_err();
        assert!(refused.to_string().contains("offline"), "{refused}");
        assert!(log.sync().is_err());
        // and a failed fsync of an append of its own
        let (mut log, faults) = faulty_log(&dir.path().join("second"));
        log.append(&commit("a")).unwrap();
        faults.sync.store(true, Ordering::SeqCst);
        assert!(log.append(&commit("b")).is_err());
        faults.sync.store(false, Ordering::SeqCst);
        assert!(log.append(&commit("c")).is_err());
        drop(log);
        let records = OffsetsLog::replay(&dir.path().join("second"), false).unwrap();
        assert_eq!(
            records,
            vec![commit("a")],
            "the failed record was cut back off"
        );
    }

    #[test]
    fn torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = LogRecord::Commit {
            group: "g".into(),
            offsets: sample_offsets(),
        };
        let mut log = OffsetsLog::rewrite(dir.path(), &[], true).unwrap();
        log.append(&a).unwrap();
        log.append(&a).unwrap();
        drop(log);
        let path = dir.path().join(OffsetsLog::FILE_NAME);
        let len = std::fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 3).unwrap();
        let records = OffsetsLog::replay(dir.path(), false).unwrap();
        assert_eq!(records, vec![a]);
    }
}
