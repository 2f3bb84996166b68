//! One cleaning pass over a partition: take the cleanable segments (closed, entirely below
//! the last stable offset and the high watermark), build the key map over them, filter every
//! batch with [`rules::Filter`], write each changed segment's cleaned copy and swap it in
//! ([`swap`]), oldest first, one segment at a time (memory holds one cleaned segment).
//!
//! Oldest first, one completed swap at a time, keeps every crash state consistent: a
//! tombstone (or marker) is only removed in a segment at or after the ones holding the
//! records it superseded, which were swapped before it.
//!
//! Reads of the segments happen without the partition lock (closed segments never change
//! but by this cleaner, and an open handle keeps reading a file retention deleted). The lock
//! is taken for the swap, which first checks that the segment is still in the log with the
//! same file; if not (deleted meanwhile), the cleaned copy is dropped and the pass ends.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};

use super::rules::{self, AbortedRanges, FilterStats, KeyMap, Verdict};
use super::{records, swap};
use crate::storage::backend::BackendFile;
use crate::storage::batch::{self, BatchHeader};
use crate::storage::error::StorageError;
use crate::storage::index::{IndexEntry, INDEX_INTERVAL_BYTES};
use crate::storage::partition::{LogState, Partition};
use crate::storage::segment::{self, Segment};
use crate::storage::txn_index::{self, AbortedTxn};

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Segments in the cleanable range.
    pub segments: usize,
    /// Segments rewritten and swapped in.
    pub segments_rewritten: usize,
    /// Bytes of the cleanable range (read twice: key map, then filtering).
    pub bytes_read: u64,
    /// Bytes of the cleaned segments written.
    pub bytes_written: u64,
    /// Records kept and removed, batches removed.
    pub stats: FilterStats,
    /// One past the last offset of the cleanable range.
    pub cleaned_up_to: i64,
    /// When another pass may remove more (ms since the epoch), if ever without new data.
    pub next_due: Option<i64>,
    /// Wall time of the pass in microseconds.
    pub micros: u64,
}

/// A closed segment as the pass saw it.
#[derive(Debug, Clone)]
pub(crate) struct SegmentRef {
    pub base: i64,
    pub next_offset: i64,
    pub size: u64,
    pub file: Arc<dyn BackendFile>,
}

/// Closed segments entirely below the last stable offset and the high watermark.
pub(crate) fn cleanable(st: &LogState) -> Vec<SegmentRef> {
    let lso = st
        .producers
        .iter()
        .filter_map(|(_, e)| e.txn_first_offset)
        .fold(st.high_watermark, i64::min);
    let closed = st.segments.len().saturating_sub(1);
    st.segments[..closed]
        .iter()
        .take_while(|s| s.next_offset <= lso)
        .map(|s| SegmentRef {
            base: s.base_offset,
            next_offset: s.next_offset,
            size: s.size(),
            file: Arc::clone(&s.log),
        })
        .collect()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn corrupt(p: &Partition, reason: String) -> StorageError {
    StorageError::Corrupt {
        path: p.dir().to_path_buf(),
        reason: format!("cleaner: {reason}"),
    }
}

/// The batches of a whole segment: (position, header). A segment the cleaner cannot walk is
/// an error (it is left alone; reads and recovery report the damage).
fn batches(p: &Partition, bytes: &[u8]) -> Result<Vec<(usize, BatchHeader)>, StorageError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let size = match batch::peek_size(&bytes[pos..]) {
            Some(Ok(size)) if pos + size <= bytes.len() => size,
            _ => return Err(corrupt(p, format!("no whole batch at byte {pos}"))),
        };
        let h = batch::validate_batch(&bytes[pos..pos + size])
            .map_err(|f| corrupt(p, format!("batch at byte {pos}: {f}")))?;
        out.push((pos, h));
        pos += size;
    }
    Ok(out)
}

fn read_all(p: &Partition, s: &SegmentRef) -> Result<Bytes, StorageError> {
    let len = usize::try_from(s.size).unwrap_or(usize::MAX);
    s.file
        .read_at(0, len)
        .map_err(|e| StorageError::io(p.dir().join(segment::file_name(s.base, "log")), e))
}

