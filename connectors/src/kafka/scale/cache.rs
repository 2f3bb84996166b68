//! The local cache of a scaled-out instance's changelogs (`docs/SCALE-OUT.md`, "Cache"): one
//! file per changelog partition (task) in the instance's checkpoint directory, holding the
//! task's keyed state as changelog records (record key, value) and the changelog offset from
//! which the rest of the partition must be read. A restart on the same machine restores a task
//! from its file and reads only the partition's tail, instead of the whole partition.
//!
//! The changelog stays the truth; the cache only saves reading it. What makes a file usable:
//!
//! - Its records are the task's state folded over everything the partition held below some
//!   offset, and its *position* is at most the offset of the first record it does not
//!   contain. Reading the partition from the position and applying every record over the
//!   file's state gives the partition's whole fold: a record read again is the same change
//!   applied in the same order, so the last change of each key still wins.
//! - A file is written from a restore's fold (position: where the restore's read ended) and
//!   then appended with the changelog records of each transaction of the instance once that
//!   transaction committed. A *mark* frame after them records the position. The position
//!   moves to the partition's high watermark every [`ChangelogCache::advance_every`]: read
//!   right after a commit, before the next transaction writes a changelog record, that is
//!   exactly the end of what the file holds. Between two advances the position stays where
//!   it was, which is still a valid (if earlier) position for the larger state.
//! - Frames carry a CRC-32C. A file is read up to its last intact mark: records after it (a
//!   write cut short by a crash) and anything after a damaged frame are ignored, and the
//!   partition is read from that mark's position. A file whose position lies outside the
//!   partition's offsets (the topic was deleted and created again) is ignored.
//! - An append that fails stops the appends to that file for the rest of the dataflow: a
//!   later mark could otherwise move the position past records the file lacks.
//! - Appends repeat every change of every key, so a file is folded and rewritten once its
//!   appends pass 64 MiB and twice its size at the last rewrite.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::changelog::ChangelogRecord;

/// Counter: changelog records a restore took from the local cache, label `task`.
pub const RESTORE_CACHED_RECORDS: &str = "onceflow_scale_restore_cached_records_total";

const MAGIC: &[u8; 5] = b"OFCC1";
const RECORD: u8 = 1;
const MARK: u8 = 2;
/// Kind, payload length, CRC-32C of kind and payload.
const FRAME_HEADER: usize = 1 + 4 + 4;

/// The state of one task as its cache file holds it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CachedTask {
    /// Changelog record key to value, for every live key.
    pub entries: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The changelog offset from which the partition must be read over `entries`.
    pub position: i64,
}

struct TaskFile {
    file: File,
    position: i64,
    /// Bytes the file had when it was last rewritten, and bytes appended since.
    rewritten: u64,
    appended: u64,
}

/// A file is compacted (folded and rewritten) once its appends pass this many bytes and
/// twice its size at the last rewrite: the appends repeat every change of every key, so
/// without it the file of a long run grows with all the changes ever made.
const COMPACT_AFTER: u64 = 64 << 20;

struct Inner {
    /// Files this dataflow restored and appends to, by (topic, partition).
    open: BTreeMap<(String, i32), TaskFile>,
    last_advance: Option<Instant>,
}

/// The changelog cache of one instance in one directory (see the module documentation).
pub struct ChangelogCache {
    dir: PathBuf,
    advance_every: Duration,
    inner: Mutex<Inner>,
}

