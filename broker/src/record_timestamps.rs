//! Record-level timestamp search inside one stored RecordBatch v2, for ListOffsets by
//! timestamp: Kafka answers with the first *record* whose timestamp is at or after the target
//! (its offset and timestamp), not with the containing batch.
//!
//! Only ListOffsets decodes records; Fetch keeps serving stored bytes untouched. Compressed
//! batches (gzip, snappy, lz4, zstd) are decompressed up to a cap ([`crate::decompress`]), so
//! a batch that inflates to gigabytes is an error, not an allocation. The record walk is
//! bounded by the bytes present, never by counts read from the batch.

use crate::decompress::{decompress_capped, DecompressError};

/// Why a batch could not be searched record by record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordScanError {
    /// Fewer bytes than the batch header or its length field announce.
    #[error("record batch truncated: {0} bytes")]
    Truncated(usize),
    /// The records section could not be decompressed within the cap.
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    /// A record's length or varint fields are inconsistent.
    #[error("malformed record {index}: {reason}")]
    MalformedRecord {
        /// Position of the record in the batch.
        index: usize,
        /// What was wrong.
        reason: &'static str,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, RecordScanError>;

const LENGTH_AT: usize = 8;
const ATTRIBUTES_AT: usize = 21;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const RECORD_COUNT_AT: usize = 57;
const RECORDS_AT: usize = 61;
/// Attributes bit 3: timestamps are the broker's log append time (the batch max timestamp).
const LOG_APPEND_TIME: i16 = 1 << 3;

/// The first record of `batch` (one whole stored batch, base offset included) whose timestamp
/// is `>= ts`, as (offset, timestamp); `None` if no record qualifies. A compressed batch may
/// inflate to at most `cap` bytes.
///
/// offset = base offset + offset delta, timestamp = base timestamp + timestamp delta; in a
/// LogAppendTime batch every record carries the batch max timestamp.
pub fn first_record_at_or_after(batch: &[u8], ts: i64, cap: usize) -> Result<Option<(i64, i64)>> {
    let header = batch
        .get(..RECORDS_AT)
        .ok_or(RecordScanError::Truncated(batch.len()))?;
    let base_offset = i64_at(header, 0);
    let length = i32_at(header, LENGTH_AT);
    let end = usize::try_from(length)
        .ok()
        .and_then(|l| l.checked_add(12))
        .filter(|&end| end >= RECORDS_AT && end <= batch.len())
        .ok_or(RecordScanError::Truncated(batch.len()))?;
    let attributes = i16::from_be_bytes([header[ATTRIBUTES_AT], header[ATTRIBUTES_AT + 1]]);
    let base_timestamp = i64_at(header, BASE_TIMESTAMP_AT);
    let max_timestamp = i64_at(header, MAX_TIMESTAMP_AT);
    let count = usize::try_from(i32_at(header, RECORD_COUNT_AT)).unwrap_or(0);
    if attributes & LOG_APPEND_TIME != 0 {
        return Ok((count > 0 && max_timestamp >= ts).then_some((base_offset, max_timestamp)));
    }
    let records = &batch[RECORDS_AT..end];
    let decompressed;
    let records: &[u8] = match attributes & 0x7 {
        0 => records,
        codec => {
            decompressed = decompress_capped(codec, records, cap)?;
            &decompressed
        }
    };
    let mut rest = records;
    for index in 0..count {
        if rest.is_empty() {
            break;
        }
        let malformed = |reason| RecordScanError::MalformedRecord { index, reason };
        let (len, used) = varint(rest).ok_or_else(|| malformed("bad length varint"))?;
        let len = usize::try_from(len).map_err(|_| malformed("negative length"))?;
        let body = rest
            .get(used..used.saturating_add(len))
            .ok_or_else(|| malformed("length past the batch end"))?;
        rest = &rest[used + len..];
        // attributes i8, timestampDelta varlong, offsetDelta varint, ...
        let fields = body.get(1..).ok_or_else(|| malformed("empty record"))?;
        let (ts_delta, used) = varint(fields).ok_or_else(|| malformed("bad timestamp delta"))?;
        let (offset_delta, _) =
            varint(&fields[used..]).ok_or_else(|| malformed("bad offset delta"))?;
        let record_ts = base_timestamp.saturating_add(ts_delta);
        if record_ts >= ts {
            return Ok(Some((base_offset.saturating_add(offset_delta), record_ts)));
        }
    }
    Ok(None)
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(v)
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    i32::from_be_bytes(v)
}

/// A zigzag varint/varlong (at most 10 bytes) and the bytes it used.
pub(crate) fn varint(b: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (i, &byte) in b.iter().take(10).enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;

    const CAP: usize = 1 << 20;
    use crate::storage::batch::{encode_batch, BatchSpec, RecordSpec};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn batch(compression: Compression, timestamps: &[i64]) -> Vec<u8> {
        let records: Vec<Record> = timestamps
            .iter()
            .enumerate()
            .map(|(i, &ts)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: 100 + i as i64,
                sequence: i as i32, // consecutive: the encoder keeps one batch
                timestamp: ts,
                key: None,
                value: Some(Bytes::from(vec![b'v'; 40])),
                headers: Default::default(),
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        buf.to_vec()
    }

    #[test]
    fn finds_the_first_record_at_or_after_in_every_codec() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let b = batch(c, &[1000, 1010, 1005, 1020, 1030]);
            assert_eq!(
                first_record_at_or_after(&b, 0, CAP).unwrap(),
                Some((100, 1000))
            );
            assert_eq!(
                first_record_at_or_after(&b, 1001, CAP).unwrap(),
                Some((101, 1010))
            );
            assert_eq!(
                first_record_at_or_after(&b, 1011, CAP).unwrap(),
                Some((103, 1020))
            );
            assert_eq!(
                first_record_at_or_after(&b, 1030, CAP).unwrap(),
                Some((104, 1030))
            );
            assert_eq!(
                first_record_at_or_after(&b, 1031, CAP).unwrap(),
                None,
                "{c:?}"
            );
        }
    }

    #[test]
    fn log_append_time_batches_answer_the_max_timestamp() {
        let mut b = batch(Compression::None, &[5, 6, 7]);
        b[ATTRIBUTES_AT + 1] |= LOG_APPEND_TIME as u8;
        assert_eq!(
            first_record_at_or_after(&b, 6, CAP).unwrap(),
            Some((100, 7))
        );
        assert_eq!(first_record_at_or_after(&b, 8, CAP).unwrap(), None);
    }

    #[test]
    fn control_batches_from_the_storage_encoder_are_searchable() {
        let spec = BatchSpec {
            base_offset: 7,
            ..BatchSpec::default()
        };
        let recs = [
            RecordSpec {
                timestamp: 50,
                ..RecordSpec::default()
            },
            RecordSpec {
                timestamp: 53,
                ..RecordSpec::default()
            },
        ];
        let b = encode_batch(spec, &recs);
        assert_eq!(
            first_record_at_or_after(&b, 52, CAP).unwrap(),
            Some((8, 53))
        );
    }

    #[test]
    fn damaged_input_is_an_error_not_a_panic() {
        let good = batch(Compression::Lz4, &[1, 2, 3]);
        for cut in [0, 10, RECORDS_AT - 1, RECORDS_AT + 3, good.len() - 1] {
            assert!(
                first_record_at_or_after(&good[..cut], 0, CAP).is_err(),
                "cut {cut}"
            );
        }
        let mut bad_codec = batch(Compression::None, &[1]);
        bad_codec[ATTRIBUTES_AT + 1] |= 0x7;
        assert_eq!(
            first_record_at_or_after(&bad_codec, 0, CAP),
            Err(RecordScanError::Decompress(DecompressError::UnknownCodec(
                7
            )))
        );
        let mut garbage = batch(Compression::Zstd, &[1, 2]);
        for byte in &mut garbage[RECORDS_AT..] {
            *byte = 0xff;
        }
        assert!(first_record_at_or_after(&garbage, 0, CAP).is_err());
        // A record count far beyond the bytes present ends the walk at the bytes.
        let mut huge = batch(Compression::None, &[1, 2]);
        huge[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(first_record_at_or_after(&huge, 3, CAP).unwrap(), None);
    }
}
