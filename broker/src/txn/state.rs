//! The transaction coordinator's per-transactional-id state: the state machine of Kafka's
//! `TransactionMetadata` and its binary encoding in the transaction log.
//!
//! ```text
//! Empty ──AddPartitions──> Ongoing ──EndTxn(commit)──> PrepareCommit ──markers──> CompleteCommit
//!   ^                         │ └────EndTxn(abort)/timeout──> PrepareAbort ──markers──> CompleteAbort
//!   │                         └─InitProducerId──> PrepareEpochFence ──> PrepareAbort
//!   └──InitProducerId── CompleteCommit | CompleteAbort | Empty ──expiration──> Dead
//! ```

use std::collections::BTreeSet;

/// Where a transactional id's current transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnState {
    /// No transaction open (after InitProducerId).
    Empty,
    /// Partitions or offsets were added; the transaction is open.
    Ongoing,
    /// EndTxn(commit) was accepted; commit markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a fencing InitProducerId; abort markers are being written.
    PrepareAbort,
    /// Every commit marker is written.
    CompleteCommit,
    /// Every abort marker is written.
    CompleteAbort,
    /// A newer producer is fencing this one: the epoch is bumped and the open transaction is
    /// about to be aborted (in memory only; the log records the PrepareAbort that follows).
    PrepareEpochFence,
    /// The transactional id expired and is forgotten.
    Dead,
}

impl TxnState {
    /// Stable byte used in the transaction log.
    pub fn to_byte(self) -> u8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::PrepareEpochFence => 6,
            TxnState::Dead => 7,
        }
    }

    /// Inverse of [`TxnState::to_byte`].
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::PrepareEpochFence,
            7 => TxnState::Dead,
            _ => return None,
        })
    }

    /// Whether moving from `self` to `to` is a transition of the state machine.
    pub fn can_transition_to(self, to: TxnState) -> bool {
        use TxnState::*;
        match to {
            Empty => matches!(self, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(self, Ongoing | Empty | CompleteCommit | CompleteAbort),
            PrepareCommit => self == Ongoing,
            PrepareAbort => matches!(self, Ongoing | PrepareEpochFence),
            CompleteCommit => self == PrepareCommit,
            CompleteAbort => self == PrepareAbort,
            PrepareEpochFence => self == Ongoing,
            Dead => matches!(self, Empty | CompleteCommit | CompleteAbort | Dead),
        }
    }

    /// Whether markers are being written (requests touching the transaction must wait).
    pub fn is_preparing(self) -> bool {
        matches!(
            self,
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence
        )
    }

    /// Name as Kafka spells it.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
            TxnState::Dead => "Dead",
        }
    }
}

/// A topic partition named in a transaction.
pub type TopicPartition = (String, i32);

/// Everything the coordinator knows about one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMetadata {
    /// The client's transactional.id.
    pub transactional_id: String,
    /// Current producer id.
    pub producer_id: i64,
    /// Producer id before the last InitProducerId (KIP-360 retries), or -1.
    pub last_producer_id: i64,
    /// Current producer epoch.
    pub producer_epoch: i16,
    /// Epoch before the last bump (KIP-360 retries), or -1.
    pub last_producer_epoch: i16,
    /// The client's transaction.timeout.ms.
    pub timeout_ms: i32,
    /// Current state.
    pub state: TxnState,
    /// Partitions of the open (or completing) transaction.
    pub partitions: BTreeSet<TopicPartition>,
    /// Consumer groups whose offsets the transaction carries (AddOffsetsToTxn).
    pub groups: BTreeSet<String>,
    /// Wall-clock start of the open transaction (ms since the epoch), or -1.
    pub txn_start_ms: i64,
    /// Wall-clock time of the last state change (ms since the epoch).
    pub last_update_ms: i64,
}

struct Writer(Vec<u8>);

impl Writer {
    fn str(&mut self, s: &str) {
        let b = s.as_bytes();
        self.0.extend_from_slice(&(b.len() as u32).to_be_bytes());
        self.0.extend_from_slice(b);
    }
}

