//! One partition's log: append with offset assignment and producer checks, reads by offset,
//! high watermark, log start offset and timestamp lookup.

use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use super::batch::{self, BatchFault, BatchHeader};
use super::error::{AppendError, ReadError, StorageError};
use super::producer_state::{ProducerEntry, ProducerStates, SequenceCheck};

/// What a successful append reports back to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset of the first record appended (or, for a duplicate, originally appended).
    pub base_offset: i64,
    /// Offset of the last record appended.
    pub last_offset: i64,
    /// Log append time, or -1 (CreateTime topics).
    pub log_append_time: i64,
    /// The partition's log start offset.
    pub log_start_offset: i64,
    /// The batch repeated one already stored; nothing was appended.
    pub duplicate: bool,
}

#[derive(Debug)]
struct StoredBatch {
    base_offset: i64,
    last_offset: i64,
    max_timestamp: i64,
    bytes: Bytes,
}

#[derive(Debug, Default)]
struct State {
    batches: Vec<StoredBatch>,
    log_start: i64,
    log_end: i64,
    producers: ProducerStates,
    deleted: bool,
}

/// A partition of a topic. Internally synchronized; share it as `Arc<Partition>`.
#[derive(Debug)]
pub struct Partition {
    topic: String,
    index: i32,
    state: Mutex<State>,
}

fn fault_to_error(f: BatchFault) -> AppendError {
    match f {
        BatchFault::Corrupt(m) => AppendError::CorruptMessage(m),
        BatchFault::Invalid(m) => AppendError::InvalidRecord(m),
    }
}

impl Partition {
    pub(crate) fn new(topic: &str, index: i32) -> Self {
        Partition {
            topic: topic.to_string(),
            index,
            state: Mutex::new(State::default()),
        }
    }

    /// The topic this partition belongs to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition index.
    pub fn index(&self) -> i32 {
        self.index
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn mark_deleted(&self) {
        self.lock().deleted = true;
    }

    /// Appends the records field of a Produce request (one or more RecordBatch v2): validates
    /// magic and CRC-32C, runs the idempotent-producer checks, assigns offsets by rewriting
    /// baseOffset only, and stores the bytes.
    pub fn append(&self, records: Bytes) -> Result<AppendOutcome, AppendError> {
        self.append_batches(records, false)
    }

    // onceflow-txn (broker-txn helper): entry point for transaction markers. BEGIN
    /// Appends control batches (transaction markers) the coordinator built; clients may not
    /// write them through [`Partition::append`].
    pub fn append_control(&self, records: Bytes) -> Result<AppendOutcome, AppendError> {
        self.append_batches(records, true)
    }

    fn append_batches(
        &self,
        records: Bytes,
        allow_control: bool,
    ) -> Result<AppendOutcome, AppendError> {
        // onceflow-txn END
        let batches = batch::split_batches(&records).map_err(fault_to_error)?;
        for (_, h) in &batches {
            if h.is_control() && !allow_control {
                return Err(AppendError::InvalidRecord(
                    "clients may not write control batches".into(),
                ));
            }
        }
        let mut st = self.lock();
        if st.deleted {
            return Err(StorageError::UnknownTopic(self.topic.clone()).into());
        }
        let mut staged: Vec<(i64, ProducerEntry)> = Vec::new();
        let mut next = st.log_end;
        let mut assigned: Vec<BatchHeader> = Vec::with_capacity(batches.len());
        for (_, h) in &batches {
            let current = staged
                .iter()
                .rev()
                .find(|(p, _)| *p == h.producer_id)
                .map(|(_, e)| e)
                .or_else(|| st.producers.get(h.producer_id));
            match ProducerStates::check(current, h)? {
                SequenceCheck::Duplicate(m) => {
                    return Ok(AppendOutcome {
                        base_offset: m.base_offset,
                        last_offset: m.last_offset,
                        log_append_time: -1,
                        log_start_offset: st.log_start,
                        duplicate: true,
                    })
                }
                SequenceCheck::Append => {}
            }
            let mut h = *h;
            h.base_offset = next;
            next = h.last_offset() + 1;
            if let Some(e) = ProducerStates::apply(current.cloned(), &h) {
                staged.push((h.producer_id, e));
            }
            assigned.push(h);
        }
        let mut buf = BytesMut::from(&records[..]);
        for ((pos, _), h) in batches.iter().zip(&assigned) {
            batch::set_base_offset(&mut buf[*pos..], h.base_offset);
        }
        let buf = buf.freeze();
        for ((pos, _), h) in batches.iter().zip(&assigned) {
            st.batches.push(StoredBatch {
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
                max_timestamp: h.max_timestamp,
                bytes: buf.slice(*pos..*pos + h.size),
            });
        }
        for (pid, e) in staged {
            st.producers.insert(pid, e);
        }
        let base_offset = st.log_end;
        st.log_end = next;
        Ok(AppendOutcome {
            base_offset,
            last_offset: next - 1,
            log_append_time: -1,
            log_start_offset: st.log_start,
            duplicate: false,
        })
    }

    /// Whole stored batches from the one containing `fetch_offset` up to the high watermark,
    /// at most `max_bytes` except that the first batch is always whole (KIP-74).
    pub fn read(&self, fetch_offset: i64, max_bytes: usize) -> Result<Bytes, ReadError> {
        let st = self.lock();
        if fetch_offset < st.log_start || fetch_offset > st.log_end {
            return Err(ReadError::OffsetOutOfRange {
                log_start: st.log_start,
                high_watermark: st.log_end,
            });
        }
        if fetch_offset == st.log_end {
            return Ok(Bytes::new());
        }
        let first = st.batches.partition_point(|b| b.last_offset < fetch_offset);
        let mut out = BytesMut::new();
        for b in &st.batches[first..] {
            if !out.is_empty() && out.len() + b.bytes.len() > max_bytes {
                break;
            }
            out.extend_from_slice(&b.bytes);
        }
        Ok(out.freeze())
    }

    /// The high watermark: one past the last offset readers may see.
    pub fn high_watermark(&self) -> i64 {
        self.lock().log_end
    }

    /// The first offset still in the log.
    pub fn log_start_offset(&self) -> i64 {
        self.lock().log_start
    }

    /// The first offset whose batch max timestamp is >= `ts`, with that timestamp.
    pub fn offset_for_timestamp(&self, ts: i64) -> Option<(i64, i64)> {
        let st = self.lock();
        st.batches
            .iter()
            .find(|b| b.max_timestamp >= ts)
            .map(|b| (b.base_offset, b.max_timestamp))
    }
}
