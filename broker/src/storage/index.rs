//! The sparse offset index of a segment: every [`INDEX_INTERVAL_BYTES`] of log, one entry
//! (offset, file position, largest timestamp before it). Reads binary-search it and then walk
//! at most one interval; timestamp lookups use the running maximum.
//!
//! File format (`<base offset>.index`): an 8-byte header `b"OFIDX" 0x00 version(u16 BE)`, then
//! fixed 28-byte entries `offset i64 | position u64 | max_ts_before i64 | crc32c u32` (big
//! endian, CRC over the first 24 bytes). Entries are appended at flush and roll; a torn or
//! corrupt tail is dropped on load and recovery re-scans the log from the last good entry.

/// Bytes of log between index entries.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
/// File header: magic and format version 1.
pub const INDEX_HEADER: [u8; 8] = *b"OFIDX\x00\x00\x01";
/// Size of one persisted entry.
pub const ENTRY_LEN: usize = 28;

/// One index entry: the batch starting at `position` has base offset `offset`, and every batch
/// before it in the segment has a max timestamp <= `max_ts_before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Base offset of the batch at `position`.
    pub offset: i64,
    /// File position of that batch.
    pub position: u64,
    /// Largest batch max timestamp of the segment before this batch (`i64::MIN` if none).
    pub max_ts_before: i64,
}

impl IndexEntry {
    /// Serializes the entry with its CRC.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        out[0..8].copy_from_slice(&self.offset.to_be_bytes());
        out[8..16].copy_from_slice(&self.position.to_be_bytes());
        out[16..24].copy_from_slice(&self.max_ts_before.to_be_bytes());
        let crc = crate::crc32c(&out[..24]);
        out[24..28].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<IndexEntry> {
        let field = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            a
        };
        let crc = u32::from_be_bytes([b[24], b[25], b[26], b[27]]);
        if crate::crc32c(&b[..24]) != crc {
            return None;
        }
        Some(IndexEntry {
            offset: i64::from_be_bytes(field(0)),
            position: u64::from_be_bytes(field(8)),
            max_ts_before: i64::from_be_bytes(field(16)),
        })
    }
}

/// Result of loading an index file.
#[derive(Debug, Default)]
pub struct LoadedIndex {
    /// The entries that passed every check, in order.
    pub entries: Vec<IndexEntry>,
    /// Whether the file had to be cut or ignored (so it must be rewritten).
    pub damaged: bool,
}

/// Decodes an index file, keeping the longest prefix of entries that have good CRCs, offsets
/// from `base_offset` on and strictly increasing, strictly increasing positions below
/// `log_len`, and non-decreasing timestamps.
pub fn load(bytes: Option<&[u8]>, base_offset: i64, log_len: u64) -> LoadedIndex {
    let Some(bytes) = bytes else {
        return LoadedIndex {
            entries: Vec::new(),
            damaged: true,
        };
    };
    if bytes.len() < INDEX_HEADER.len() || bytes[..INDEX_HEADER.len()] != INDEX_HEADER {
        return LoadedIndex {
            entries: Vec::new(),
            damaged: true,
        };
    }
    let body = &bytes[INDEX_HEADER.len()..];
    let mut entries: Vec<IndexEntry> = Vec::with_capacity(body.len() / ENTRY_LEN);
    let mut damaged = body.len() % ENTRY_LEN != 0;
    for chunk in body.chunks_exact(ENTRY_LEN) {
        let Some(e) = IndexEntry::decode(chunk) else {
            damaged = true;
            break;
        };
        let ordered = match entries.last() {
            Some(p) => {
                e.offset > p.offset && e.position > p.position && e.max_ts_before >= p.max_ts_before
            }
            None => e.offset >= base_offset,
        };
        if !ordered || e.position >= log_len {
            damaged = true;
            break;
        }
        entries.push(e);
    }
    LoadedIndex { entries, damaged }
}

/// Serializes a whole index file.
pub fn encode_file(entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(INDEX_HEADER.len() + entries.len() * ENTRY_LEN);
    out.extend_from_slice(&INDEX_HEADER);
    for e in entries {
        out.extend_from_slice(&e.encode());
    }
    out
}

/// The last entry whose offset is <= `offset`.
pub fn floor_by_offset(entries: &[IndexEntry], offset: i64) -> Option<&IndexEntry> {
    let i = entries.partition_point(|e| e.offset <= offset);
    i.checked_sub(1).map(|i| &entries[i])
}

/// The last entry whose `max_ts_before` is < `ts`: every batch before it is older than `ts`.
pub fn floor_by_timestamp(entries: &[IndexEntry], ts: i64) -> Option<&IndexEntry> {
    let i = entries.partition_point(|e| e.max_ts_before < ts);
    i.checked_sub(1).map(|i| &entries[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<IndexEntry> {
        (0..5)
            .map(|i| IndexEntry {
                offset: 100 + i * 10,
                position: 5000 * i as u64 + 10,
                max_ts_before: 1000 + i,
            })
            .collect()
    }

    #[test]
    fn round_trip_and_lookups() {
        let e = entries();
        let file = encode_file(&e);
        let l = load(Some(&file), 100, 1 << 20);
        assert!(!l.damaged);
        assert_eq!(l.entries, e);
        assert_eq!(floor_by_offset(&e, 99), None);
        assert_eq!(floor_by_offset(&e, 125).map(|x| x.offset), Some(120));
        assert_eq!(floor_by_timestamp(&e, 1000), None);
        assert_eq!(floor_by_timestamp(&e, 1003).map(|x| x.offset), Some(120));
    }

    #[test]
    fn damaged_files_keep_good_prefix() {
        let e = entries();
        let mut file = encode_file(&e);
        file.truncate(file.len() - 3);
        let l = load(Some(&file), 100, 1 << 20);
        assert!(l.damaged);
        assert_eq!(l.entries.len(), 4);
        let mut file = encode_file(&e);
        file[8 + ENTRY_LEN * 2 + 3] ^= 1;
        assert_eq!(load(Some(&file), 100, 1 << 20).entries.len(), 2);
        // Positions past the end of the log are not trusted.
        assert_eq!(load(Some(&encode_file(&e)), 100, 10_011).entries.len(), 3);
        assert!(load(Some(b"garbage!"), 100, 1 << 20).damaged);
        assert!(load(None, 100, 1 << 20).damaged);
    }
}
