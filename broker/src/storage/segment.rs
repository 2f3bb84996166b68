//! A segment: one append-only `<base offset>.log` file of RecordBatch v2 bytes and its sparse
//! `<base offset>.index`. Holds the scanning primitives used by reads (header walks) and by
//! recovery (validating scans with CRC checks).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::backend::{BackendFile, StorageBackend};
use super::batch::{self, BatchFault, BatchHeader, HEADER_LEN, LOG_OVERHEAD};
use super::index::{self, IndexEntry, INDEX_HEADER, INDEX_INTERVAL_BYTES};

/// Width of the zero-padded base offset in file names (Kafka's).
const NAME_DIGITS: usize = 20;
/// Read-ahead of header walks.
const WALK_WINDOW: usize = 32 * 1024;
/// Chunk size of validating scans.
const SCAN_CHUNK: usize = 1024 * 1024;

/// `00000000000000000042.log` for base offset 42 and extension "log".
pub fn file_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:0width$}.{ext}", width = NAME_DIGITS)
}

/// Parses a file name made by [`file_name`]: `(base offset, extension)`.
pub fn parse_file_name(name: &str) -> Option<(i64, &str)> {
    let (stem, ext) = name.split_once('.')?;
    if stem.len() != NAME_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, ext))
}

/// One segment of a partition's log.
#[derive(Debug)]
pub struct Segment {
    /// First offset the segment may hold.
    pub base_offset: i64,
    /// One past the last offset stored.
    pub next_offset: i64,
    /// Largest batch max timestamp stored (`i64::MIN` when empty).
    pub max_timestamp: i64,
    /// The log file.
    pub log: Arc<dyn BackendFile>,
    /// Path of the log file (for messages).
    pub log_path: PathBuf,
    /// The in-memory sparse index.
    pub index: Vec<IndexEntry>,
    index_file: Arc<dyn BackendFile>,
    index_path: PathBuf,
    index_persisted: usize,
    last_entry_pos: u64,
}