/// Cleans `p` once at `now_ms`; `None` if the partition has no cleanable segment.
pub fn clean(p: &Partition, now_ms: i64) -> Result<Option<CleanReport>, StorageError> {
    let started = Instant::now();
    let config = p.log_config();
    let (segs, aborted, last) = {
        let st = p.lock_state();
        if st.deleted || st.failed.is_some() {
            return Ok(None);
        }
        (
            cleanable(&st),
            st.aborted.clone(),
            rules::last_batches(&st.producers),
        )
    };
    let Some(end) = segs.last().map(|s| s.next_offset) else {
        return Ok(None);
    };
    let mut report = CleanReport {
        segments: segs.len(),
        cleaned_up_to: end,
        ..CleanReport::default()
    };
    let ranges = AbortedRanges::new(&aborted);
    let mut keys = KeyMap::default();
    for s in &segs {
        let bytes = read_all(p, s)?;
        report.bytes_read += bytes.len() as u64;
        for (pos, h) in batches(p, &bytes)? {
            keys.add(&bytes[pos..pos + h.size], &h, &ranges)
                .map_err(|e| corrupt(p, e.to_string()))?;
        }
    }
    let mut filter = rules::Filter::new(now_ms, config.delete_retention_ms, &keys, &ranges, &last);
    for s in &segs {
        let bytes = read_all(p, s)?;
        report.bytes_read += bytes.len() as u64;
        let list = batches(p, &bytes)?;
        let mut w = SegmentWriter::new(bytes.len());
        let mut changed = false;
        for (pos, h) in &list {
            let stored = &bytes[*pos..*pos + h.size];
            let verdict = filter
                .batch(stored, h, false)
                .map_err(|e| corrupt(p, e.to_string()))?;
            match verdict {
                Verdict::Keep => w.push(stored, h),
                Verdict::Rewrite(b) => {
                    w.push(&b, h);
                    changed = true;
                }
                Verdict::Remove => w.remove(h),
            }
        }
        w.close_gap(s.next_offset);
        changed |= w.changed;
        let removed_aborts = std::mem::take(&mut filter.removed_aborts);
        if !removed_aborts.is_empty() {
            // Before the swap that removes their markers (the transactions' data is already
            // gone from the log): an entry must never outlive its marker.
            prune_aborted(p, &removed_aborts)?;
        }
        if changed {
            if !swap_in(p, s, &w.out, w.index, w.max_ts)? {
                break;
            }
            report.segments_rewritten += 1;
            report.bytes_written += w.out.len() as u64;
        }
    }
    report.stats = filter.stats;
    report.next_due = filter.next_due;
    report.micros = started.elapsed().as_micros() as u64;
    Ok(Some(report))
}

/// Builds a cleaned segment: kept batches, fillers for runs of removed ones, the index.
struct SegmentWriter {
    out: BytesMut,
    index: Vec<IndexEntry>,
    max_ts: i64,
    last_entry_pos: u64,
    /// First offset of the run of removed batches not yet covered by a filler.
    gap: Option<i64>,
    /// Batches in that run, and whether it is one filler of an earlier pass (written back
    /// unchanged).
    gap_batches: usize,
    gap_is_filler: bool,
    /// The output differs from the input by removed batches.
    changed: bool,
}

impl SegmentWriter {
    fn new(capacity: usize) -> Self {
        SegmentWriter {
            out: BytesMut::with_capacity(capacity),
            index: Vec::new(),
            max_ts: i64::MIN,
            last_entry_pos: 0,
            gap: None,
            gap_batches: 0,
            gap_is_filler: false,
            changed: false,
        }
    }

    fn push(&mut self, b: &[u8], h: &BatchHeader) {
        self.close_gap(h.base_offset);
        self.append(b, h);
    }

