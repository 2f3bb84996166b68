//! The group offsets store: committed offsets per group and partition, transactional offsets
//! pending until their transaction ends, and the last generation of each group.
//!
//! With a data directory every change is appended to [`OffsetsLog`] before it is applied in
//! memory (and so before the client is answered); opening replays the file and rewrites it as
//! a compact snapshot. Without one the store lives in memory only.
//!
//! Transactional offsets (TxnOffsetCommit) are staged per (group, producer id) with
//! [`OffsetStore::stage_txn_offsets`] and applied or dropped by
//! [`OffsetStore::complete_txn`] when the transaction coordinator writes the marker. A
//! staged offset only overwrites a committed one that was written before it (Kafka compares
//! log positions the same way).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::offsets_log::{LogRecord, OffsetsLog};
use super::{GroupError, Result};

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// Builds a topic partition.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

/// A committed offset with its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The next offset to consume.
    pub offset: i64,
    /// Leader epoch the client saw (-1 if unknown).
    pub leader_epoch: i32,
    /// Client-supplied metadata string.
    pub metadata: String,
    /// When the commit was made (ms since the Unix epoch).
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    value: CommittedOffset,
    /// Position in the sequence of changes (replaces Kafka's log offset for ordering).
    seq: u64,
}

type PartitionOffsets = BTreeMap<TopicPartition, Entry>;

#[derive(Debug, Default)]
struct Inner {
    committed: HashMap<String, PartitionOffsets>,
    /// group -> producer id -> pending offsets.
    pending: HashMap<String, HashMap<i64, PartitionOffsets>>,
    generations: HashMap<String, (i32, String)>,
    seq: u64,
    log: Option<OffsetsLog>,
    fsync_every_write: bool,
    /// Appended changes not yet fsynced.
    dirty: bool,
    closed: bool,
}

impl Inner {
    fn apply(&mut self, record: LogRecord) {
        self.seq += 1;
        let seq = self.seq;
        match record {
            LogRecord::Commit { group, offsets } => {
                let map = self.committed.entry(group).or_default();
                for (tp, value) in offsets {
                    map.insert(tp, Entry { value, seq });
                }
            }
            LogRecord::Stage {
                group,
                producer_id,
                offsets,
            } => {
                let map = self
                    .pending
                    .entry(group)
                    .or_default()
                    .entry(producer_id)
                    .or_default();
                for (tp, value) in offsets {
                    map.insert(tp, Entry { value, seq });
                }
            }
            LogRecord::Complete {
                group,
                producer_id,
                commit,
            } => {
                let Some(by_producer) = self.pending.get_mut(&group) else {
                    return;
                };
                let staged = by_producer.remove(&producer_id);
                if by_producer.is_empty() {
                    self.pending.remove(&group);
                }
                let Some(staged) = staged else {
                    return;
                };
                if commit {
                    let map = self.committed.entry(group).or_default();
                    for (tp, entry) in staged {
                        let newer = map.get(&tp).is_none_or(|existing| existing.seq < entry.seq);
                        if newer {
                            map.insert(tp, entry);
                        }
                    }
                }
            }
            LogRecord::DeleteTopic { topic } => {
                for map in self.committed.values_mut() {
                    map.retain(|tp, _| tp.topic != topic);
                }
                self.committed.retain(|_, map| !map.is_empty());
            }
            LogRecord::Generation {
                group,
                generation,
                protocol_type,
            } => {
                self.generations.insert(group, (generation, protocol_type));
            }
        }
    }

    /// The live state as records, in change order, for a snapshot.
    fn snapshot(&self) -> Vec<LogRecord> {
        let mut ordered: Vec<(u64, LogRecord)> = Vec::new();
        for (group, map) in &self.committed {
            for (tp, entry) in map {
                ordered.push((
                    entry.seq,
                    LogRecord::Commit {
                        group: group.clone(),
                        offsets: vec![(tp.clone(), entry.value.clone())],
                    },
                ));
            }
        }
        for (group, by_producer) in &self.pending {
            for (&producer_id, map) in by_producer {
                for (tp, entry) in map {
                    ordered.push((
                        entry.seq,
                        LogRecord::Stage {
                            group: group.clone(),
                            producer_id,
                            offsets: vec![(tp.clone(), entry.value.clone())],
                        },
                    ));
                }
            }
        }
        ordered.sort_by_key(|(seq, _)| *seq);
        let mut records: Vec<LogRecord> = self
            .generations
            .iter()
            .map(
                |(group, (generation, protocol_type))| LogRecord::Generation {
                    group: group.clone(),
                    generation: *generation,
                    protocol_type: protocol_type.clone(),
                },
            )
            .collect();
        records.extend(ordered.into_iter().map(|(_, r)| r));
        records
    }