impl Segment {
    /// Creates a new empty segment (the caller syncs the directory).
    pub fn create(
        backend: &dyn StorageBackend,
        dir: &Path,
        base_offset: i64,
    ) -> io::Result<Segment> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let index_path = dir.join(file_name(base_offset, "index"));
        let log = backend.open(&log_path)?;
        log.truncate(0)?;
        // The index needs no fsync here: recovery validates it and rebuilds what is missing.
        let index_file = backend.open(&index_path)?;
        index_file.truncate(0)?;
        index_file.append(&INDEX_HEADER)?;
        Ok(Segment {
            base_offset,
            next_offset: base_offset,
            max_timestamp: i64::MIN,
            log,
            log_path,
            index: Vec::new(),
            index_file,
            index_path,
            index_persisted: 0,
            last_entry_pos: 0,
        })
    }

    /// Assembles a recovered segment whose log has been validated up to its current length.
    /// Rewrites the index file when `rewrite_index` (it was missing, damaged or extended).
    #[allow(clippy::too_many_arguments)]
    pub fn recovered(
        backend: &dyn StorageBackend,
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        max_timestamp: i64,
        log: Arc<dyn BackendFile>,
        index: Vec<IndexEntry>,
        rewrite_index: bool,
    ) -> io::Result<Segment> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let index_path = dir.join(file_name(base_offset, "index"));
        if rewrite_index {
            backend.write_file_atomic(&index_path, &index::encode_file(&index))?;
        }
        let index_file = backend.open(&index_path)?;
        let last_entry_pos = index.last().map_or(0, |e| e.position);
        Ok(Segment {
            base_offset,
            next_offset,
            max_timestamp,
            log,
            log_path,
            index_persisted: index.len(),
            index,
            index_file,
            index_path,
            last_entry_pos,
        })
    }

    /// Bytes in the log file.
    pub fn size(&self) -> u64 {
        self.log.len()
    }

    /// Records a batch just written at `pos`: index entry every interval, offsets, timestamps.
    pub fn note_batch(&mut self, pos: u64, h: &BatchHeader) {
        if pos >= self.last_entry_pos + INDEX_INTERVAL_BYTES {
            self.index.push(IndexEntry {
                offset: h.base_offset,
                position: pos,
                max_ts_before: self.max_timestamp,
            });
            self.last_entry_pos = pos;
        }
        self.next_offset = h.last_offset() + 1;
        self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
    }

    /// Appends every index entry not yet in the index file to it, then fsyncs the file.
    pub fn persist_index(&mut self) -> io::Result<()> {
        self.persist_index_below(i64::MAX)
    }

    /// Appends the index entries not yet in the file whose batches start below `end`, then
    /// fsyncs the file. Call it with the end of the data known durable, so that persisted
    /// entries never point past durable data.
    pub fn persist_index_below(&mut self, end: i64) -> io::Result<()> {
        let pending = &self.index[self.index_persisted..];
        let upto = self.index_persisted + pending.partition_point(|e| e.offset < end);
        if upto == self.index_persisted {
            return Ok(());
        }
        let mut buf = Vec::with_capacity((upto - self.index_persisted) * index::ENTRY_LEN);
        for e in &self.index[self.index_persisted..upto] {
            buf.extend_from_slice(&e.encode());
        }
        self.index_file.append(&buf)?;
        self.index_file.sync()?;
        self.index_persisted = upto;
        Ok(())
    }

    /// Drops index entries at or beyond `len` bytes after the log was cut there (failed append).
    pub fn forget_beyond(&mut self, len: u64, next_offset: i64, max_timestamp: i64) {
        while self.index.last().is_some_and(|e| e.position >= len) {
            self.index.pop();
        }
        self.index_persisted = self.index_persisted.min(self.index.len());
        self.last_entry_pos = self.index.last().map_or(0, |e| e.position);
        self.next_offset = next_offset;
        self.max_timestamp = max_timestamp;
    }

    /// Where to start walking to find `offset`: (position, base offset there).
    pub fn locate(&self, offset: i64) -> (u64, i64) {
        index::floor_by_offset(&self.index, offset)
            .map_or((0, self.base_offset), |e| (e.position, e.offset))
    }

    /// Where to start walking to find the first batch with max timestamp >= `ts`.
    pub fn locate_timestamp(&self, ts: i64) -> u64 {
        index::floor_by_timestamp(&self.index, ts).map_or(0, |e| e.position)
    }

    /// Paths of this segment's files.
    pub fn paths(&self) -> [&Path; 2] {
        [&self.log_path, &self.index_path]
    }
}

/// Reads batch headers one after another through a read-ahead window.
pub struct HeaderWalker<'a> {
    file: &'a dyn BackendFile,
    limit: u64,
    window: Bytes,
    window_pos: u64,
}

impl<'a> HeaderWalker<'a> {
    /// Walks `file` up to `limit` bytes.
    pub fn new(file: &'a dyn BackendFile, limit: u64) -> Self {
        HeaderWalker {
            file,
            limit,
            window: Bytes::new(),
            window_pos: 0,
        }
    }

    /// The header of the batch at `pos`; `None` if no complete batch starts there (end of
    /// the walked range, or a batch extending past it).
    pub fn header_at(&mut self, pos: u64) -> io::Result<Option<Result<BatchHeader, BatchFault>>> {
        if pos + HEADER_LEN as u64 > self.limit {
            return Ok(None);
        }
        let in_window = pos >= self.window_pos
            && pos + HEADER_LEN as u64 <= self.window_pos + self.window.len() as u64;
        if !in_window {
            let want = (self.limit - pos).min(WALK_WINDOW as u64) as usize;
            self.window = self.file.read_at(pos, want)?;
            self.window_pos = pos;
            if self.window.len() < HEADER_LEN {
                return Ok(None);
            }
        }
        let at = (pos - self.window_pos) as usize;
        let h = batch::parse_header(&self.window[at..at + HEADER_LEN]);
        if let Ok(h) = &h {
            if pos + h.size as u64 > self.limit {
                return Ok(None);
            }
        }
        Ok(Some(h))
    }

