//! Transaction support in the log: control records (COMMIT/ABORT markers) and the persisted
//! aborted-transaction index that read_committed fetches consult instead of scanning the log.
//!
//! A marker is a control batch (attributes: control + transactional) holding one record whose
//! key is `version i16 = 0, type i16 (0 = ABORT, 1 = COMMIT)` and whose value is
//! `version i16 = 0, coordinator epoch i32`, as in Kafka.
//!
//! `aborted.txnindex` (one per partition) is an 8-byte header `"OFTXN" 0 0 1` followed by 36-byte
//! entries, big endian: `producer id i64 | first offset i64 | last offset i64 (the ABORT marker)
//! | last stable offset i64 (after the abort) | crc32c u32` of the first 32 bytes. Entries are
//! appended in marker order; recovery keeps the valid prefix below the replay start and
//! re-derives the rest from the log.

use bytes::{BufMut, BytesMut};

use super::batch::{
    self, BatchHeader, BatchSpec, RecordSpec, ATTR_CONTROL, ATTR_TRANSACTIONAL, HEADER_LEN,
};

/// Name of the aborted-transaction index file in a partition directory.
pub const TXN_INDEX_FILE: &str = "aborted.txnindex";
/// Header of the aborted-transaction index: magic and format version 1.
pub const TXN_INDEX_HEADER: [u8; 8] = *b"OFTXN\x00\x00\x01";
const ENTRY_LEN: usize = 36;
/// Control record type of an ABORT marker.
pub const CONTROL_ABORT: i16 = 0;
/// Control record type of a COMMIT marker.
pub const CONTROL_COMMIT: i16 = 1;

/// One aborted transaction of a producer on a partition: read_committed consumers drop that
/// producer's transactional records in `[first_offset, last_offset]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// The producer.
    pub producer_id: i64,
    /// First offset of the transaction on this partition.
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
    /// The partition's last stable offset right after the abort (lets lookups stop early).
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    /// Serializes the entry with its CRC.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        out[0..8].copy_from_slice(&self.producer_id.to_be_bytes());
        out[8..16].copy_from_slice(&self.first_offset.to_be_bytes());
        out[16..24].copy_from_slice(&self.last_offset.to_be_bytes());
        out[24..32].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        let crc = crate::crc32c(&out[..32]);
        out[32..36].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<AbortedTxn> {
        let at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            i64::from_be_bytes(a)
        };
        let crc = u32::from_be_bytes([b[32], b[33], b[34], b[35]]);
        (crate::crc32c(&b[..32]) == crc).then(|| AbortedTxn {
            producer_id: at(0),
            first_offset: at(8),
            last_offset: at(16),
            last_stable_offset: at(24),
        })
    }
}

/// Decodes an index file: the longest valid prefix (good CRCs, `first <= last`, markers in
/// increasing offset order) and whether anything had to be dropped.
pub fn load(bytes: Option<&[u8]>) -> (Vec<AbortedTxn>, bool) {
    let Some(bytes) = bytes else {
        return (Vec::new(), false);
    };
    if bytes.len() < TXN_INDEX_HEADER.len() || bytes[..TXN_INDEX_HEADER.len()] != TXN_INDEX_HEADER {
        return (Vec::new(), true);
    }
    let body = &bytes[TXN_INDEX_HEADER.len()..];
    let mut out: Vec<AbortedTxn> = Vec::new();
    let mut damaged = body.len() % ENTRY_LEN != 0;
    for chunk in body.chunks_exact(ENTRY_LEN) {
        match AbortedTxn::decode(chunk) {
            Some(e)
                if e.first_offset <= e.last_offset
                    && out.last().is_none_or(|p| p.last_offset < e.last_offset) =>
            {
                out.push(e)
            }
            _ => {
                damaged = true;
                break;
            }
        }
    }
    (out, damaged)
}

/// Serializes a whole index file.
pub fn encode_file(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = TXN_INDEX_HEADER.to_vec();
    for e in entries {
        out.extend_from_slice(&e.encode());
    }
    out
}

/// The aborted transactions overlapping `[from, to)`: marker at or after `from`, first offset
/// before `to`. `entries` are in marker order.
pub fn overlapping(entries: &[AbortedTxn], from: i64, to: i64) -> Vec<AbortedTxn> {
    let start = entries.partition_point(|e| e.last_offset < from);
    let mut out = Vec::new();
    for e in &entries[start..] {
        if e.first_offset < to {
            out.push(*e);
        }
        // Every later transaction began at or after this entry's last stable offset.
        if e.last_stable_offset >= to {
            break;
        }
    }
    out
}