    fn live_records(&self) -> usize {
        self.committed.values().map(BTreeMap::len).sum::<usize>()
            + self
                .pending
                .values()
                .flat_map(HashMap::values)
                .map(BTreeMap::len)
                .sum::<usize>()
            + self.generations.len()
    }
}

/// The group offsets store (cheap to clone; internally synchronized).
#[derive(Debug, Clone, Default)]
pub struct OffsetStore {
    inner: Arc<Mutex<Inner>>,
}

/// Rewrite the file once it holds this many bytes more than a fresh snapshot would need.
const COMPACT_SLACK_BYTES: u64 = 64 * 1024 * 1024;

impl OffsetStore {
    /// A store kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Opens (or creates) the store in `dir`: replays the offsets file and rewrites it as a
    /// snapshot. With `fsync_every_write` each change is fsynced before it is acknowledged.
    pub fn open(dir: &Path, fsync_every_write: bool) -> Result<Self> {
        Self::open_with_repair(dir, fsync_every_write, false)
    }

    /// [`OffsetStore::open`]; with `repair`, damage followed by valid records is dropped (and
    /// reported) instead of refusing the open.
    pub fn open_with_repair(dir: &Path, fsync_every_write: bool, repair: bool) -> Result<Self> {
        let records = OffsetsLog::replay(dir, repair)?;
        let replayed = records.len();
        let mut inner = Inner {
            fsync_every_write,
            ..Inner::default()
        };
        for record in records {
            inner.apply(record);
        }
        let snapshot = inner.snapshot();
        inner.log = Some(OffsetsLog::rewrite(dir, &snapshot, fsync_every_write)?);
        tracing::info!(dir = %dir.display(), replayed, live = snapshot.len(),
            groups = inner.committed.len(), "group offsets store opened");
        Ok(Self {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the store, so recover the guard.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Persists then applies one change.
    fn write(&self, record: LogRecord) -> Result<()> {
        self.write_with(record, true)
    }

    /// Persists then applies one change; `durable` = false skips the per-write fsync.
    fn write_with(&self, record: LogRecord, durable: bool) -> Result<()> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(GroupError::Closed);
        }
        let sync = durable && inner.fsync_every_write;
        if let Some(log) = inner.log.as_mut() {
            log.append_with(&record, sync)?;
            inner.dirty |= !sync;
        }
        inner.apply(record);
        self.maybe_compact(&mut inner)?;
        Ok(())
    }

    fn maybe_compact(&self, inner: &mut Inner) -> Result<()> {
        let Some(log) = inner.log.as_ref() else {
            return Ok(());
        };
        // A live record takes roughly 100 bytes; rewrite when the file is mostly dead records.
        let live_estimate = inner.live_records() as u64 * 128;
        if log.len() < COMPACT_SLACK_BYTES.saturating_add(live_estimate) {
            return Ok(());
        }
        let dir = log.dir().to_path_buf();
        let fsync = inner.fsync_every_write;
        let snapshot = inner.snapshot();
        inner.log = Some(OffsetsLog::rewrite(&dir, &snapshot, fsync)?);
        tracing::info!(dir = %dir.display(), live = snapshot.len(), "group offsets file compacted");
        Ok(())
    }

    /// Commits offsets for `group` (OffsetCommit): durable per the fsync setting on return.
    pub fn commit(
        &self,
        group: &str,
        offsets: Vec<(TopicPartition, CommittedOffset)>,
    ) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        self.write(LogRecord::Commit {
            group: group.to_owned(),
            offsets,
        })
    }

    /// The committed offset of `group` for a partition, if any.
    pub fn fetch(&self, group: &str, tp: &TopicPartition) -> Option<CommittedOffset> {
        self.lock()
            .committed
            .get(group)
            .and_then(|map| map.get(tp))
            .map(|e| e.value.clone())
    }