impl ChangelogCache {
    /// The cache in `dir` (created if missing). Positions move at most every 5 s.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(ChangelogCache {
            dir,
            advance_every: Duration::from_secs(5),
            inner: Mutex::new(Inner {
                open: BTreeMap::new(),
                last_advance: None,
            }),
        })
    }

    /// How often the positions move to the partitions' high watermarks (a query per written
    /// partition in the commit path); `Duration::ZERO`: at every commit. A longer interval
    /// costs a restart a longer tail to read.
    pub fn advance_every(mut self, every: Duration) -> Self {
        self.advance_every = every;
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, topic: &str, partition: i32) -> PathBuf {
        self.dir.join(format!("{topic}-{partition}.cache"))
    }

    /// The cached state of `topic`'s partition `partition`, if its file has an intact mark.
    /// A missing file is `None`; a damaged one is `None` with a log line saying why.
    pub fn load(&self, topic: &str, partition: i32) -> Option<CachedTask> {
        let path = self.path(topic, partition);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the changelog cache; restoring from the changelog");
                return None;
            }
        };
        match parse(&bytes) {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                tracing::info!(path = %path.display(), "changelog cache has no complete mark; restoring from the changelog");
                None
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), %why, "changelog cache ignored; restoring from the changelog");
                None
            }
        }
    }

    /// Replaces the file of `topic`'s partition `partition` by `entries` and `position` (a
    /// restore's fold and where its read ended), and appends to it the records of every
    /// commit that follows. Written to a temporary file and renamed over the old one.
    pub fn rewrite<'a>(
        &self,
        topic: &str,
        partition: i32,
        entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        position: i64,
    ) -> std::io::Result<()> {
        let path = self.path(topic, partition);
        let tmp = path.with_extension("cache.tmp");
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.extend_from_slice(MAGIC);
        let mut file = File::create(&tmp)?;
        for (k, v) in entries {
            push_record(&mut buf, k, Some(v));
            if buf.len() >= 1 << 20 {
                file.write_all(&buf)?;
                buf.clear();
            }
        }
        push_mark(&mut buf, position);
        file.write_all(&buf)?;
        drop(file);
        std::fs::rename(&tmp, &path)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        let rewritten = file.metadata()?.len();
        self.inner.lock().open.insert(
            (topic.to_string(), partition),
            TaskFile {
                file,
                position,
                rewritten,
                appended: 0,
            },
        );
        Ok(())
    }

    /// Folds the file of `topic`'s partition `partition` and writes it again: its records up
    /// to its last intact mark, at that mark's position.
    fn compact(&self, topic: &str, partition: i32) -> std::io::Result<()> {
        let bytes = std::fs::read(self.path(topic, partition))?;
        let task = parse(&bytes)
            .map_err(std::io::Error::other)?
            .ok_or_else(|| std::io::Error::other("no intact mark"))?;
        self.rewrite(
            topic,
            partition,
            task.entries
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice())),
            task.position,
        )
    }

    /// The changelog records of a transaction that committed, in the order they were sent:
    /// appended to their tasks' files (files this dataflow did not restore are left alone),
    /// each followed by a mark. When [`ChangelogCache::advance_every`] has passed, the marks
    /// carry the partitions' high watermarks (`high_watermark(topic, partition)`); call this
    /// before the next transaction writes a changelog record.
    pub fn committed(
        &self,
        records: &[ChangelogRecord],
        high_watermark: &dyn Fn(&str, i32) -> Result<i64, String>,
    ) {
        let mut inner = self.inner.lock();
        // grouped by partition first, so the owned key of `open` is built once per partition
        let mut grouped: BTreeMap<(&str, i32), Vec<u8>> = BTreeMap::new();
        for r in records {
            let buf = grouped.entry((r.topic.as_str(), r.partition)).or_default();
            push_record(buf, &r.key, r.value.as_deref());
        }
        let frames: Vec<((String, i32), Vec<u8>)> = grouped
            .into_iter()
            .map(|((topic, partition), buf)| ((topic.to_string(), partition), buf))
            .filter(|(key, _)| inner.open.contains_key(key))
            .collect();
        if frames.is_empty() {
            return;
        }
        let advance = inner
            .last_advance
            .is_none_or(|t| t.elapsed() >= self.advance_every);
        if advance {
            inner.last_advance = Some(Instant::now());
        }
        let mut failed = Vec::new();
        let mut compact = Vec::new();
        for (key, mut buf) in frames {
            let Some(task) = inner.open.get_mut(&key) else {
                continue;
            };
            if advance {
                match high_watermark(&key.0, key.1) {
                    Ok(h) if h >= task.position => {
                        task.position = h;
                    }
                    Ok(h) => {
                        tracing::warn!(topic = %key.0, partition = key.1, high = h, position = task.position, "changelog high watermark below the cache position; keeping the position")
                    }
                    Err(e) => {
                        tracing::debug!(topic = %key.0, partition = key.1, error = %e, "changelog high watermark not read; the cache position stays")
                    }
                }
            }
            push_mark(&mut buf, task.position);
            if let Err(e) = task.file.write_all(&buf) {
                tracing::warn!(topic = %key.0, partition = key.1, error = %e, "appending to the changelog cache failed; the file stays at its last mark");
                failed.push(key);
                continue;
            }
            task.appended += buf.len() as u64;
            if task.appended >= COMPACT_AFTER.max(2 * task.rewritten) {
                compact.push(key);
            }
        }
        for key in failed {
            inner.open.remove(&key);
        }
        drop(inner);
        for (topic, partition) in compact {
            let started = Instant::now();
            if let Err(e) = self.compact(&topic, partition) {
                // the file stays as it is, appended to: still exact, only larger
                tracing::warn!(%topic, partition, error = %e, "compacting the changelog cache failed");
            } else {
                tracing::debug!(%topic, partition, seconds = started.elapsed().as_secs_f64(), "changelog cache compacted");
            }
        }
    }
}

