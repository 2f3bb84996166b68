//! What the cleaner keeps, batch by batch, in offset order: Kafka's `LogCleaner` rules
//! (`Cleaner.cleanInto`, `CleanedTransactionMetadata`, `MemoryRecords.filterTo`) as a pure
//! function of the batches, the key map, the aborted transactions and the producers' last
//! batches, so they are unit-tested without files.
//!
//! - A data record stays if it is the latest record of its key (offset >= the key map's) and
//!   has a value, or is a tombstone whose batch has no delete horizon yet or one still in the
//!   future. Records without a key are removed (a compacted topic cannot hold them).
//! - Records of aborted transactions are removed. A transaction marker goes only when no
//!   batch of its transaction was met in this pass (its data was removed by an earlier pass)
//!   and its batch's delete horizon has passed; the pass that first finds it removable sets
//!   the horizon (now + `delete.retention.ms`), as for tombstones (KIP-534).
//! - The last data batch of every producer (or its last marker if it has no data batch) is
//!   kept, emptied if need be, so sequence checks and epochs survive a restart that rebuilds
//!   producer state from the log. The last batch of each segment is kept too (possibly empty):
//!   segment offset ranges never change, so recovery's contiguity checks still hold.

use std::collections::HashMap;

use bytes::BytesMut;

use super::records::{self, delete_horizon, RawRecord, RecordsError};
use crate::storage::batch::BatchHeader;
use crate::storage::producer_state::ProducerStates;
use crate::storage::txn_index::{self, AbortedTxn, CONTROL_ABORT};

/// The last batch of a live producer that must stay in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastBatch {
    /// Last offset of its last data batch, if it has one.
    pub last_data_offset: Option<i64>,
    /// Its current epoch (identifies its last marker when it has no data batch).
    pub epoch: i16,
}

/// The last batch of each producer in `producers`.
pub fn last_batches(producers: &ProducerStates) -> HashMap<i64, LastBatch> {
    producers
        .iter()
        .map(|(pid, e)| {
            (
                *pid,
                LastBatch {
                    last_data_offset: e.batches.back().map(|b| b.last_offset),
                    epoch: e.epoch,
                },
            )
        })
        .collect()
}

/// Aborted transactions by producer: (first offset, marker offset) ranges.
#[derive(Debug, Clone, Default)]
pub struct AbortedRanges(HashMap<i64, Vec<(i64, i64)>>);

impl AbortedRanges {
    /// From the partition's aborted-transaction index.
    pub fn new(aborted: &[AbortedTxn]) -> Self {
        let mut map: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
        for a in aborted {
            map.entry(a.producer_id)
                .or_default()
                .push((a.first_offset, a.last_offset));
        }
        AbortedRanges(map)
    }

    /// Whether the transactional batch of `producer_id` at `offset` was aborted.
    pub fn contains(&self, producer_id: i64, offset: i64) -> bool {
        self.0.get(&producer_id).is_some_and(|r| {
            r.iter()
                .any(|(first, last)| (*first..=*last).contains(&offset))
        })
    }
}

/// The latest offset of every key in the cleanable range (aborted data excluded).
#[derive(Debug, Default)]
pub struct KeyMap(HashMap<Vec<u8>, i64>);

impl KeyMap {
    /// Adds the records of one stored batch.
    pub fn add(
        &mut self,
        batch: &[u8],
        h: &BatchHeader,
        aborted: &AbortedRanges,
    ) -> Result<(), RecordsError> {
        if h.is_control()
            || (h.is_transactional() && aborted.contains(h.producer_id, h.base_offset))
        {
            return Ok(());
        }
        records::for_each_key(batch, h, |key, offset| {
            if let Some(k) = key {
                // Only a key not yet in the map is copied.
                match self.0.get_mut(k) {
                    Some(latest) => *latest = (*latest).max(offset),
                    None => {
                        self.0.insert(k.to_vec(), offset);
                    }
                }
            }
        })
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no key was added.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn latest(&self, key: &[u8]) -> Option<i64> {
        self.0.get(key).copied()
    }
}

/// What happens to one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Kept byte for byte.
    Keep,
    /// Replaced by these bytes (fewer records and/or a delete horizon).
    Rewrite(BytesMut),
    /// Dropped.
    Remove,
}

/// Counters of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Records kept.
    pub records_kept: u64,
    /// Records removed.
    pub records_removed: u64,
    /// Whole batches removed.
    pub batches_removed: u64,
}

