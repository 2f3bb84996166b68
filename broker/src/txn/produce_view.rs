//! What the Produce path checks a transactional batch against: each producer id's
//! transactional id, current epoch and the partitions of its open transaction, as of the
//! coordinator's last durable state change.
//!
//! The coordinator publishes a producer's entry after the transaction log's append (and its
//! fsync) of each state change, under its own lock; a Produce request reads the view under a
//! read lock only. So a transactional Produce never waits behind the transaction log's fsync
//! of another transaction's AddPartitionsToTxn, EndTxn or InitProducerId, which it would if it
//! took the coordinator's lock (held through every log append). What it sees is what the
//! coordinator's lock would have shown it a moment earlier: a state change becomes visible
//! once it is durable, as before. A batch checked just before a change is published is
//! appended under the partition's transaction lock, before any marker the change leads to
//! (markers take the same lock), so it lands inside the transaction it was checked against.

use std::collections::{BTreeSet, HashMap};

use kafka_protocol::ResponseError;
use parking_lot::RwLock;

use super::state::{TopicPartition, TxnMetadata, TxnState};

/// The producer ids of every known transactional id with their epoch and open partitions.
#[derive(Debug, Default)]
pub struct ProduceView {
    by_pid: RwLock<HashMap<i64, Entry>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The transactional id the coordinator issued the producer id to.
    transactional_id: String,
    epoch: i16,
    /// The partitions of the open transaction; `None` unless the state is Ongoing.
    open: Option<BTreeSet<TopicPartition>>,
}

impl Entry {
    fn of(m: &TxnMetadata) -> Entry {
        Entry {
            transactional_id: m.transactional_id.clone(),
            epoch: m.producer_epoch,
            open: (m.state == TxnState::Ongoing).then(|| m.partitions.clone()),
        }
    }
}

impl ProduceView {
    /// A view of `txns` (the coordinator's state when it opens).
    pub fn of<'a>(txns: impl IntoIterator<Item = &'a TxnMetadata>) -> ProduceView {
        ProduceView {
            by_pid: RwLock::new(
                txns.into_iter()
                    .map(|m| (m.producer_id, Entry::of(m)))
                    .collect(),
            ),
        }
    }

    /// Publishes the durable state `m`; `replaced` is a producer id of the same
    /// transactional id that `m` no longer owns (a new producer id after epoch exhaustion).
    pub fn publish(&self, m: &TxnMetadata, replaced: Option<i64>) {
        let entry = Entry::of(m);
        let mut by_pid = self.by_pid.write();
        if let Some(old) = replaced {
            by_pid.remove(&old);
        }
        if by_pid.get(&m.producer_id) != Some(&entry) {
            by_pid.insert(m.producer_id, entry);
        }
    }

    /// Forgets `producer_id` (its transactional id expired).
    pub fn remove(&self, producer_id: i64) {
        self.by_pid.write().remove(&producer_id);
    }

    /// The Produce-side check of a transactional batch: the coordinator issued the producer
    /// id to `transactional_id` (the request's, whose Write permission was checked), the
    /// producer holds the current epoch and added the partition to its open transaction. A
    /// producer id of another transactional id is answered as an unknown one, as Kafka's
    /// coordinator answers a mismatched producer id.
    pub fn check(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> std::result::Result<(), ResponseError> {
        let by_pid = self.by_pid.read();
        let e = by_pid
            .get(&producer_id)
            .filter(|e| e.transactional_id == transactional_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if epoch != e.epoch {
            return Err(ResponseError::InvalidProducerEpoch);
        }
        match &e.open {
            // a transaction names a few partitions: a scan, without a String per batch
            Some(parts) if parts.iter().any(|(t, p)| *p == partition && t == topic) => Ok(()),
            _ => Err(ResponseError::InvalidTxnState),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pid: i64, epoch: i16, state: TxnState, parts: &[(&str, i32)]) -> TxnMetadata {
        let mut m = TxnMetadata::new("t", pid, 60_000, 0);
        m.producer_epoch = epoch;
        m.state = state;
        m.partitions = parts.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        m
    }

    #[test]
    fn checks_epoch_state_and_partition() {
        let v = ProduceView::default();
        assert_eq!(
            v.check("t", 7, 0, "a", 0),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        v.publish(&meta(7, 0, TxnState::Ongoing, &[("a", 0)]), None);
        assert_eq!(v.check("t", 7, 0, "a", 0), Ok(()));
        assert_eq!(
            v.check("t", 7, 0, "a", 1),
            Err(ResponseError::InvalidTxnState)
        );
        assert_eq!(
            v.check("t", 7, 1, "a", 0),
            Err(ResponseError::InvalidProducerEpoch)
        );
        v.publish(&meta(7, 0, TxnState::PrepareCommit, &[("a", 0)]), None);
        assert_eq!(
            v.check("t", 7, 0, "a", 0),
            Err(ResponseError::InvalidTxnState)
        );
        // fenced: the epoch moved on
        v.publish(&meta(7, 1, TxnState::Ongoing, &[("a", 0)]), None);
        assert_eq!(
            v.check("t", 7, 0, "a", 0),
            Err(ResponseError::InvalidProducerEpoch)
        );
        assert_eq!(v.check("t", 7, 1, "a", 0), Ok(()));
        // the producer id of another transactional id
        assert_eq!(
            v.check("u", 7, 1, "a", 0),
            Err(ResponseError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn a_replaced_or_removed_producer_id_is_unknown() {
        let v = ProduceView::of([&meta(7, 5, TxnState::Ongoing, &[("a", 0)])]);
        assert_eq!(v.check("t", 7, 5, "a", 0), Ok(()));
        v.publish(&meta(8, 0, TxnState::Empty, &[]), Some(7));
        assert_eq!(
            v.check("t", 7, 5, "a", 0),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        assert_eq!(
            v.check("t", 8, 0, "a", 0),
            Err(ResponseError::InvalidTxnState)
        );
        v.remove(8);
        assert_eq!(
            v.check("t", 8, 0, "a", 0),
            Err(ResponseError::InvalidProducerIdMapping)
        );
    }
}
