//! The transaction view of one partition, kept in memory: the open transactions (producer id
//! -> first offset), the last stable offset, the aborted-transaction index and the last
//! marker per producer. Pure bookkeeping; [`super::partition_index`] persists it.

use std::collections::BTreeMap;

use super::marker::MarkerKind;

/// One aborted transaction on a partition: read_committed readers skip this producer's
/// batches in `[first_offset, last_offset]` (`last_offset` is the ABORT marker's offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AbortedTxn {
    /// The producer whose data is skipped.
    pub producer_id: i64,
    /// First offset of the transaction on this partition.
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
}

/// The in-memory transaction state of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionTxnState {
    /// Open transactions: producer id -> first offset.
    pub(crate) open: BTreeMap<i64, i64>,
    /// Aborted transactions in marker order (so sorted by `last_offset`).
    pub(crate) aborted: Vec<AbortedTxn>,
}

impl PartitionTxnState {
    /// A transactional data batch of `producer_id` was stored at `base_offset`.
    pub fn observe_data(&mut self, producer_id: i64, base_offset: i64) {
        self.open.entry(producer_id).or_insert(base_offset);
    }

    /// A marker of `producer_id` was stored at `offset`. Returns the aborted-index entry it
    /// creates (an ABORT closing an open transaction), which the caller persists.
    pub fn observe_marker(
        &mut self,
        producer_id: i64,
        kind: MarkerKind,
        offset: i64,
    ) -> Option<AbortedTxn> {
        let first = self.open.remove(&producer_id)?;
        if kind == MarkerKind::Commit {
            return None;
        }
        let entry = AbortedTxn {
            producer_id,
            first_offset: first,
            last_offset: offset,
        };
        self.aborted.push(entry);
        Some(entry)
    }

    /// Whether `producer_id` has an open transaction here.
    pub fn is_open(&self, producer_id: i64) -> bool {
        self.open.contains_key(&producer_id)
    }

    /// The open transactions (producer id, first offset).
    pub fn open_transactions(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.open.iter().map(|(p, o)| (*p, *o))
    }

    /// Last stable offset: the first offset of the earliest open transaction, else `hw`.
    pub fn last_stable_offset(&self, high_watermark: i64) -> i64 {
        self.open
            .values()
            .copied()
            .min()
            .map_or(high_watermark, |first| first.min(high_watermark))
    }

    /// Aborted transactions overlapping offsets `[from, to)`, in index order, found by binary
    /// search (no log scan).
    pub fn aborted_between(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        let start = self.aborted.partition_point(|a| a.last_offset < from);
        self.aborted[start..]
            .iter()
            .filter(|a| a.first_offset < to)
            .copied()
            .collect()
    }

    /// The last aborted entry's marker offset, or -1.
    pub fn last_aborted_offset(&self) -> i64 {
        self.aborted.last().map_or(-1, |a| a.last_offset)
    }

    /// Every aborted entry.
    pub fn aborted(&self) -> &[AbortedTxn] {
        &self.aborted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lso_follows_the_earliest_open_transaction() {
        let mut s = PartitionTxnState::default();
        assert_eq!(s.last_stable_offset(10), 10);
        s.observe_data(1, 3);
        s.observe_data(2, 5);
        s.observe_data(1, 7); // later batch of the same transaction
        assert_eq!(s.last_stable_offset(10), 3);
        assert_eq!(s.observe_marker(1, MarkerKind::Commit, 10), None);
        assert_eq!(s.last_stable_offset(11), 5);
        let a = s.observe_marker(2, MarkerKind::Abort, 11).expect("entry");
        assert_eq!((a.first_offset, a.last_offset), (5, 11));
        assert_eq!(s.last_stable_offset(12), 12);
        // A marker for a producer with nothing open changes nothing.
        assert_eq!(s.observe_marker(9, MarkerKind::Abort, 12), None);
    }

    #[test]
    fn aborted_range_query() {
        let mut s = PartitionTxnState::default();
        for (pid, first, last) in [(1, 0, 4), (2, 5, 9), (3, 2, 12), (4, 20, 25)] {
            s.observe_data(pid, first);
            s.observe_marker(pid, MarkerKind::Abort, last);
        }
        let ids = |v: Vec<AbortedTxn>| v.iter().map(|a| a.producer_id).collect::<Vec<_>>();
        assert_eq!(ids(s.aborted_between(0, 100)), vec![1, 2, 3, 4]);
        assert_eq!(ids(s.aborted_between(5, 10)), vec![2, 3]);
        assert_eq!(ids(s.aborted_between(13, 20)), Vec::<i64>::new());
        assert_eq!(ids(s.aborted_between(13, 21)), vec![4]);
    }
}