/// The state of one cleaning pass over the batches in offset order.
#[derive(Debug)]
pub struct Filter<'a> {
    now_ms: i64,
    delete_retention_ms: i64,
    keys: &'a KeyMap,
    aborted: &'a AbortedRanges,
    last: &'a HashMap<i64, LastBatch>,
    /// Producers whose open-in-this-pass transaction had batches met, by outcome (aborted or
    /// committed): whether one of those batches is kept.
    aborted_seen: HashMap<i64, bool>,
    committed_seen: HashMap<i64, bool>,
    /// Counters.
    pub stats: FilterStats,
    /// When another pass may remove more: the earliest delete horizon kept, or now when a
    /// marker waits only for this pass's removals.
    pub next_due: Option<i64>,
    /// ABORT markers removed: (producer id, marker offset); their aborted-index entries go.
    pub removed_aborts: Vec<(i64, i64)>,
}

impl<'a> Filter<'a> {
    /// A pass at `now_ms` with the partition's `delete.retention.ms`.
    pub fn new(
        now_ms: i64,
        delete_retention_ms: i64,
        keys: &'a KeyMap,
        aborted: &'a AbortedRanges,
        last: &'a HashMap<i64, LastBatch>,
    ) -> Self {
        Filter {
            now_ms,
            delete_retention_ms,
            keys,
            aborted,
            last,
            aborted_seen: HashMap::new(),
            committed_seen: HashMap::new(),
            stats: FilterStats::default(),
            next_due: None,
            removed_aborts: Vec::new(),
        }
    }

    fn due(&mut self, at: i64) {
        self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
    }

    fn is_last_of_producer(&self, h: &BatchHeader) -> bool {
        self.last
            .get(&h.producer_id)
            .is_some_and(|l| match l.last_data_offset {
                Some(o) => !h.is_control() && h.last_offset() == o,
                None => h.is_control() && h.producer_epoch == l.epoch,
            })
    }

    /// Decides one batch (`batch` = its stored bytes); `keep_header` keeps it at least as an
    /// empty batch (the last batch of a segment).
    pub fn batch(
        &mut self,
        batch: &[u8],
        h: &BatchHeader,
        keep_header: bool,
    ) -> Result<Verdict, RecordsError> {
        let recs = records::parse_records(batch, h)?;
        let horizon = delete_horizon(h);
        let horizon_passed = horizon.is_some_and(|t| t <= self.now_ms);
        let (can_discard, abort_marker, waits_on_this_pass) = if h.is_control() {
            self.on_marker(batch, h, recs.is_empty())
        } else {
            (self.on_data(h), false, false)
        };
        if abort_marker && can_discard {
            // No data of the transaction is left: its aborted-index entry is of no use, and
            // it must not outlive the marker (a client would skip the producer's later data).
            self.removed_aborts.push((h.producer_id, h.base_offset));
        }
        let discard_records = if h.is_control() {
            can_discard && horizon_passed
        } else {
            can_discard
        };
        let retain_empty = (h.has_producer_id() && self.is_last_of_producer(h)) || keep_header;
        let kept: Vec<RawRecord> = if discard_records {
            Vec::new()
        } else if h.is_control() {
            recs.clone()
        } else {
            let retain_deletes = !horizon_passed;
            recs.iter()
                .filter(|r| match &r.key {
                    Some(k) => {
                        self.keys.latest(k).is_none_or(|o| r.offset >= o)
                            && (r.has_value || retain_deletes)
                    }
                    None => false,
                })
                .cloned()
                .collect()
        };
        let removed = (recs.len() - kept.len()) as u64;
        self.stats.records_removed += removed;
        self.stats.records_kept += kept.len() as u64;
        if kept.is_empty() && !retain_empty {
            if h.is_transactional() && !h.is_control() {
                // This pass removed the batch: its marker may go on the next pass.
                self.note_txn_batch_kept(h, false);
            }
            self.stats.batches_removed += 1;
            return Ok(Verdict::Remove);
        }
        if h.is_transactional() && !h.is_control() {
            self.note_txn_batch_kept(h, true);
        }
        let has_tombstone = !h.is_control() && kept.iter().any(|r| !r.has_value);
        let wants_horizon = horizon.is_none() && (has_tombstone || (h.is_control() && can_discard));
        let new_horizon =
            wants_horizon.then(|| self.now_ms.saturating_add(self.delete_retention_ms));
        if let Some(t) = new_horizon.or(horizon) {
            if has_tombstone || (h.is_control() && can_discard && !kept.is_empty()) {
                self.due(t);
            }
        }
        if waits_on_this_pass {
            self.due(self.now_ms);
        }
        if removed == 0 && new_horizon.is_none() {
            return Ok(Verdict::Keep);
        }
        Ok(Verdict::Rewrite(records::rewrite(
            batch,
            h,
            &kept,
            new_horizon,
        )?))
    }

