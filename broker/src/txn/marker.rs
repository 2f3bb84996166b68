//! Transaction markers: the control batches (COMMIT / ABORT) written to every partition of a
//! finished transaction, built by hand as Kafka lays them out, and parsed back on recovery.
//!
//! A marker is a RecordBatch v2 with the control and transactional attribute bits, the
//! producer's id and epoch, base sequence -1, and one record whose key is
//! `version: i16 = 0, type: i16 (0 abort, 1 commit)` and whose value is
//! `version: i16 = 0, coordinator_epoch: i32`.

use bytes::Bytes;

use crate::storage::batch::{
    encode_batch, BatchHeader, BatchSpec, RecordSpec, ATTR_CONTROL, ATTR_TRANSACTIONAL, HEADER_LEN,
};

/// Control record type of an ABORT marker.
pub const CONTROL_TYPE_ABORT: i16 = 0;
/// Control record type of a COMMIT marker.
pub const CONTROL_TYPE_COMMIT: i16 = 1;

/// Which way a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// The transaction's data becomes visible to read_committed readers.
    Commit,
    /// The transaction's data is skipped by read_committed readers.
    Abort,
}

impl MarkerKind {
    /// `Commit` for true, `Abort` for false.
    pub fn from_commit(commit: bool) -> Self {
        if commit {
            MarkerKind::Commit
        } else {
            MarkerKind::Abort
        }
    }

    /// The control record type written in the marker's key.
    pub fn control_type(self) -> i16 {
        match self {
            MarkerKind::Commit => CONTROL_TYPE_COMMIT,
            MarkerKind::Abort => CONTROL_TYPE_ABORT,
        }
    }
}

/// Builds the marker batch for one partition. The base offset is 0: the store assigns it.
pub fn build_marker(
    kind: MarkerKind,
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    timestamp_ms: i64,
) -> Bytes {
    let mut key = [0u8; 4];
    key[2..4].copy_from_slice(&kind.control_type().to_be_bytes());
    let mut value = [0u8; 6];
    value[2..6].copy_from_slice(&coordinator_epoch.to_be_bytes());
    let record = RecordSpec {
        timestamp: timestamp_ms,
        key: Some(&key),
        value: Some(&value),
        headers: Vec::new(),
    };
    encode_batch(
        BatchSpec {
            base_offset: 0,
            attributes: ATTR_CONTROL | ATTR_TRANSACTIONAL,
            producer_id,
            producer_epoch,
            base_sequence: -1,
        },
        &[record],
    )
    .freeze()
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut shift = 0u32;
    let mut z: u64 = 0;
    loop {
        let b = *buf.get(*pos)?;
        *pos += 1;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    Some(((z >> 1) as i64) ^ -((z & 1) as i64))
}

/// Reads the marker kind of a control batch (`batch` holds the whole batch, `h` its header).
/// `None` if the batch is compressed, holds no record, or its key is not a known control type.
pub fn parse_marker(batch: &[u8], h: &BatchHeader) -> Option<MarkerKind> {
    if !h.is_control() || h.attributes & 0x07 != 0 || batch.len() <= HEADER_LEN {
        return None;
    }
    let mut pos = HEADER_LEN;
    let _len = read_varint(batch, &mut pos)?;
    pos += 1; // record attributes
    let _ts = read_varint(batch, &mut pos)?;
    let _od = read_varint(batch, &mut pos)?;
    let klen = read_varint(batch, &mut pos)?;
    if klen < 4 {
        return None;
    }
    let key = batch.get(pos..pos + 4)?;
    match i16::from_be_bytes([key[2], key[3]]) {
        CONTROL_TYPE_ABORT => Some(MarkerKind::Abort),
        CONTROL_TYPE_COMMIT => Some(MarkerKind::Commit),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::validate_batch;

    #[test]
    fn marker_round_trips_and_has_a_valid_crc() {
        for kind in [MarkerKind::Commit, MarkerKind::Abort] {
            let b = build_marker(kind, 42, 3, 7, 1_700_000_000_000);
            let h = validate_batch(&b).expect("valid batch");
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.base_sequence),
                (42, 3, -1)
            );
            assert_eq!(h.record_count, 1);
            assert_eq!(parse_marker(&b, &h), Some(kind));
        }
    }

    #[test]
    fn data_batches_are_not_markers() {
        let b = encode_batch(BatchSpec::default(), &[RecordSpec::default()]);
        let h = validate_batch(&b).expect("valid");
        assert_eq!(parse_marker(&b, &h), None);
    }
}