    /// Bytes `from..to` if the read-ahead window already holds them (a share of it, not a
    /// copy), so a caller that walked a short range need not read it again.
    fn window_slice(&self, from: u64, to: u64) -> Option<Bytes> {
        let end = self.window_pos + self.window.len() as u64;
        (from >= self.window_pos && to <= end).then(|| {
            self.window
                .slice((from - self.window_pos) as usize..(to - self.window_pos) as usize)
        })
    }
}

/// Reads whole batches for a fetch: from the batch containing `fetch_offset` (walking from
/// `start_pos`), stopping before any batch at or past `limit_offset` or past `size_limit` bytes,
/// at most `max_bytes` except that the first batch is always whole.
pub fn read_batches(
    file: &dyn BackendFile,
    start_pos: u64,
    size_limit: u64,
    fetch_offset: i64,
    limit_offset: i64,
    max_bytes: usize,
) -> io::Result<Bytes> {
    let mut walker = HeaderWalker::new(file, size_limit);
    let mut pos = start_pos;
    let first = loop {
        match walker.header_at(pos)? {
            None | Some(Err(_)) => return Ok(Bytes::new()),
            Some(Ok(h)) if h.last_offset() >= fetch_offset => break h,
            Some(Ok(h)) => pos += h.size as u64,
        }
    };
    if first.base_offset >= limit_offset {
        return Ok(Bytes::new());
    }
    // Walk the headers to the end of what is served before reading any batch bytes: the
    // batches below `limit_offset` that fit in `max_bytes` (the first one always). Reading
    // `max_bytes` blindly and cutting afterwards copied the bytes past the cut on every read,
    // and a read_committed fetch whose last stable offset trails an open transaction cut
    // most of them (each such fetch read a full `max_bytes` to serve a few batches).
    let budget = (first.size as u64).max(max_bytes as u64);
    let mut end = pos + first.size as u64;
    while end - pos < budget {
        match walker.header_at(end)? {
            Some(Ok(h)) if h.base_offset < limit_offset && end + h.size as u64 - pos <= budget => {
                end += h.size as u64;
            }
            _ => break,
        }
    }
    // a range within the walk's last window (a short read near the log end) is not read twice
    let buf = match walker.window_slice(pos, end) {
        Some(buf) => buf,
        None => file.read_at(pos, usize::try_from(end - pos).unwrap_or(usize::MAX))?,
    };
    let mut cut = 0usize;
    while cut + LOG_OVERHEAD <= buf.len() {
        let Some(Ok(size)) = batch::peek_size(&buf[cut..]) else {
            break;
        };
        if cut + size > buf.len() {
            break;
        }
        let mut base = [0u8; 8];
        base.copy_from_slice(&buf[cut..cut + 8]);
        if i64::from_be_bytes(base) >= limit_offset {
            break;
        }
        // Clients may not check CRCs (librdkafka does not by default): a batch that fails
        // validation is never served. The valid batches before it are; a fetch that starts at
        // it gets an error.
        if let Err(fault) = batch::validate_batch(&buf[cut..cut + size]) {
            if cut > 0 {
                break;
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "stored batch at byte {} (base offset {}) fails validation, not served: \
                     {fault}",
                    pos,
                    i64::from_be_bytes(base)
                ),
            ));
        }
        cut += size;
    }
    Ok(buf.slice(..cut))
}

/// Where the first valid batch with base offset `>= min_offset` starts in `tail` (bytes of a
/// segment after a fault), if any: `(index in tail, base offset)`. Tries every byte position;
/// positions without magic 2 or whose length runs past the end are rejected without hashing.
pub fn resync(tail: &[u8], min_offset: i64) -> Option<(usize, i64)> {
    (1..tail.len().saturating_sub(HEADER_LEN - 1)).find_map(|q| {
        let rest = &tail[q..];
        if rest[16] != 2 {
            return None;
        }
        let size = batch::peek_size(rest)?.ok()?;
        let h = batch::validate_batch(rest.get(..size)?).ok()?;
        (h.base_offset >= min_offset).then_some((q, h.base_offset))
    })
}