    /// A data batch: whether all its records may go because its transaction was aborted.
    fn on_data(&mut self, h: &BatchHeader) -> bool {
        if !h.is_transactional() {
            return false;
        }
        let aborted = self.aborted.contains(h.producer_id, h.base_offset);
        let seen = if aborted {
            &mut self.aborted_seen
        } else {
            &mut self.committed_seen
        };
        seen.entry(h.producer_id).or_insert(false);
        aborted
    }

    fn note_txn_batch_kept(&mut self, h: &BatchHeader, kept: bool) {
        for seen in [&mut self.aborted_seen, &mut self.committed_seen] {
            if let Some(k) = seen.get_mut(&h.producer_id) {
                *k |= kept;
            }
        }
    }

    /// A marker: (may it go once its horizon passed, is it an ABORT marker, does it wait only
    /// for batches this pass removed).
    fn on_marker(&mut self, batch: &[u8], h: &BatchHeader, empty: bool) -> (bool, bool, bool) {
        if empty {
            // A marker emptied by an earlier pass.
            return (true, false, false);
        }
        let abort = txn_index::control_type(batch, h) == Some(CONTROL_ABORT);
        let seen = if abort {
            self.aborted_seen.remove(&h.producer_id)
        } else {
            self.committed_seen.remove(&h.producer_id)
        };
        (seen.is_none(), abort, seen == Some(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::{
        encode_batch, set_base_offset, validate_batch, BatchSpec, RecordSpec, ATTR_TRANSACTIONAL,
    };

    /// A batch at `base` of (key, value) records.
    fn data(base: i64, spec: BatchSpec, recs: &[(&str, Option<&str>)]) -> BytesMut {
        let specs: Vec<RecordSpec> = recs
            .iter()
            .map(|(k, v)| RecordSpec {
                timestamp: 10,
                key: Some(k.as_bytes()),
                value: v.map(str::as_bytes),
                headers: Vec::new(),
            })
            .collect();
        let mut b = encode_batch(spec, &specs);
        set_base_offset(&mut b, base);
        b
    }

    fn marker(base: i64, pid: i64, commit: bool) -> BytesMut {
        let mut b = txn_index::encode_marker(pid, 0, commit, 0, 10);
        set_base_offset(&mut b, base);
        b
    }

    /// Runs one pass over `log` (batches in order), the last batch kept as a segment end.
    fn pass(
        log: &[BytesMut],
        now: i64,
        aborted: &[AbortedTxn],
        last: &HashMap<i64, LastBatch>,
    ) -> (Vec<BytesMut>, Filter<'static>) {
        let ranges: &'static AbortedRanges = Box::leak(Box::new(AbortedRanges::new(aborted)));
        let mut keys = KeyMap::default();
        for b in log {
            keys.add(b, &validate_batch(b).unwrap(), ranges).unwrap();
        }
        let keys: &'static KeyMap = Box::leak(Box::new(keys));
        let last: &'static HashMap<i64, LastBatch> = Box::leak(Box::new(last.clone()));
        let mut f = Filter::new(now, 100, keys, ranges, last);
        let mut out = Vec::new();
        for (i, b) in log.iter().enumerate() {
            let h = validate_batch(b).unwrap();
            match f.batch(b, &h, i + 1 == log.len()).unwrap() {
                Verdict::Keep => out.push(b.clone()),
                Verdict::Rewrite(n) => out.push(n),
                Verdict::Remove => {}
            }
        }
        (out, f)
    }

    fn contents(log: &[BytesMut]) -> Vec<(i64, Option<String>, bool)> {
        let mut v = Vec::new();
        for b in log {
            let h = validate_batch(b).unwrap();
            for r in records::parse_records(b, &h).unwrap() {
                let key = r.key.map(|k| String::from_utf8(k).unwrap());
                v.push((r.offset, key, r.has_value));
            }
        }
        v
    }

    #[test]
    fn latest_value_per_key_and_tombstones_after_their_horizon() {
        let log = vec![
            data(
                0,
                BatchSpec::default(),
                &[("a", Some("1")), ("b", Some("1"))],
            ),
            data(2, BatchSpec::default(), &[("a", Some("2")), ("b", None)]),
            data(4, BatchSpec::default(), &[("c", Some("1"))]),
        ];
        let none = HashMap::new();
        let (once, f) = pass(&log, 1_000, &[], &none);
        assert_eq!(
            contents(&once),
            vec![
                (2, Some("a".into()), true),
                (3, Some("b".into()), false),
                (4, Some("c".into()), true)
            ]
        );
        assert_eq!(f.stats.records_removed, 2);
        assert_eq!(f.next_due, Some(1_100), "the tombstone's horizon");
        let h = validate_batch(&once[0]).unwrap();
        assert_eq!(records::delete_horizon(&h), Some(1_100));
        assert_eq!((h.base_offset, h.last_offset()), (2, 3), "offsets kept");
        // Before the horizon the tombstone stays; after it, it goes.
        let (early, _) = pass(&once, 1_050, &[], &none);
        assert_eq!(contents(&early), contents(&once));
        let (late, f) = pass(&once, 1_100, &[], &none);
        assert_eq!(
            contents(&late),
            vec![(2, Some("a".into()), true), (4, Some("c".into()), true)]
        );
        assert_eq!(f.next_due, None);
    }

    #[test]
    fn keyless_records_go_and_the_last_batch_of_a_segment_stays_empty() {
        let log = vec![
            data(0, BatchSpec::default(), &[("a", Some("1"))]),
            data(1, BatchSpec::default(), &[("a", Some("2"))]),
            data(2, BatchSpec::default(), &[("b", Some("1"))]),
        ];
        // The segment ends with a superseded record: its batch stays, emptied.
        let (out, _) = pass(&log[..1], 0, &[], &HashMap::new());
        assert_eq!(out.len(), 1);
        let mut keys = KeyMap::default();
        for b in &log {
            keys.add(b, &validate_batch(b).unwrap(), &AbortedRanges::default())
                .unwrap();
        }
        let ranges = AbortedRanges::default();
        let last = HashMap::new();
        let mut f = Filter::new(0, 100, &keys, &ranges, &last);
        let h = validate_batch(&log[0]).unwrap();
        let Verdict::Rewrite(b) = f.batch(&log[0], &h, true).unwrap() else {
            panic!("expected an emptied batch");
        };
        let nh = validate_batch(&b).unwrap();
        assert_eq!(
            (nh.record_count, nh.base_offset, nh.last_offset()),
            (0, 0, 0)
        );
    }

    #[test]
    fn aborted_data_goes_then_its_marker_after_the_horizon() {
        let txn = BatchSpec {
            attributes: ATTR_TRANSACTIONAL,
            producer_id: 5,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchSpec::default()
        };
        let log = vec![
            data(0, txn, &[("a", Some("aborted")), ("b", Some("aborted"))]),
            marker(2, 5, false),
            data(3, BatchSpec::default(), &[("c", Some("1"))]),
        ];
        let aborted = [AbortedTxn {
            producer_id: 5,
            first_offset: 0,
            last_offset: 2,
            last_stable_offset: 3,
        }];
        let none = HashMap::new();
        let (p1, f) = pass(&log, 1_000, &aborted, &none);
        assert_eq!(
            p1.len(),
            2,
            "data gone, marker kept while its data was seen"
        );
        assert_eq!(
            f.next_due,
            Some(1_000),
            "another pass can take the marker further"
        );
        assert!(f.removed_aborts.is_empty());
        let (p2, f) = pass(&p1, 1_000, &aborted, &none);
        assert_eq!(p2.len(), 2);
        assert_eq!(f.removed_aborts, vec![(5, 2)], "index entry dropped");
        assert_eq!(f.next_due, Some(1_100));
        let (p3, _) = pass(&p2, 1_100, &aborted, &none);
        assert_eq!(contents(&p3), vec![(3, Some("c".into()), true)]);
    }

    #[test]
    fn committed_data_is_compacted_and_its_marker_waits_for_it() {
        let txn = BatchSpec {
            attributes: ATTR_TRANSACTIONAL,
            producer_id: 6,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchSpec::default()
        };
        let log = vec![
            data(0, txn, &[("a", Some("committed"))]),
            marker(1, 6, true),
            data(2, BatchSpec::default(), &[("a", Some("newer"))]),
        ];
        let none = HashMap::new();
        let (p1, _) = pass(&log, 0, &[], &none);
        assert_eq!(p1.len(), 2, "superseded committed batch gone, marker stays");
        let (p2, _) = pass(&p1, 0, &[], &none);
        let (p3, _) = pass(&p2, 100, &[], &none);
        assert_eq!(contents(&p3), vec![(2, Some("a".into()), true)]);
    }

    #[test]
    fn each_producers_last_batch_stays_for_its_sequence_numbers() {
        let idem = BatchSpec {
            producer_id: 7,
            producer_epoch: 2,
            base_sequence: 40,
            ..BatchSpec::default()
        };
        let log = vec![
            data(0, idem, &[("a", Some("1")), ("b", Some("1"))]),
            data(
                2,
                BatchSpec::default(),
                &[("a", Some("2")), ("b", Some("2"))],
            ),
            data(4, BatchSpec::default(), &[("z", Some("1"))]),
        ];
        let last = HashMap::from([(
            7,
            LastBatch {
                last_data_offset: Some(1),
                epoch: 2,
            },
        )]);
        let (out, _) = pass(&log, 0, &[], &last);
        let h = validate_batch(&out[0]).unwrap();
        assert_eq!(
            (
                h.record_count,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence()
            ),
            (0, 7, 2, 40, 41)
        );
    }
}
