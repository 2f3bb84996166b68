//! Idempotent-producer state per partition: for each producer id the epoch and the last five
//! batches' sequence ranges, with Kafka's duplicate / gap / fencing checks, and the snapshot
//! file format that persists it.

use std::collections::{HashMap, VecDeque};

use super::batch::{increment_sequence, BatchHeader};
use super::error::AppendError;

/// How many batches per producer are remembered for duplicate detection (Kafka's value).
pub const MAX_REMEMBERED_BATCHES: usize = 5;

/// Offsets and sequences of one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    /// First sequence of the batch.
    pub first_seq: i32,
    /// Last sequence of the batch.
    pub last_seq: i32,
    /// Offset the batch was stored at.
    pub base_offset: i64,
    /// Last offset of the batch.
    pub last_offset: i64,
}

/// What the partition knows about one producer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    /// Current epoch.
    pub epoch: i16,
    /// The most recent batches, oldest first, at most [`MAX_REMEMBERED_BATCHES`].
    pub batches: VecDeque<BatchMeta>,
    /// Largest timestamp appended by this producer.
    pub last_timestamp: i64,
    /// First offset of this producer's open transaction on this partition, if any.
    pub txn_first_offset: Option<i64>,
    /// Coordinator epoch of the last transaction marker written for this producer (-1 none).
    pub coordinator_epoch: i32,
}

impl ProducerEntry {
    fn new(epoch: i16) -> Self {
        ProducerEntry {
            epoch,
            batches: VecDeque::new(),
            last_timestamp: -1,
            txn_first_offset: None,
            coordinator_epoch: -1,
        }
    }
}

/// The outcome of checking a batch against producer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// The batch is next in sequence (or carries no producer id): append it.
    Append,
    /// The batch repeats one already stored: answer with its original offsets.
    Duplicate(BatchMeta),
}

/// Producer state of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStates {
    entries: HashMap<i64, ProducerEntry>,
}