/// How a validating scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEnd {
    /// End of the last valid batch.
    pub valid_end: u64,
    /// One past the last valid batch's last offset.
    pub next_offset: i64,
    /// Why the scan stopped before the end of the file, if it did.
    pub fault: Option<String>,
}

/// Scans `file` from `pos`, where a batch with base offset `offset` should start, validating
/// each batch (length, magic, CRC-32C, contiguous offsets) and calling `f(position, header)`.
pub fn scan_validate(
    file: &dyn BackendFile,
    mut pos: u64,
    mut offset: i64,
    mut f: impl FnMut(u64, &BatchHeader),
) -> io::Result<ScanEnd> {
    let len = file.len();
    let mut buf = Bytes::new();
    let mut buf_pos = pos;
    let fault = loop {
        if pos >= len {
            break None;
        }
        let need_header = pos + LOG_OVERHEAD as u64;
        if need_header > len {
            break Some(format!("{} stray bytes", len - pos));
        }
        if pos < buf_pos || need_header > buf_pos + buf.len() as u64 {
            buf = file.read_at(pos, SCAN_CHUNK.min((len - pos) as usize))?;
            buf_pos = pos;
        }
        let at = (pos - buf_pos) as usize;
        let size = match batch::peek_size(&buf[at..]) {
            Some(Ok(size)) => size,
            Some(Err(e)) => break Some(e.to_string()),
            None => break Some("short batch header".into()),
        };
        if pos + size as u64 > len {
            break Some(format!(
                "batch of {size} bytes extends past the end of the file"
            ));
        }
        if at + size > buf.len() {
            buf = file.read_at(pos, size.max(SCAN_CHUNK.min((len - pos) as usize)))?;
            buf_pos = pos;
        }
        let at = (pos - buf_pos) as usize;
        if at + size > buf.len() {
            break Some("file shrank during the scan".into());
        }
        let h = match batch::validate_batch(&buf[at..at + size]) {
            Ok(h) => h,
            Err(e) => break Some(e.to_string()),
        };
        if h.base_offset != offset {
            break Some(format!(
                "batch has base offset {}, expected {offset}",
                h.base_offset
            ));
        }
        f(pos, &h);
        pos += size as u64;
        offset = h.last_offset() + 1;
    };
    Ok(ScanEnd {
        valid_end: pos,
        next_offset: offset,
        fault,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::{encode_batch, set_base_offset, BatchSpec, RecordSpec};
    use crate::storage::memory::MemBackend;

    fn write_batches(file: &dyn BackendFile, n: i64, recs: usize) -> Vec<u64> {
        let mut positions = Vec::new();
        for i in 0..n {
            let mut b = encode_batch(BatchSpec::default(), &vec![RecordSpec::default(); recs]);
            set_base_offset(&mut b, i * recs as i64);
            positions.push(file.append(&b).unwrap());
        }
        positions
    }

    /// A flush persists only the index entries of batches below what its fsyncs made
    /// durable; the others follow at a later one.
    #[test]
    fn index_entries_persist_only_below_the_durable_end() {
        let b = MemBackend::new();
        let dir = Path::new("/p");
        b.create_dir_all(dir).unwrap();
        let mut seg = Segment::create(&b, dir, 0).unwrap();
        seg.index = (0..4)
            .map(|i| IndexEntry {
                offset: i * 10,
                position: i as u64 * 5000,
                max_ts_before: i64::MIN,
            })
            .collect();
        let in_file = || {
            let bytes = b.read_file(&dir.join(file_name(0, "index"))).unwrap();
            let loaded = index::load(bytes.as_deref(), 0, u64::MAX);
            loaded.entries.iter().map(|e| e.offset).collect::<Vec<_>>()
        };
        seg.persist_index_below(20).unwrap();
        assert_eq!(in_file(), [0, 10]);
        seg.persist_index_below(20).unwrap();
        assert_eq!(in_file(), [0, 10], "nothing new below 20");
        seg.persist_index_below(25).unwrap();
        assert_eq!(in_file(), [0, 10, 20]);
        seg.persist_index().unwrap();
        assert_eq!(in_file(), [0, 10, 20, 30]);
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(file_name(42, "log"), "00000000000000000042.log");
        assert_eq!(
            parse_file_name("00000000000000000042.log"),
            Some((42, "log"))
        );
        assert_eq!(parse_file_name("42.log"), None);
        assert_eq!(parse_file_name("0000000000000000004x.log"), None);
    }

    #[test]
    fn scan_stops_at_torn_tail_and_read_respects_limits() {
        let b = MemBackend::new();
        b.create_dir_all(Path::new("/p")).unwrap();
        let f = b.open(Path::new("/p/x.log")).unwrap();
        let pos = write_batches(f.as_ref(), 10, 3);
        let good = f.len();
        f.append(&[1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 1, 0]).unwrap();
        let mut seen = 0;
        let end = scan_validate(f.as_ref(), 0, 0, |_, _| seen += 1).unwrap();
        assert_eq!((seen, end.valid_end, end.next_offset), (10, good, 30));
        assert!(end.fault.is_some());
        // Batch containing offset 7 starts at pos[2]; stop before offset 15 (batch 5).
        let out = read_batches(f.as_ref(), 0, good, 7, 15, 1 << 20).unwrap();
        assert_eq!(out.len() as u64, pos[5] - pos[2]);
        // max_bytes 1 still yields the first whole batch.
        let out = read_batches(f.as_ref(), pos[1], good, 7, 30, 1).unwrap();
        assert_eq!(out.len() as u64, pos[3] - pos[2]);
        assert!(read_batches(f.as_ref(), 0, good, 30, 30, 100)
            .unwrap()
            .is_empty());
    }

    /// A file that records the length of every read asked of it.
    #[derive(Debug)]
    struct ReadLog {
        inner: Arc<dyn BackendFile>,
        reads: parking_lot::Mutex<Vec<usize>>,
    }

    impl BackendFile for ReadLog {
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn append(&self, data: &[u8]) -> io::Result<u64> {
            self.inner.append(data)
        }
        fn append_parts(&self, parts: &[&[u8]]) -> io::Result<u64> {
            self.inner.append_parts(parts)
        }
        fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
            self.reads.lock().push(len);
            self.inner.read_at(pos, len)
        }
        fn sync(&self) -> io::Result<()> {
            self.inner.sync()
        }
        fn truncate(&self, len: u64) -> io::Result<()> {
            self.inner.truncate(len)
        }
    }

    #[test]
    fn a_read_copies_only_the_batches_it_serves() {
        let b = MemBackend::new();
        b.create_dir_all(Path::new("/p")).unwrap();
        let f = ReadLog {
            inner: b.open(Path::new("/p/x.log")).unwrap(),
            reads: Default::default(),
        };
        // 40 batches of about 40 KiB, each larger than the header walk's read-ahead window
        let mut pos = Vec::new();
        let value = vec![7u8; 40 * 1024];
        for i in 0..40i64 {
            let rec = RecordSpec {
                value: Some(&value),
                ..RecordSpec::default()
            };
            let mut batch = encode_batch(BatchSpec::default(), &[rec]);
            set_base_offset(&mut batch, i);
            pos.push(f.append(&batch).unwrap());
        }
        let size = f.len();
        // the limit (a last stable offset) at batch 12: 10 batches served, the 28 after the
        // limit are not read
        f.reads.lock().clear();
        let out = read_batches(&f, pos[2], size, 2, 12, 1 << 20).unwrap();
        assert_eq!(out.len() as u64, pos[12] - pos[2]);
        let reads = f.reads.lock().clone();
        assert_eq!(reads.iter().max(), Some(&out.len()), "reads: {reads:?}");
        assert!(
            reads.iter().sum::<usize>() <= out.len() + 11 * WALK_WINDOW,
            "reads: {reads:?}"
        );
        // max_bytes cuts at a whole batch as before
        let out = read_batches(&f, pos[2], size, 2, 40, (pos[5] - pos[2]) as usize + 100).unwrap();
        assert_eq!(out.len() as u64, pos[5] - pos[2]);
    }
}