    fn append(&mut self, b: &[u8], h: &BatchHeader) {
        let at = self.out.len() as u64;
        if at >= self.last_entry_pos + INDEX_INTERVAL_BYTES {
            self.index.push(IndexEntry {
                offset: h.base_offset,
                position: at,
                max_ts_before: self.max_ts,
            });
            self.last_entry_pos = at;
        }
        self.max_ts = self.max_ts.max(h.max_timestamp);
        self.out.extend_from_slice(b);
    }

    fn remove(&mut self, h: &BatchHeader) {
        self.gap.get_or_insert(h.base_offset);
        self.gap_batches += 1;
        self.gap_is_filler = self.gap_batches == 1 && is_filler(h);
    }

    /// Covers the removed run before `until` with a filler.
    fn close_gap(&mut self, until: i64) {
        if let Some(from) = self.gap.take() {
            self.changed |= !self.gap_is_filler;
            self.gap_batches = 0;
            self.gap_is_filler = false;
            let f = records::filler(from, until - 1);
            let mut pos = 0;
            while let Ok(fh) = batch::parse_header(&f[pos..]) {
                let end = pos + fh.size;
                self.append(&f[pos..end], &fh);
                pos = end;
                if pos >= f.len() {
                    break;
                }
            }
        }
    }
}

/// Whether `h` is a filler batch an earlier pass wrote ([`records::filler`]).
fn is_filler(h: &BatchHeader) -> bool {
    h.record_count == 0 && h.attributes == 0 && !h.has_producer_id() && h.base_timestamp == -1
}

/// Drops the aborted-index entries of removed ABORT markers, rewriting the file atomically.
fn prune_aborted(p: &Partition, removed: &[(i64, i64)]) -> Result<(), StorageError> {
    let mut st = p.lock_state();
    if st.deleted {
        return Ok(());
    }
    let before = st.aborted.len();
    st.aborted
        .retain(|a: &AbortedTxn| !removed.contains(&(a.producer_id, a.last_offset)));
    if st.aborted.len() == before {
        return Ok(());
    }
    let path = p.dir().join(txn_index::TXN_INDEX_FILE);
    let backend = p.backend();
    backend
        .write_file_atomic(&path, &txn_index::encode_file(&st.aborted))
        .map_err(|e| StorageError::io(&path, e))?;
    st.txn_index = backend
        .open(&path)
        .map_err(|e| StorageError::io(&path, e))?;
    st.txn_index_unsynced = false;
    Ok(())
}

/// Writes the cleaned copy of `s` and swaps it in. `false` if the segment left the log
/// meanwhile (the copy is dropped).
fn swap_in(
    p: &Partition,
    s: &SegmentRef,
    bytes: &[u8],
    index: Vec<IndexEntry>,
    max_ts: i64,
) -> Result<bool, StorageError> {
    let backend = Arc::clone(p.backend());
    let dir = p.dir();
    let io_err = |e| StorageError::io(dir.join(segment::file_name(s.base, "log")), e);
    swap::write_cleaned(backend.as_ref(), dir, s.base, bytes).map_err(io_err)?;
    swap::promote(backend.as_ref(), dir, s.base).map_err(io_err)?;
    let mut st = p.lock_state();
    let closed = st.segments.len().saturating_sub(1);
    let found = st.segments[..closed]
        .iter()
        .position(|seg| seg.base_offset == s.base && Arc::ptr_eq(&seg.log, &s.file));
    let Some(i) = found.filter(|_| !st.deleted) else {
        drop(st);
        tracing::info!(
            topic = p.topic(),
            partition = p.index(),
            base_offset = s.base,
            "segment left the log during cleaning; dropping its cleaned copy"
        );
        swap::discard(backend.as_ref(), dir, s.base).map_err(io_err)?;
        return Ok(false);
    };
    swap::install(backend.as_ref(), dir, s.base).map_err(io_err)?;
    let log_path = dir.join(segment::file_name(s.base, "log"));
    let file = backend
        .open(&log_path)
        .map_err(|e| StorageError::io(&log_path, e))?;
    let seg = Segment::recovered(
        backend.as_ref(),
        dir,
        s.base,
        s.next_offset,
        max_ts,
        file,
        index,
        true,
    )
    .map_err(io_err)?;
    st.segments[i] = seg;
    Ok(true)
}