impl ProducerStates {
    /// The entry of `producer_id`, if known.
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.entries.get(&producer_id)
    }

    /// Number of known producers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no producer is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Iterates over (producer id, entry).
    pub fn iter(&self) -> impl Iterator<Item = (&i64, &ProducerEntry)> {
        self.entries.iter()
    }

    /// Checks `h` as Kafka's `ProducerAppendInfo` does, against `entry` (the producer's state
    /// including batches staged earlier in the same request).
    pub fn check(
        entry: Option<&ProducerEntry>,
        h: &BatchHeader,
    ) -> Result<SequenceCheck, AppendError> {
        if !h.has_producer_id() {
            return Ok(SequenceCheck::Append);
        }
        let Some(e) = entry else {
            // Unknown producer. Kafka accepts any first sequence here (its state may have been
            // removed with old segments); this log never drops state, but follows Kafka.
            return Ok(SequenceCheck::Append);
        };
        if h.producer_epoch < e.epoch {
            return Err(AppendError::InvalidProducerEpoch {
                current: e.epoch,
                got: h.producer_epoch,
            });
        }
        if h.is_control() {
            // Transaction markers carry sequence -1: only the epoch counts.
            return Ok(SequenceCheck::Append);
        }
        if h.producer_epoch == e.epoch {
            let last_seq = h.last_sequence();
            if let Some(dup) = e
                .batches
                .iter()
                .find(|m| m.first_seq == h.base_sequence && m.last_seq == last_seq)
            {
                return Ok(SequenceCheck::Duplicate(*dup));
            }
            match e.batches.back() {
                Some(last) => {
                    let expected = increment_sequence(last.last_seq, 1);
                    if h.base_sequence != expected {
                        return Err(AppendError::OutOfOrderSequence {
                            expected,
                            got: h.base_sequence,
                        });
                    }
                }
                // Known epoch without data batches (e.g. only a marker so far): start at 0.
                None if h.base_sequence != 0 => {
                    return Err(AppendError::OutOfOrderSequence {
                        expected: 0,
                        got: h.base_sequence,
                    })
                }
                None => {}
            }
        } else if h.base_sequence != 0 {
            // A newer epoch must start at sequence 0.
            return Err(AppendError::OutOfOrderSequence {
                expected: 0,
                got: h.base_sequence,
            });
        }
        Ok(SequenceCheck::Append)
    }

    /// Applies an appended batch (`h.base_offset` is the assigned offset) to `entry`, creating
    /// it if needed; returns the updated entry. Non-idempotent batches change nothing.
    pub fn apply(entry: Option<ProducerEntry>, h: &BatchHeader) -> Option<ProducerEntry> {
        if !h.has_producer_id() {
            return entry;
        }
        let mut e = match entry {
            Some(e) if e.epoch == h.producer_epoch => e,
            Some(mut e) => {
                e.epoch = h.producer_epoch;
                e.batches.clear();
                e
            }
            None => ProducerEntry::new(h.producer_epoch),
        };
        e.last_timestamp = e.last_timestamp.max(h.max_timestamp);
        if h.is_control() {
            e.txn_first_offset = None;
            return Some(e);
        }
        if h.is_transactional() && e.txn_first_offset.is_none() {
            e.txn_first_offset = Some(h.base_offset);
        }
        if h.base_sequence >= 0 {
            e.batches.push_back(BatchMeta {
                first_seq: h.base_sequence,
                last_seq: h.last_sequence(),
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
            });
            while e.batches.len() > MAX_REMEMBERED_BATCHES {
                e.batches.pop_front();
            }
        }
        Some(e)
    }

    /// Replaces the entry of `producer_id`.
    pub fn insert(&mut self, producer_id: i64, entry: ProducerEntry) {
        self.entries.insert(producer_id, entry);
    }

    /// Records the coordinator epoch of a marker just applied for `producer_id`.
    pub fn note_marker(&mut self, producer_id: i64, coordinator_epoch: i32) {
        if let Some(e) = self.entries.get_mut(&producer_id) {
            e.coordinator_epoch = coordinator_epoch;
        }
    }

    /// Rebuilds state while replaying a stored batch during recovery.
    pub fn replay(&mut self, h: &BatchHeader) {
        if !h.has_producer_id() {
            return;
        }
        let current = self.entries.remove(&h.producer_id);
        if let Some(e) = Self::apply(current, h) {
            self.entries.insert(h.producer_id, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::{encode_batch, parse_header, BatchSpec, RecordSpec};

    fn header(pid: i64, epoch: i16, seq: i32, n: usize, base_offset: i64) -> BatchHeader {
        let recs = vec![RecordSpec::default(); n];
        let b = encode_batch(
            BatchSpec {
                base_offset,
                producer_id: pid,
                producer_epoch: epoch,
                base_sequence: seq,
                ..BatchSpec::default()
            },
            &recs,
        );
        parse_header(&b).expect("header")
    }

    fn append(s: &mut ProducerStates, h: &BatchHeader) -> Result<SequenceCheck, AppendError> {
        let r = ProducerStates::check(s.get(h.producer_id), h)?;
        if r == SequenceCheck::Append {
            s.replay(h);
        }
        Ok(r)
    }

    #[test]
    fn in_sequence_duplicate_gap_and_epoch() {
        let mut s = ProducerStates::default();
        assert_eq!(
            append(&mut s, &header(1, 0, 0, 3, 0)).unwrap(),
            SequenceCheck::Append
        );
        assert_eq!(
            append(&mut s, &header(1, 0, 3, 2, 3)).unwrap(),
            SequenceCheck::Append
        );
        match append(&mut s, &header(1, 0, 0, 3, 99)).unwrap() {
            SequenceCheck::Duplicate(m) => assert_eq!((m.base_offset, m.last_offset), (0, 2)),
            other => panic!("expected duplicate, got {other:?}"),
        }
        assert!(matches!(
            append(&mut s, &header(1, 0, 9, 1, 5)),
            Err(AppendError::OutOfOrderSequence {
                expected: 5,
                got: 9
            })
        ));
        assert!(matches!(
            append(&mut s, &header(1, 1, 4, 1, 5)),
            Err(AppendError::OutOfOrderSequence {
                expected: 0,
                got: 4
            })
        ));
        assert_eq!(
            append(&mut s, &header(1, 1, 0, 1, 5)).unwrap(),
            SequenceCheck::Append
        );
        assert!(matches!(
            append(&mut s, &header(1, 0, 5, 1, 6)),
            Err(AppendError::InvalidProducerEpoch { current: 1, got: 0 })
        ));
    }

    #[test]
    fn only_five_batches_are_remembered() {
        let mut s = ProducerStates::default();
        for i in 0..7 {
            append(&mut s, &header(2, 0, i, 1, i64::from(i))).unwrap();
        }
        assert_eq!(s.get(2).unwrap().batches.len(), MAX_REMEMBERED_BATCHES);
        // Sequence 0 is forgotten: it is now neither a duplicate nor in sequence.
        assert!(append(&mut s, &header(2, 0, 0, 1, 7)).is_err());
        assert!(matches!(
            append(&mut s, &header(2, 0, 6, 1, 7)).unwrap(),
            SequenceCheck::Duplicate(_)
        ));
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let mut s = ProducerStates::default();
        append(&mut s, &header(3, 0, 0, 1, 0)).unwrap();
        s.entries
            .get_mut(&3)
            .unwrap()
            .batches
            .back_mut()
            .unwrap()
            .last_seq = i32::MAX - 1;
        append(&mut s, &header(3, 0, i32::MAX, 2, 1)).unwrap();
        assert_eq!(s.get(3).unwrap().batches.back().unwrap().last_seq, 0);
        assert_eq!(
            append(&mut s, &header(3, 0, 1, 1, 3)).unwrap(),
            SequenceCheck::Append
        );
    }

    #[test]
    fn non_idempotent_batches_skip_checks() {
        let mut s = ProducerStates::default();
        assert_eq!(
            append(&mut s, &header(-1, -1, -1, 2, 0)).unwrap(),
            SequenceCheck::Append
        );
        assert_eq!(
            append(&mut s, &header(-1, -1, -1, 2, 0)).unwrap(),
            SequenceCheck::Append
        );
        assert!(s.is_empty());
    }
}