/// The control record type of an uncompressed control batch (`bytes` = the whole batch):
/// `Some(CONTROL_ABORT | CONTROL_COMMIT | other)`, or `None` if it cannot be read.
pub fn control_type(bytes: &[u8], h: &BatchHeader) -> Option<i16> {
    if !h.is_control() || h.attributes & batch::ATTR_COMPRESSION_MASK != 0 {
        return None;
    }
    let mut pos = HEADER_LEN;
    let _record_len = read_varint(bytes, &mut pos)?;
    pos += 1; // record attributes
    let _timestamp_delta = read_varint(bytes, &mut pos)?;
    let _offset_delta = read_varint(bytes, &mut pos)?;
    let key_len = read_varint(bytes, &mut pos)?;
    if key_len < 4 {
        return None;
    }
    let key = bytes.get(pos..pos + 4)?;
    Some(i16::from_be_bytes([key[2], key[3]]))
}

/// The coordinator epoch in the value of an uncompressed marker (`bytes` = the whole control
/// batch), or `None` if it cannot be read.
pub fn marker_coordinator_epoch(bytes: &[u8], h: &BatchHeader) -> Option<i32> {
    if !h.is_control() || h.attributes & batch::ATTR_COMPRESSION_MASK != 0 {
        return None;
    }
    let mut pos = HEADER_LEN;
    let _record_len = read_varint(bytes, &mut pos)?;
    pos += 1; // record attributes
    let _timestamp_delta = read_varint(bytes, &mut pos)?;
    let _offset_delta = read_varint(bytes, &mut pos)?;
    let key_len = usize::try_from(read_varint(bytes, &mut pos)?).ok()?;
    pos = pos.checked_add(key_len)?;
    let value_len = read_varint(bytes, &mut pos)?;
    if value_len < 6 {
        return None;
    }
    let value = bytes.get(pos..pos.checked_add(6)?)?;
    Some(i32::from_be_bytes([value[2], value[3], value[4], value[5]]))
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

/// Encodes a COMMIT (`commit`) or ABORT marker for a producer.
pub fn encode_marker(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> BytesMut {
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(if commit {
        CONTROL_COMMIT
    } else {
        CONTROL_ABORT
    });
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    value.put_i32(coordinator_epoch);
    batch::encode_batch(
        BatchSpec {
            base_offset: 0,
            attributes: ATTR_CONTROL | ATTR_TRANSACTIONAL,
            producer_id,
            producer_epoch,
            base_sequence: -1,
        },
        &[RecordSpec {
            timestamp,
            key: Some(&key),
            value: Some(&value),
            headers: Vec::new(),
        }],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse_back() {
        for commit in [true, false] {
            let m = encode_marker(3, 1, commit, 9, 100);
            let h = batch::validate_batch(&m).unwrap();
            assert!(h.is_control() && h.is_transactional());
            let want = if commit {
                CONTROL_COMMIT
            } else {
                CONTROL_ABORT
            };
            assert_eq!(control_type(&m, &h), Some(want));
            assert_eq!(marker_coordinator_epoch(&m, &h), Some(9));
        }
    }

    #[test]
    fn index_round_trip_damage_and_overlap() {
        let e = |pid, first, last, lso| AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        };
        let entries = vec![e(1, 0, 10, 5), e(2, 5, 20, 21), e(3, 30, 40, 41)];
        let file = encode_file(&entries);
        assert_eq!(load(Some(&file)), (entries.clone(), false));
        let mut bad = file.clone();
        bad[8 + ENTRY_LEN + 5] ^= 1;
        assert_eq!(load(Some(&bad)), (entries[..1].to_vec(), true));
        assert_eq!(load(Some(&file[..file.len() - 1])).0.len(), 2);
        assert_eq!(load(None), (Vec::new(), false));
        assert!(load(Some(b"junkjunk")).1);
        assert_eq!(overlapping(&entries, 0, 3), vec![entries[0]]);
        assert_eq!(overlapping(&entries, 11, 25), vec![entries[1]]);
        assert_eq!(overlapping(&entries, 0, 100), entries);
        assert_eq!(overlapping(&entries, 41, 100), vec![]);
    }
}