/// A cursor over an encoded record that fails instead of panicking on short input.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(crate) fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn str(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }
}

impl TxnMetadata {
    /// A fresh transactional id in state Empty.
    pub fn new(transactional_id: &str, producer_id: i64, timeout_ms: i32, now_ms: i64) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            producer_id,
            last_producer_id: -1,
            producer_epoch: 0,
            last_producer_epoch: -1,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            txn_start_ms: -1,
            last_update_ms: now_ms,
        }
    }

    /// Appends the binary encoding (the transaction log's payload) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut w = Writer(std::mem::take(out));
        w.str(&self.transactional_id);
        w.0.extend_from_slice(&self.producer_id.to_be_bytes());
        w.0.extend_from_slice(&self.last_producer_id.to_be_bytes());
        w.0.extend_from_slice(&self.producer_epoch.to_be_bytes());
        w.0.extend_from_slice(&self.last_producer_epoch.to_be_bytes());
        w.0.extend_from_slice(&self.timeout_ms.to_be_bytes());
        w.0.push(self.state.to_byte());
        w.0.extend_from_slice(&self.txn_start_ms.to_be_bytes());
        w.0.extend_from_slice(&self.last_update_ms.to_be_bytes());
        w.0.extend_from_slice(&(self.partitions.len() as u32).to_be_bytes());
        for (t, p) in &self.partitions {
            w.str(t);
            w.0.extend_from_slice(&p.to_be_bytes());
        }
        w.0.extend_from_slice(&(self.groups.len() as u32).to_be_bytes());
        for g in &self.groups {
            w.str(g);
        }
        *out = w.0;
    }

    /// Decodes what [`TxnMetadata::encode_into`] wrote; `None` if the bytes are malformed.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let transactional_id = r.str()?;
        let producer_id = r.i64()?;
        let last_producer_id = r.i64()?;
        let producer_epoch = r.i16()?;
        let last_producer_epoch = r.i16()?;
        let timeout_ms = r.i32()?;
        let state = TxnState::from_byte(r.u8()?)?;
        let txn_start_ms = r.i64()?;
        let last_update_ms = r.i64()?;
        let np = r.u32()?;
        let mut partitions = BTreeSet::new();
        for _ in 0..np {
            let t = r.str()?;
            let p = r.i32()?;
            partitions.insert((t, p));
        }
        let ng = r.u32()?;
        let mut groups = BTreeSet::new();
        for _ in 0..ng {
            groups.insert(r.str()?);
        }
        Some(TxnMetadata {
            transactional_id,
            producer_id,
            last_producer_id,
            producer_epoch,
            last_producer_epoch,
            timeout_ms,
            state,
            partitions,
            groups,
            txn_start_ms,
            last_update_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips() {
        let mut m = TxnMetadata::new("tx-1", 7, 60_000, 1234);
        m.state = TxnState::PrepareCommit;
        m.partitions.insert(("a".into(), 0));
        m.partitions.insert(("b".into(), 2));
        m.groups.insert("g".into());
        m.txn_start_ms = 1000;
        let mut buf = Vec::new();
        m.encode_into(&mut buf);
        let mut r = Reader::new(&buf);
        assert_eq!(TxnMetadata::decode(&mut r), Some(m));
        assert!(r.is_empty());
        assert_eq!(
            TxnMetadata::decode(&mut Reader::new(&buf[..buf.len() - 1])),
            None
        );
    }

    #[test]
    fn transitions_follow_the_state_machine() {
        use TxnState::*;
        assert!(Empty.can_transition_to(Ongoing));
        assert!(Ongoing.can_transition_to(PrepareCommit));
        assert!(!Empty.can_transition_to(PrepareCommit));
        assert!(!PrepareCommit.can_transition_to(CompleteAbort));
        assert!(PrepareEpochFence.can_transition_to(PrepareAbort));
        for b in 0..8 {
            assert_eq!(TxnState::from_byte(b).map(TxnState::to_byte), Some(b));
        }
        assert_eq!(TxnState::from_byte(8), None);
    }
}