fn push_frame(buf: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, payload);
    buf.push(kind);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(payload);
}

fn push_record(buf: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>) {
    let mut payload = Vec::with_capacity(5 + key.len() + value.map_or(0, <[u8]>::len));
    payload.extend_from_slice(&(key.len() as u32).to_le_bytes());
    payload.extend_from_slice(key);
    match value {
        Some(v) => {
            payload.push(1);
            payload.extend_from_slice(v);
        }
        None => payload.push(0),
    }
    push_frame(buf, RECORD, &payload);
}

fn push_mark(buf: &mut Vec<u8>, position: i64) {
    push_frame(buf, MARK, &position.to_le_bytes());
}

/// Folds a cache file up to its last intact mark: `Ok(None)` without one, `Err` when the
/// file is not a cache file. A damaged or cut frame ends the file.
fn parse(bytes: &[u8]) -> Result<Option<CachedTask>, String> {
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err("not a changelog cache file (magic)".into());
    };
    let mut done: Option<CachedTask> = None;
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut pending: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
    while rest.len() >= FRAME_HEADER {
        let kind = rest[0];
        let len = u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let crc = u32::from_le_bytes([rest[5], rest[6], rest[7], rest[8]]);
        let Some(payload) = rest.get(FRAME_HEADER..FRAME_HEADER + len) else {
            break;
        };
        if crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload) != crc {
            tracing::warn!(
                at = bytes.len() - rest.len(),
                "damaged frame in a changelog cache file; using it up to the mark before"
            );
            break;
        }
        rest = &rest[FRAME_HEADER + len..];
        match kind {
            RECORD => {
                let Some(record) = parse_record(payload) else {
                    break;
                };
                pending.push(record);
            }
            MARK => {
                let Ok(position) = <[u8; 8]>::try_from(payload) else {
                    break;
                };
                for (k, v) in pending.drain(..) {
                    match v {
                        Some(v) => entries.insert(k.to_vec(), v.to_vec()),
                        None => entries.remove(k),
                    };
                }
                done = Some(CachedTask {
                    entries: BTreeMap::new(),
                    position: i64::from_le_bytes(position),
                });
            }
            _ => break,
        }
    }
    Ok(done.map(|mut t| {
        t.entries = entries;
        t
    }))
}