    /// Every committed offset of `group`, sorted by topic and partition.
    pub fn group_offsets(&self, group: &str) -> Vec<(TopicPartition, CommittedOffset)> {
        self.lock()
            .committed
            .get(group)
            .map(|map| {
                map.iter()
                    .map(|(tp, e)| (tp.clone(), e.value.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Groups that have committed offsets.
    pub fn groups_with_offsets(&self) -> Vec<String> {
        let mut groups: Vec<String> = self.lock().committed.keys().cloned().collect();
        groups.sort();
        groups
    }

    /// Stages transactional offsets (TxnOffsetCommit) of `producer_id` for `group`; they stay
    /// invisible to OffsetFetch until [`OffsetStore::complete_txn`] commits them. Staging the
    /// same partition again in one transaction replaces the earlier value.
    pub fn stage_txn_offsets(
        &self,
        group: &str,
        producer_id: i64,
        offsets: Vec<(TopicPartition, CommittedOffset)>,
    ) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        self.write(LogRecord::Stage {
            group: group.to_owned(),
            producer_id,
            offsets,
        })
    }

    /// Applies (`commit`) or drops the offsets `producer_id` staged for `group`: the group side
    /// of a transaction marker. Idempotent: returns false when nothing was pending (for
    /// example a marker written again during recovery).
    pub fn complete_txn(&self, group: &str, producer_id: i64, commit: bool) -> Result<bool> {
        let pending = self
            .lock()
            .pending
            .get(group)
            .is_some_and(|by_producer| by_producer.contains_key(&producer_id));
        if !pending {
            return Ok(false);
        }
        self.write(LogRecord::Complete {
            group: group.to_owned(),
            producer_id,
            commit,
        })?;
        Ok(true)
    }

    /// Whether any open transaction has staged an offset for this partition of `group`
    /// (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT then).
    pub fn has_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        let tp = TopicPartition::new(topic, partition);
        self.lock()
            .pending
            .get(group)
            .is_some_and(|by_producer| by_producer.values().any(|map| map.contains_key(&tp)))
    }

    /// Producer ids with offsets pending in `group`.
    pub fn pending_producers(&self, group: &str) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .lock()
            .pending
            .get(group)
            .map(|by_producer| by_producer.keys().copied().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// Records that `group` reached `generation` (so it survives a restart). Not fsynced on
    /// its own: it is a fencing aid, and reaches disk with the next durable write or sync.
    pub fn record_generation(
        &self,
        group: &str,
        generation: i32,
        protocol_type: &str,
    ) -> Result<()> {
        self.write_with(
            LogRecord::Generation {
                group: group.to_owned(),
                generation,
                protocol_type: protocol_type.to_owned(),
            },
            false,
        )
    }

    /// Last recorded generation and protocol type of every group.
    pub fn generations(&self) -> Vec<(String, i32, String)> {
        let mut out: Vec<(String, i32, String)> = self
            .lock()
            .generations
            .iter()
            .map(|(g, (gen, pt))| (g.clone(), *gen, pt.clone()))
            .collect();
        out.sort();
        out
    }

    /// Drops every group's committed offsets for `topic` (the topic was deleted, as Kafka's
    /// coordinator does), so a topic recreated under the same name starts without them.
    /// Pending transactional offsets are left to their transaction's marker.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        let present = self
            .lock()
            .committed
            .values()
            .any(|map| map.keys().any(|tp| tp.topic == topic));
        if !present {
            return Ok(());
        }
        self.write(LogRecord::DeleteTopic {
            topic: topic.to_owned(),
        })
    }

    /// Every (group, producer id) with transactional offsets still pending, sorted: what the
    /// transaction coordinator must resolve with [`OffsetStore::complete_txn`] after recovery.
    pub fn pending_transactions(&self) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = self
            .lock()
            .pending
            .iter()
            .flat_map(|(group, by_producer)| by_producer.keys().map(|id| (group.clone(), *id)))
            .collect();
        out.sort();
        out
    }

    /// Forces every appended change to disk.
    pub fn sync(&self) -> Result<()> {
        let mut inner = self.lock();
        inner.dirty = false;
        match inner.log.as_mut() {
            Some(log) => log.sync(),
            None => Ok(()),
        }
    }

    /// Forces appended changes to disk if some were written without fsync (the coordinator's
    /// timer calls this about once a second).
    pub fn sync_if_dirty(&self) -> Result<()> {
        if !self.lock().dirty {
            return Ok(());
        }
        self.sync()
    }

    /// Syncs and refuses further changes (broker shutdown).
    pub fn close(&self) -> Result<()> {
        let mut inner = self.lock();
        inner.closed = true;
        match inner.log.as_mut() {
            Some(log) => log.sync(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn off(offset: i64) -> CommittedOffset {
        CommittedOffset {
            offset,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms: 0,
        }
    }

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("t", partition)
    }

    #[test]
    fn commit_then_fetch() {
        let store = OffsetStore::in_memory();
        store
            .commit("g", vec![(tp(0), off(5)), (tp(1), off(7))])
            .unwrap();
        assert_eq!(store.fetch("g", &tp(0)).unwrap().offset, 5);
        assert_eq!(store.fetch("g", &tp(1)).unwrap().offset, 7);
        assert!(store.fetch("other", &tp(0)).is_none());
        assert_eq!(store.group_offsets("g").len(), 2);
    }

    #[test]
    fn txn_offsets_apply_on_commit_only() {
        let store = OffsetStore::in_memory();
        store.commit("g", vec![(tp(0), off(1))]).unwrap();
        store
            .stage_txn_offsets("g", 10, vec![(tp(0), off(50))])
            .unwrap();
        assert!(store.has_pending("g", "t", 0));
        assert!(!store.has_pending("g", "t", 1));
        assert!(!store.has_pending("h", "t", 0));
        assert_eq!(
            store.fetch("g", &tp(0)).unwrap().offset,
            1,
            "pending offsets are invisible"
        );
        assert!(store.complete_txn("g", 10, true).unwrap());
        assert!(!store.has_pending("g", "t", 0));
        assert_eq!(store.fetch("g", &tp(0)).unwrap().offset, 50);
        assert!(
            !store.complete_txn("g", 10, true).unwrap(),
            "a repeated marker is a no-op"
        );
    }

    #[test]
    fn txn_offsets_dropped_on_abort() {
        let store = OffsetStore::in_memory();
        store
            .stage_txn_offsets("g", 10, vec![(tp(0), off(50))])
            .unwrap();
        store
            .stage_txn_offsets("g", 11, vec![(tp(1), off(60))])
            .unwrap();
        assert!(store.complete_txn("g", 10, false).unwrap());
        assert!(store.fetch("g", &tp(0)).is_none());
        assert!(
            store.has_pending("g", "t", 1),
            "another producer's offsets stay pending"
        );
        assert_eq!(store.pending_producers("g"), vec![11]);
    }

    #[test]
    fn later_plain_commit_wins_over_earlier_staged_offset() {
        let store = OffsetStore::in_memory();
        store
            .stage_txn_offsets("g", 10, vec![(tp(0), off(50))])
            .unwrap();
        store.commit("g", vec![(tp(0), off(70))]).unwrap();
        store.complete_txn("g", 10, true).unwrap();
        assert_eq!(store.fetch("g", &tp(0)).unwrap().offset, 70);
    }

    #[test]
    fn state_survives_reopen_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = OffsetStore::open(dir.path(), true).unwrap();
            for i in 0..100 {
                store.commit("g", vec![(tp(0), off(i))]).unwrap();
            }
            store
                .stage_txn_offsets("g", 3, vec![(tp(1), off(9))])
                .unwrap();
            store
                .stage_txn_offsets("g", 4, vec![(tp(2), off(11))])
                .unwrap();
            store.complete_txn("g", 4, true).unwrap();
            store.record_generation("g", 7, "consumer").unwrap();
        }
        let size_before = std::fs::metadata(dir.path().join(OffsetsLog::FILE_NAME))
            .unwrap()
            .len();
        let store = OffsetStore::open(dir.path(), true).unwrap();
        assert_eq!(store.fetch("g", &tp(0)).unwrap().offset, 99);
        assert_eq!(store.fetch("g", &tp(2)).unwrap().offset, 11);
        assert!(store.has_pending("g", "t", 1));
        assert_eq!(
            store.generations(),
            vec![("g".into(), 7, "consumer".into())]
        );
        let size_after = std::fs::metadata(dir.path().join(OffsetsLog::FILE_NAME))
            .unwrap()
            .len();
        assert!(size_after < size_before, "open rewrites a compact snapshot");
        // The pending transaction is resolved after the restart, as recovery does.
        assert!(store.complete_txn("g", 3, true).unwrap());
        drop(store);
        let store = OffsetStore::open(dir.path(), false).unwrap();
        assert_eq!(store.fetch("g", &tp(1)).unwrap().offset, 9);
        assert!(!store.has_pending("g", "t", 1));
    }

    #[test]
    fn deleting_a_topic_drops_its_offsets_durably() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = OffsetStore::open(dir.path(), true).unwrap();
            store
                .commit(
                    "g",
                    vec![(tp(0), off(4)), (TopicPartition::new("u", 0), off(8))],
                )
                .unwrap();
            store.commit("h", vec![(tp(1), off(2))]).unwrap();
            store.delete_topic("t").unwrap();
            store.delete_topic("never-committed").unwrap();
            assert!(store.fetch("g", &tp(0)).is_none());
            assert_eq!(store.groups_with_offsets(), vec!["g".to_owned()]);
        }
        let store = OffsetStore::open(dir.path(), true).unwrap();
        assert!(store.fetch("g", &tp(0)).is_none());
        assert!(store.fetch("h", &tp(1)).is_none());
        assert_eq!(
            store
                .fetch("g", &TopicPartition::new("u", 0))
                .unwrap()
                .offset,
            8
        );
    }

    #[test]
    fn closed_store_refuses_changes() {
        let store = OffsetStore::in_memory();
        store.close().unwrap();
        assert!(matches!(
            store.commit("g", vec![(tp(0), off(1))]),
            Err(GroupError::Closed)
        ));
    }
}
