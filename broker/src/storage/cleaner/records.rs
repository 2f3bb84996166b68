//! The records inside one stored RecordBatch v2, as the cleaner needs them: each record's key,
//! whether it has a value, its offset, and its raw bytes; and the rewrite of a batch with only
//! the records kept (Kafka's `MemoryRecords.filterTo`): same baseOffset and lastOffsetDelta,
//! same producer fields, fewer records, the same compression codec, a new CRC, and optionally
//! a delete horizon (KIP-534: attributes bit 6, the horizon stored as the base timestamp and
//! every record's timestamp delta rebased on it, so record timestamps do not change).
//!
//! Everything here reads bytes from a segment file: malformed input is an error, never a
//! panic, and the walk is bounded by the bytes present, not by the counts the batch claims.

use bytes::{BufMut, BytesMut};
use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};

use crate::decompress::{cap_for, decompress_capped};
use crate::record_timestamps::varint;
use crate::storage::batch::{BatchHeader, ATTR_COMPRESSION_MASK, HEADER_LEN, LOG_OVERHEAD};
use crate::storage::log_config::DEFAULT_MAX_MESSAGE_BYTES;

/// Attribute bit: the batch carries a delete horizon in its base timestamp (KIP-534).
pub const ATTR_DELETE_HORIZON: i16 = 0x40;
const BASE_TIMESTAMP_AT: usize = 27;
const ATTRIBUTES_AT: usize = 21;
const RECORD_COUNT_AT: usize = 57;
const CRC_AT: usize = 17;

/// Why a stored batch could not be taken apart or put back together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("batch at offset {base_offset}: {reason}")]
pub struct RecordsError {
    /// Base offset of the batch.
    pub base_offset: i64,
    /// What was wrong.
    pub reason: String,
}

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// Absolute offset (base offset + offset delta).
    pub offset: i64,
    /// Record attributes byte (unused by Kafka, kept as stored).
    attributes: u8,
    /// Timestamp delta from the batch's base timestamp.
    timestamp_delta: i64,
    /// Key bytes, `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// Whether the value is non-null (a null value is a tombstone).
    pub has_value: bool,
    /// The record after its timestamp delta (offset delta, key, value, headers), as stored.
    rest: Vec<u8>,
}

/// The delete horizon of a batch (KIP-534), if it has one.
pub fn delete_horizon(h: &BatchHeader) -> Option<i64> {
    (h.attributes & ATTR_DELETE_HORIZON != 0).then_some(h.base_timestamp)
}

/// One record of a batch, borrowed from the batch's (decompressed) records section.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    /// Offset delta from the batch's base offset.
    pub offset_delta: i64,
    /// Record attributes byte.
    attributes: u8,
    /// Timestamp delta from the batch's base timestamp.
    timestamp_delta: i64,
    /// Key bytes, `None` for a null key.
    pub key: Option<&'a [u8]>,
    /// Whether the value is non-null.
    pub has_value: bool,
    /// The record after its timestamp delta (offset delta, key, value, headers).
    rest: &'a [u8],
}

/// The records section of `batch` (one whole stored batch described by `h`), decompressed if
/// the batch is compressed, into at most `cap` bytes ([`cap_for`]): a batch that inflates
/// further is an error, not an allocation. An uncompressed section is borrowed, not copied.
pub fn records_section<'a>(
    batch: &'a [u8],
    h: &BatchHeader,
    cap: usize,
) -> Result<std::borrow::Cow<'a, [u8]>, RecordsError> {
    let err = |reason: String| RecordsError {
        base_offset: h.base_offset,
        reason,
    };
    let region = batch
        .get(HEADER_LEN..h.size)
        .ok_or_else(|| err(format!("{} bytes hold no whole batch", batch.len())))?;
    match h.attributes & ATTR_COMPRESSION_MASK {
        0 => Ok(std::borrow::Cow::Borrowed(region)),
        codec => decompress_capped(codec, region, cap)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| err(e.to_string())),
    }
}

