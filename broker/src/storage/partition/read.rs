//! The read side of a partition: whole batches by offset (uncommitted and read_committed, with
//! the aborted transactions they overlap), the watermarks and the timestamp lookup.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{CommittedRead, Partition};
use crate::storage::batch;
use crate::storage::error::{ReadError, StorageError};
use crate::storage::segment::{self, HeaderWalker};
use crate::storage::txn_index::{self, AbortedTxn};

/// The last offset of the last whole batch in `records`.
fn last_offset_in(records: &[u8]) -> Option<i64> {
    let mut pos = 0;
    let mut last = None;
    while let Some(Ok(size)) = batch::peek_size(&records[pos..]) {
        let Some(b) = records.get(pos..pos + size) else {
            break;
        };
        if let Ok(h) = batch::parse_header(b) {
            last = Some(h.last_offset());
        }
        pos += size;
    }
    last
}

impl Partition {
    /// Aborted transactions overlapping `[from, to)`, from the persisted index.
    pub fn aborted_transactions(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        txn_index::overlapping(&self.lock().aborted, from, to)
    }

    /// A read_committed fetch: whole batches from the one containing `fetch_offset` below the
    /// last stable offset (limits as [`Partition::read`]), with the aborted transactions that
    /// overlap what is returned. Offsets are range-checked against the high watermark.
    pub fn read_committed(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
    ) -> Result<CommittedRead, ReadError> {
        let (lso, high_watermark, log_start_offset) = {
            let st = self.lock();
            (Self::lso_of(&st), st.high_watermark, st.log_start)
        };
        let records = self.read_until(fetch_offset, max_bytes, lso)?;
        let end = last_offset_in(&records).map_or(fetch_offset, |last| last + 1);
        let aborted = if records.is_empty() {
            Vec::new()
        } else {
            self.aborted_transactions(fetch_offset, end)
        };
        Ok(CommittedRead {
            records,
            aborted,
            last_stable_offset: lso,
            high_watermark,
            log_start_offset,
        })
    }

    /// Whole stored batches from the one containing `fetch_offset` up to the high watermark,
    /// at most `max_bytes` except that the first batch is always whole (KIP-74). Empty when
    /// `fetch_offset` is the high watermark.
    pub fn read(&self, fetch_offset: i64, max_bytes: usize) -> Result<Bytes, ReadError> {
        self.read_until(fetch_offset, max_bytes, i64::MAX)
    }

    /// Like [`Partition::read`], but stops before the first batch at or past `end_offset`
    /// (e.g. the last stable offset for read_committed fetches).
    pub fn read_until(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        end_offset: i64,
    ) -> Result<Bytes, ReadError> {
        let first = self.read_in_segment(fetch_offset, max_bytes, end_offset)?;
        if !batch::only_empty_batches(&first) {
            return Ok(first);
        }
        // A compacted log keeps empty batches (a producer's last batch, a segment's last
        // batch). A response holding nothing else makes librdkafka grow its fetch size and,
        // after ten such responses, report MSG_SIZE_TOO_LARGE: read on to the next records.
        let mut out = BytesMut::from(&first[..]);
        while let Some(next) = last_offset_in(&out).map(|o| o + 1) {
            let more = match self.read_in_segment(next, max_bytes, end_offset) {
                Ok(more) if !more.is_empty() => more,
                _ => break,
            };
            out.extend_from_slice(&more);
            if !batch::only_empty_batches(&more) || out.len() >= max_bytes {
                break;
            }
        }
        Ok(out.freeze())
    }

    /// [`Partition::read_until`] within the segment holding `fetch_offset`.
    fn read_in_segment(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        end_offset: i64,
    ) -> Result<Bytes, ReadError> {
        let (file, path, start, size, limit) = {
            let st = self.lock();
            if fetch_offset < st.log_start || fetch_offset > st.high_watermark {
                return Err(ReadError::OffsetOutOfRange {
                    log_start: st.log_start,
                    high_watermark: st.high_watermark,
                });
            }
            if fetch_offset == st.high_watermark {
                return Ok(Bytes::new());
            }
            let i = st
                .segments
                .partition_point(|s| s.base_offset <= fetch_offset)
                .saturating_sub(1);
            let seg = &st.segments[i];
            let (start, _) = seg.locate(fetch_offset);
            (
                Arc::clone(&seg.log),
                seg.log_path.clone(),
                start,
                seg.size(),
                st.high_watermark.min(end_offset),
            )
        };
        if fetch_offset >= limit {
            return Ok(Bytes::new());
        }
        segment::read_batches(file.as_ref(), start, size, fetch_offset, limit, max_bytes).map_err(
            |e| match e.kind() {
                std::io::ErrorKind::InvalidData => ReadError::Corrupt {
                    path,
                    reason: e.to_string(),
                },
                _ => ReadError::Storage(StorageError::io(path, e)),
            },
        )
    }

    /// The high watermark: one past the last offset readers may see.
    pub fn high_watermark(&self) -> i64 {
        self.lock().high_watermark
    }

    /// Segments in the log, the active one included.
    pub fn segment_count(&self) -> usize {
        self.lock().segments.len()
    }

    /// The first offset still in the log.
    pub fn log_start_offset(&self) -> i64 {
        self.lock().log_start
    }

    /// One past the last offset written (equal to the high watermark except while an
    /// every-batch fsync is in flight).
    pub fn log_end_offset(&self) -> i64 {
        self.lock().log_end
    }

    /// The first batch whose max timestamp is >= `ts`: its base offset (at least the log
    /// start) and max timestamp. `None` if no visible batch qualifies (or the lookup hit an
    /// I/O error, which is logged).
    pub fn offset_for_timestamp(&self, ts: i64) -> Option<(i64, i64)> {
        let st = self.lock();
        for seg in st.segments.iter().filter(|s| s.max_timestamp >= ts) {
            let mut walker = HeaderWalker::new(seg.log.as_ref(), seg.size());
            let mut pos = seg.locate_timestamp(ts);
            loop {
                match walker.header_at(pos) {
                    Ok(Some(Ok(h))) => {
                        if h.base_offset >= st.high_watermark {
                            return None;
                        }
                        // Batches wholly below the log start (DeleteRecords) are gone.
                        if h.max_timestamp >= ts && h.last_offset() >= st.log_start {
                            return Some((h.base_offset.max(st.log_start), h.max_timestamp));
                        }
                        pos += h.size as u64;
                    }
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(file = %seg.log_path.display(), error = %e, "timestamp lookup failed");
                        return None;
                    }
                }
            }
        }
        None
    }
}