fn parse_record(payload: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let key_len = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
    let key = payload.get(4..4 + key_len)?;
    let rest = payload.get(4 + key_len..)?;
    match rest.first()? {
        1 => Some((key, Some(&rest[1..]))),
        0 if rest.len() == 1 => Some((key, None)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(topic: &str, partition: i32, key: &str, value: Option<&str>) -> ChangelogRecord {
        ChangelogRecord {
            topic: topic.into(),
            partition,
            key: key.as_bytes().to_vec(),
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    /// A cache in `dir` moving its positions at every commit, with an empty file for
    /// partition 0 of topic `t` at `position`.
    fn cache_with_file(dir: &Path, position: i64) -> ChangelogCache {
        let cache = ChangelogCache::open(dir)
            .unwrap()
            .advance_every(Duration::ZERO);
        cache.rewrite("t", 0, std::iter::empty(), position).unwrap();
        cache
    }

    fn entries(pairs: &[(&str, &str)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_rewritten_file_folds_the_commits_appended_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ChangelogCache::open(dir.path())
            .unwrap()
            .advance_every(Duration::ZERO);
        let base = entries(&[("a", "1"), ("b", "2")]);
        cache
            .rewrite(
                "t",
                3,
                base.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
                10,
            )
            .unwrap();
        assert_eq!(
            cache.load("t", 3),
            Some(CachedTask {
                entries: base,
                position: 10
            })
        );
        cache.committed(
            &[
                rec("t", 3, "a", Some("5")),
                rec("t", 3, "b", None),
                rec("t", 3, "c", Some("7")),
                // a partition this dataflow did not restore: no file
                rec("t", 4, "z", Some("1")),
            ],
            &|_, _| Ok(17),
        );
        assert_eq!(
            cache.load("t", 3),
            Some(CachedTask {
                entries: entries(&[("a", "5"), ("c", "7")]),
                position: 17
            })
        );
        assert_eq!(cache.load("t", 4), None);
    }

    #[test]
    fn the_position_stays_until_it_is_due_or_when_the_watermark_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ChangelogCache::open(dir.path())
            .unwrap()
            .advance_every(Duration::from_secs(3600));
        cache.rewrite("t", 0, std::iter::empty(), 4).unwrap();
        // the first commit moves it, the next ones within the interval do not
        cache.committed(&[rec("t", 0, "a", Some("1"))], &|_, _| Ok(9));
        assert_eq!(cache.load("t", 0).unwrap().position, 9);
        cache.committed(&[rec("t", 0, "a", Some("2"))], &|_, _| Ok(12));
        let t = cache.load("t", 0).unwrap();
        assert_eq!((t.position, t.entries), (9, entries(&[("a", "2")])));

        let cache = ChangelogCache::open(dir.path()).unwrap();
        cache.rewrite("t", 1, std::iter::empty(), 4).unwrap();
        cache.committed(&[rec("t", 1, "a", Some("1"))], &|_, _| {
            Err("no leader".into())
        });
        assert_eq!(cache.load("t", 1).unwrap().position, 4);
    }

    #[test]
    fn records_after_the_last_intact_mark_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_with_file(dir.path(), 0);
        cache.committed(&[rec("t", 0, "a", Some("1"))], &|_, _| Ok(2));
        let path = dir.path().join("t-0.cache");
        let good = std::fs::read(&path).unwrap();
        cache.committed(&[rec("t", 0, "a", Some("2"))], &|_, _| Ok(4));
        let full = std::fs::read(&path).unwrap();
        let expect_first = Some(CachedTask {
            entries: entries(&[("a", "1")]),
            position: 2,
        });

        // every cut of the second commit's frames falls back to the first mark
        for cut in good.len()..full.len() {
            assert_eq!(parse(&full[..cut]).unwrap(), expect_first, "cut at {cut}");
        }
        // a flipped byte in the second commit's frames: the same
        for at in good.len()..full.len() {
            let mut bad = full.clone();
            bad[at] ^= 0x40;
            assert_eq!(parse(&bad).unwrap(), expect_first, "flip at {at}");
        }
        // a damaged first frame: nothing usable; not a cache file at all: an error
        let mut bad = full.clone();
        bad[MAGIC.len() + FRAME_HEADER] ^= 1;
        assert_eq!(parse(&bad).unwrap(), None);
        assert!(parse(b"garbage").is_err());
        assert_eq!(parse(&full).unwrap().unwrap().position, 4);
    }

    #[test]
    fn a_file_is_compacted_once_its_appends_pass_twice_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_with_file(dir.path(), 0);
        let path = dir.path().join("t-0.cache");
        // one key changed again and again: 1 KiB values, 100 commits of 1000 changes
        let value = "v".repeat(1024);
        let mut high = 0;
        let mut largest = 0;
        for commit in 0..100 {
            let records: Vec<ChangelogRecord> = (0..1000)
                .map(|i| {
                    rec(
                        "t",
                        0,
                        &format!("k{}", i % 10),
                        Some(&format!("{commit}{value}")),
                    )
                })
                .collect();
            high += 1000;
            cache.committed(&records, &|_, _| Ok(high));
            largest = largest.max(std::fs::metadata(&path).unwrap().len());
        }
        // 100 MB of appends; the file never holds much more than the compaction threshold
        assert!(largest < COMPACT_AFTER + (2 << 20), "{largest} bytes");
        let t = cache.load("t", 0).unwrap();
        assert_eq!(t.position, high);
        assert_eq!(t.entries.len(), 10);
        assert!(t.entries.values().all(|v| v.starts_with(b"99v")));
    }

    #[test]
    fn a_failed_append_stops_the_appends_to_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_with_file(dir.path(), 0);
        // replace the open file by a read-only handle: the next append fails
        let path = dir.path().join("t-0.cache");
        cache
            .inner
            .lock()
            .open
            .get_mut(&("t".to_string(), 0))
            .unwrap()
            .file = File::open(&path).unwrap();
        cache.committed(&[rec("t", 0, "a", Some("1"))], &|_, _| Ok(5));
        assert!(cache.inner.lock().open.is_empty());
        assert_eq!(cache.load("t", 0).unwrap().position, 0);
    }
}