/// Calls `visit` with every record of a records section (from [`records_section`]) and
/// returns how many there were. The walk is bounded by the bytes present; nothing is copied.
pub fn for_each_record<'a>(
    section: &'a [u8],
    base_offset: i64,
    mut visit: impl FnMut(usize, RecordView<'a>),
) -> Result<usize, RecordsError> {
    let mut rest = section;
    let mut index = 0;
    while !rest.is_empty() {
        let bad = |what: &str| RecordsError {
            base_offset,
            reason: format!("record {index}: {what}"),
        };
        let (len, used) = varint(rest).ok_or_else(|| bad("bad length"))?;
        let len = usize::try_from(len).map_err(|_| bad("negative length"))?;
        let body = rest
            .get(used..used.saturating_add(len))
            .ok_or_else(|| bad("length past the batch end"))?;
        rest = &rest[used + len..];
        let (&attributes, fields) = body.split_first().ok_or_else(|| bad("empty record"))?;
        let (timestamp_delta, used) = varint(fields).ok_or_else(|| bad("bad timestamp"))?;
        let after_ts = &fields[used..];
        let (offset_delta, used) = varint(after_ts).ok_or_else(|| bad("bad offset delta"))?;
        let mut at = used;
        let key = read_bytes(after_ts, &mut at).ok_or_else(|| bad("bad key"))?;
        let value_len = varint(&after_ts[at..]).ok_or_else(|| bad("bad value length"))?;
        visit(
            index,
            RecordView {
                offset_delta,
                attributes,
                timestamp_delta,
                key,
                has_value: value_len.0 >= 0,
                rest: after_ts,
            },
        );
        index += 1;
    }
    Ok(index)
}

/// The cap [`parse_records`] decompresses a stored batch to: 64 x the larger of the batch and
/// Kafka's default `max.message.bytes`.
fn stored_batch_cap(batch: &[u8]) -> usize {
    cap_for(
        i32::try_from(batch.len())
            .unwrap_or(i32::MAX)
            .max(DEFAULT_MAX_MESSAGE_BYTES),
    )
}

/// Decodes every record of `batch` (one whole stored batch described by `h`), decompressing
/// if needed, up to 64 x the larger of the batch and Kafka's default `max.message.bytes`
/// ([`cap_for`]). A batch whose header counts other records than it holds is an error.
pub fn parse_records(batch: &[u8], h: &BatchHeader) -> Result<Vec<RawRecord>, RecordsError> {
    let section = records_section(batch, h, stored_batch_cap(batch))?;
    let mut out = Vec::new();
    let count = for_each_record(&section, h.base_offset, |_, r| {
        out.push(RawRecord {
            offset: h.base_offset.saturating_add(r.offset_delta),
            attributes: r.attributes,
            timestamp_delta: r.timestamp_delta,
            key: r.key.map(<[u8]>::to_vec),
            has_value: r.has_value,
            rest: r.rest.to_vec(),
        })
    })?;
    check_count(h, count)?;
    Ok(out)
}

/// Calls `visit` with the key and offset of every record of a stored batch, copying nothing
/// but what `visit` keeps (the cleaner's key map).
pub fn for_each_key(
    batch: &[u8],
    h: &BatchHeader,
    mut visit: impl FnMut(Option<&[u8]>, i64),
) -> Result<(), RecordsError> {
    let section = records_section(batch, h, stored_batch_cap(batch))?;
    let count = for_each_record(&section, h.base_offset, |_, r| {
        visit(r.key, h.base_offset.saturating_add(r.offset_delta))
    })?;
    check_count(h, count)
}

/// Kafka's rule (`DefaultRecordBatch`'s record iterator): the header's record count is the
/// number of records the batch holds.
fn check_count(h: &BatchHeader, present: usize) -> Result<(), RecordsError> {
    if usize::try_from(h.record_count).ok() != Some(present) {
        return Err(RecordsError {
            base_offset: h.base_offset,
            reason: format!(
                "the batch header counts {} records but the batch holds {present}",
                h.record_count
            ),
        });
    }
    Ok(())
}

/// Checks the records of a producer's batches (`(position, header)` within `records`)
/// against their headers, as Kafka's log validator does: each batch holds exactly the number
/// of records its header counts (else INVALID_RECORD), and on a compacted topic every record
/// has a key (else per-record errors). A compressed batch is decompressed into at most
/// `cap_for(max.message.bytes)` of the topic, once; an uncompressed one is walked in place.
pub fn check_produced(
    records: &[u8],
    batches: &[(usize, BatchHeader)],
    config: &crate::storage::LogConfig,
) -> Result<(), crate::storage::AppendError> {
    use crate::storage::AppendError;
    let cap = cap_for(config.max_message_bytes);
    let compacted = config.cleanup_policy.compact;
    let invalid = |e: RecordsError| AppendError::InvalidRecord(e.to_string());
    for (pos, h) in batches {
        let batch = records.get(*pos..*pos + h.size).unwrap_or_default();
        let section = records_section(batch, h, cap).map_err(invalid)?;
        let mut keyless = Vec::new();
        let count = for_each_record(&section, h.base_offset, |i, r| {
            if compacted && r.key.is_none() {
                keyless.push(i32::try_from(i).unwrap_or(i32::MAX));
            }
        })
        .map_err(invalid)?;
        check_count(h, count).map_err(invalid)?;
        if !keyless.is_empty() {
            return Err(AppendError::RecordErrors {
                reason: format!(
                    "compacted topic cannot accept a record without a key ({} of {count} records)",
                    keyless.len(),
                ),
                indexes: keyless,
            });
        }
    }
    Ok(())
}

fn read_bytes<'a>(b: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let (len, used) = varint(b.get(*at..)?)?;
    *at += used;
    if len < 0 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let bytes = b.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some(Some(bytes))
}

fn put_varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// Rewrites `batch` (described by `h`) with only `kept` (records of this batch, in order) and,
/// with `horizon`, a delete horizon. Offsets, producer fields and the max timestamp stay; an
/// empty result keeps the header (Kafka's retained empty batch) without compression.
pub fn rewrite(
    batch: &[u8],
    h: &BatchHeader,
    kept: &[RawRecord],
    horizon: Option<i64>,
) -> Result<BytesMut, RecordsError> {
    let err = |reason: String| RecordsError {
        base_offset: h.base_offset,
        reason,
    };
    let header = batch
        .get(..HEADER_LEN)
        .ok_or_else(|| err("short header".into()))?;
    let (base_ts, shift) = match horizon {
        Some(t) if delete_horizon(h).is_none() => (t, h.base_timestamp.saturating_sub(t)),
        _ => (h.base_timestamp, 0),
    };
    let mut raw = BytesMut::new();
    for r in kept {
        let mut rec = BytesMut::with_capacity(r.rest.len() + 11);
        rec.put_u8(r.attributes);
        put_varint(&mut rec, r.timestamp_delta.saturating_add(shift));
        rec.put_slice(&r.rest);
        put_varint(&mut raw, rec.len() as i64);
        raw.put_slice(&rec);
    }
    let mut attributes = h.attributes;
    if horizon.is_some() {
        attributes |= ATTR_DELETE_HORIZON;
    }
    let codec = attributes & ATTR_COMPRESSION_MASK;
    let body = if kept.is_empty() {
        attributes &= !ATTR_COMPRESSION_MASK;
        BytesMut::new()
    } else if codec == 0 {
        raw
    } else {
        compress(codec, &raw).map_err(err)?
    };
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    out.put_slice(header);
    out.put_slice(&body);
    let len = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| err("batch too large".into()))?;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    out[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8].copy_from_slice(&base_ts.to_be_bytes());
    out[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    let crc = crate::crc32c(&out[ATTRIBUTES_AT..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// An empty batch covering offsets `base..=last` (no producer, no records, no timestamps):
/// it takes the place of batches the cleaner removed, so offsets in a segment stay
/// contiguous (clients skip it, as they skip Kafka's retained empty batches). Ranges wider
/// than `i32::MAX` offsets take several.
pub fn filler(base: i64, last: i64) -> BytesMut {
    let mut out = BytesMut::new();
    let mut from = base;
    while from <= last {
        let delta = (last - from).min(i64::from(i32::MAX)) as i32;
        let at = out.len();
        out.put_i64(from);
        out.put_i32((HEADER_LEN - LOG_OVERHEAD) as i32);
        out.put_i32(0); // partition leader epoch
        out.put_i8(2);
        out.put_u32(0); // CRC, below
        out.put_i16(0);
        out.put_i32(delta);
        out.put_i64(-1);
        out.put_i64(-1);
        out.put_i64(-1);
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i32(0);
        let crc = crate::crc32c(&out[at + ATTRIBUTES_AT..]);
        out[at + CRC_AT..at + CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        from += i64::from(delta) + 1;
    }
    out
}

fn compress(codec: i16, raw: &[u8]) -> Result<BytesMut, String> {
    let mut out = BytesMut::new();
    let put = |b: &mut BytesMut| {
        b.put_slice(raw);
        Ok(())
    };
    let res = match codec {
        1 => <Gzip as Compressor<BytesMut>>::compress(&mut out, put),
        2 => <Snappy as Compressor<BytesMut>>::compress(&mut out, put),
        3 => <Lz4 as Compressor<BytesMut>>::compress(&mut out, put),
        4 => <Zstd as Compressor<BytesMut>>::compress(&mut out, put),
        other => return Err(format!("unknown compression codec {other}")),
    };
    res.map_err(|e| format!("compression failed: {e:#}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::validate_batch;
    use bytes::Bytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };

    fn batch(compression: Compression, keys: &[&str]) -> BytesMut {
        let records: Vec<Record> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: 9,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: 50 + i as i64,
                sequence: i as i32,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(k.to_string())),
                value: (i != 1).then(|| Bytes::from(format!("v{i}"))),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        buf
    }

    #[test]
    fn rewrite_keeps_offsets_timestamps_and_codec_in_every_codec() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let b = batch(c, &["a", "b", "c", "d"]);
            let h = validate_batch(&b).unwrap();
            let recs = parse_records(&b, &h).unwrap();
            assert_eq!(recs.len(), 4);
            assert!(!recs[1].has_value, "{c:?}");
            let kept = [recs[1].clone(), recs[3].clone()];
            let out = rewrite(&b, &h, &kept, Some(5_000)).unwrap();
            let nh = validate_batch(&out).expect("new CRC and lengths");
            assert_eq!(
                (nh.base_offset, nh.last_offset()),
                (h.base_offset, h.last_offset())
            );
            assert_eq!(nh.record_count, 2);
            assert_eq!(nh.attributes & ATTR_COMPRESSION_MASK, h.attributes & 7);
            assert_eq!(delete_horizon(&nh), Some(5_000));
            let set = RecordBatchDecoder::decode(&mut out.freeze()).unwrap();
            let got: Vec<(i64, i64, bool)> = set
                .records
                .iter()
                .map(|r| (r.offset, r.timestamp, r.value.is_some()))
                .collect();
            assert_eq!(got, vec![(51, 1_001, false), (53, 1_003, true)], "{c:?}");
        }
    }

    #[test]
    fn empty_rewrite_keeps_the_offset_range_uncompressed() {
        let b = batch(Compression::Lz4, &["a", "b"]);
        let h = validate_batch(&b).unwrap();
        let out = rewrite(&b, &h, &[], None).unwrap();
        let nh = validate_batch(&out).unwrap();
        assert_eq!((nh.record_count, nh.last_offset()), (0, h.last_offset()));
        assert_eq!(nh.attributes & ATTR_COMPRESSION_MASK, 0);
        assert_eq!((nh.producer_id, nh.base_sequence), (9, h.base_sequence));
    }

    #[test]
    fn fillers_are_valid_empty_batches_covering_their_range() {
        let f = filler(10, 20);
        let h = validate_batch(&f).unwrap();
        assert_eq!(
            (h.base_offset, h.last_offset(), h.record_count),
            (10, 20, 0)
        );
        assert!(!h.has_producer_id());
        let wide = filler(0, i64::from(i32::MAX) + 5);
        let first = validate_batch(&wide[..HEADER_LEN]).unwrap();
        let second = validate_batch(&wide[HEADER_LEN..]).unwrap();
        assert_eq!(second.base_offset, first.last_offset() + 1);
        assert_eq!(second.last_offset(), i64::from(i32::MAX) + 5);
    }

    #[test]
    fn produced_batches_must_hold_the_records_their_header_counts() {
        use crate::storage::{AppendError, LogConfig};
        let mut compacted = LogConfig::default();
        compacted.cleanup_policy.compact = true;
        for c in [Compression::None, Compression::Zstd] {
            let mut b = batch(c, &["a", "b"]);
            let h = validate_batch(&b).unwrap();
            assert!(check_produced(&b, &[(0, h)], &compacted).is_ok());
            // Three counted, two present (lastOffsetDelta raised to match, CRC redone).
            b[23..27].copy_from_slice(&2i32.to_be_bytes());
            b[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&3i32.to_be_bytes());
            let crc = crate::crc32c(&b[ATTRIBUTES_AT..]);
            b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
            let h = validate_batch(&b).unwrap();
            let err = check_produced(&b, &[(0, h)], &LogConfig::default()).unwrap_err();
            assert!(
                matches!(&err, AppendError::InvalidRecord(m) if m.contains("counts 3 records but the batch holds 2")),
                "{c:?}: {err:?}"
            );
            assert!(parse_records(&b, &h).is_err());
        }
    }

    #[test]
    fn damaged_records_are_an_error() {
        let b = batch(Compression::None, &["a", "b"]);
        let h = validate_batch(&b).unwrap();
        let mut bad = b.clone();
        for byte in &mut bad[HEADER_LEN..] {
            *byte = 0xff;
        }
        assert!(parse_records(&bad, &h).is_err());
        assert!(parse_records(&b[..HEADER_LEN + 2], &h).is_err());
    }
}
