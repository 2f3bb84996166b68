//! RecordBatch v2 headers: parsing, validation (magic, length, CRC-32C), base offset rewrite,
//! producer sequence arithmetic, and an encoder for the batches the broker writes itself.
//!
//! Layout of the 61-byte header (big endian), as in Kafka's `DefaultRecordBatch`:
//!
//! ```text
//! 0  baseOffset i64        | 8  batchLength i32 (bytes after this field)
//! 12 partitionLeaderEpoch  | 16 magic i8 (2)   | 17 crc u32 (CRC-32C of bytes 21..)
//! 21 attributes i16        | 23 lastOffsetDelta i32
//! 27 baseTimestamp i64     | 35 maxTimestamp i64
//! 43 producerId i64        | 51 producerEpoch i16 | 53 baseSequence i32
//! 57 recordCount i32       | 61 records...
//! ```
//! The CRC does not cover baseOffset, so the broker assigns offsets by rewriting 8 bytes.

use bytes::{BufMut, Bytes, BytesMut};

/// Size of the fixed RecordBatch v2 header.
pub const HEADER_LEN: usize = 61;
/// Bytes before the batchLength-covered part (baseOffset + batchLength).
pub const LOG_OVERHEAD: usize = 12;
/// Offset of the CRC-covered part (attributes onwards).
const CRC_START: usize = 21;
/// Attribute bits: compression codec.
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
/// Attribute bit: timestamps are log append time.
pub const ATTR_LOG_APPEND_TIME: i16 = 0x08;
/// Attribute bit: the batch belongs to a transaction.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
/// Attribute bit: the batch holds control records (transaction markers).
pub const ATTR_CONTROL: i16 = 0x20;
/// Producer id of non-idempotent producers.
pub const NO_PRODUCER_ID: i64 = -1;
/// Largest batch the broker accepts inside one request (guards length arithmetic).
pub const MAX_BATCH_LEN: usize = i32::MAX as usize;

/// Why bytes are not a valid batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchFault {
    /// Too short, bad length, or CRC mismatch: the bytes are damaged.
    Corrupt(String),
    /// Well-formed but not acceptable (e.g. magic != 2, count mismatch).
    Invalid(String),
}

impl std::fmt::Display for BatchFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchFault::Corrupt(m) | BatchFault::Invalid(m) => f.write_str(m),
        }
    }
}

/// The parsed fixed header of one RecordBatch v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// First offset of the batch.
    pub base_offset: i64,
    /// Total size of the batch in bytes, including baseOffset and batchLength.
    pub size: usize,
    /// Magic byte (2 for every batch this store keeps).
    pub magic: i8,
    /// Stored CRC-32C.
    pub crc: u32,
    /// Attribute bits.
    pub attributes: i16,
    /// lastOffset - baseOffset.
    pub last_offset_delta: i32,
    /// Timestamp of the first record.
    pub base_timestamp: i64,
    /// Largest record timestamp in the batch.
    pub max_timestamp: i64,
    /// Producer id, or -1.
    pub producer_id: i64,
    /// Producer epoch, or -1.
    pub producer_epoch: i16,
    /// Sequence of the first record, or -1.
    pub base_sequence: i32,
    /// Number of records.
    pub record_count: i32,
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

impl BatchHeader {
    /// The batch's last offset.
    pub fn last_offset(&self) -> i64 {
        // Saturating: headers read back from a damaged file must not overflow.
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }
    /// Whether the batch belongs to a transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
    /// Whether the batch holds control records.
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
    /// Whether the batch carries an idempotent producer id.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }
    /// Sequence of the last record, wrapping at `i32::MAX` as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        increment_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// Reads the total size of the batch starting at `buf` (needs 12 bytes); `None` if fewer.
pub fn peek_size(buf: &[u8]) -> Option<Result<usize, BatchFault>> {
    if buf.len() < LOG_OVERHEAD {
        return None;
    }
    let len = be_i32(buf, 8);
    if len < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Some(Err(BatchFault::Corrupt(format!(
            "batch length {len} is smaller than a v2 header"
        ))));
    }
    Some(Ok(len as usize + LOG_OVERHEAD))
}

/// Parses the header at the start of `buf`, checking only what the header alone can show
/// (length and magic). `buf` must hold at least [`HEADER_LEN`] bytes.
pub fn parse_header(buf: &[u8]) -> Result<BatchHeader, BatchFault> {
    if buf.len() < HEADER_LEN {
        return Err(BatchFault::Corrupt(format!(
            "{} bytes is shorter than a batch header",
            buf.len()
        )));
    }
    let size = peek_size(buf).unwrap_or_else(|| Err(BatchFault::Corrupt("short batch".into())))?;
    let magic = buf[16] as i8;
    if magic != 2 {
        return Err(BatchFault::Invalid(format!(
            "record batch magic {magic} is not supported (only v2)"
        )));
    }
    Ok(BatchHeader {
        base_offset: be_i64(buf, 0),
        size,
        magic,
        crc: u32::from_be_bytes([buf[17], buf[18], buf[19], buf[20]]),
        attributes: be_i16(buf, 21),
        last_offset_delta: be_i32(buf, 23),
        base_timestamp: be_i64(buf, 27),
        max_timestamp: be_i64(buf, 35),
        producer_id: be_i64(buf, 43),
        producer_epoch: be_i16(buf, 51),
        base_sequence: be_i32(buf, 53),
        record_count: be_i32(buf, 57),
    })
}

/// Parses and fully validates one complete batch (`buf.len() == header.size`): header, CRC-32C
/// over attributes..end, and offset/count consistency.
pub fn validate_batch(buf: &[u8]) -> Result<BatchHeader, BatchFault> {
    let h = parse_header(buf)?;
    if buf.len() != h.size {
        return Err(BatchFault::Corrupt(format!(
            "batch declares {} bytes but {} are present",
            h.size,
            buf.len()
        )));
    }
    let crc = crate::crc32c(&buf[CRC_START..]);
    if crc != h.crc {
        return Err(BatchFault::Corrupt(format!(
            "CRC-32C mismatch: stored {:#010x}, computed {crc:#010x}",
            h.crc
        )));
    }
    if h.last_offset_delta < 0 {
        return Err(BatchFault::Invalid(format!(
            "negative lastOffsetDelta {}",
            h.last_offset_delta
        )));
    }
    // A batch the cleaner rewrote keeps its offset range with fewer records (possibly none).
    if h.record_count < 0 || i64::from(h.record_count) > i64::from(h.last_offset_delta) + 1 {
        return Err(BatchFault::Invalid(format!(
            "record count {} does not fit lastOffsetDelta {}",
            h.record_count, h.last_offset_delta
        )));
    }
    Ok(h)
}

/// What producers must send on top of [`validate_batch`]: one record per offset.
fn check_full_batch(h: &BatchHeader) -> Result<(), BatchFault> {
    if i64::from(h.record_count) != i64::from(h.last_offset_delta) + 1 {
        return Err(BatchFault::Invalid(format!(
            "record count {} does not match lastOffsetDelta {}",
            h.record_count, h.last_offset_delta
        )));
    }
    Ok(())
}

/// Splits a produce request's records into validated batches: `(position, header)` pairs.
/// Any trailing partial batch is an error (producers never send one).
pub fn split_batches(buf: &[u8]) -> Result<Vec<(usize, BatchHeader)>, BatchFault> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    if buf.is_empty() {
        return Err(BatchFault::Corrupt("empty records".into()));
    }
    while pos < buf.len() {
        let rest = &buf[pos..];
        // Legacy message sets (magic 0/1) keep the magic byte at the same position: report
        // them as unsupported rather than as damaged, whatever their length.
        if let Some(&magic) = rest.get(16) {
            if magic != 2 {
                return Err(BatchFault::Invalid(format!(
                    "record batch magic {} at position {pos} is not supported (only v2)",
                    magic as i8
                )));
            }
        }
        let size = match peek_size(rest) {
            None => {
                return Err(BatchFault::Corrupt(format!(
                    "{} trailing bytes at position {pos} are not a batch",
                    rest.len()
                )))
            }
            Some(r) => r?,
        };
        if size > rest.len() {
            return Err(BatchFault::Corrupt(format!(
                "batch at position {pos} declares {size} bytes, only {} present",
                rest.len()
            )));
        }
        let h = validate_batch(&rest[..size])?;
        check_full_batch(&h)?;
        out.push((pos, h));
        pos += size;
    }
    Ok(out)
}

/// The records of one partition in a Produce request, split into batches and validated once
/// ([`split_batches`]: framing, magic, CRC-32C, counts). The produce handler (size limit), the
/// transaction layer (the producer of a transactional batch) and the log append all read
/// these headers; none parses the bytes again.
#[derive(Debug, Clone)]
pub struct ProducedBatches {
    records: Bytes,
    batches: Vec<(usize, BatchHeader)>,
}

impl ProducedBatches {
    /// Splits and validates `records` as a producer sent them (whole batches, one record per
    /// offset, no trailing bytes).
    pub fn parse(records: Bytes) -> Result<Self, BatchFault> {
        let batches = split_batches(&records)?;
        Ok(ProducedBatches { records, batches })
    }

    /// The bytes as received.
    pub fn records(&self) -> &Bytes {
        &self.records
    }

    /// Each batch's position in [`Self::records`] and its header, in order (never empty).
    pub fn batches(&self) -> &[(usize, BatchHeader)] {
        &self.batches
    }

    /// The first batch's header.
    pub fn first(&self) -> &BatchHeader {
        // split_batches refuses empty records, so there is always a first batch.
        &self.batches[0].1
    }

    /// Size in bytes of the largest batch.
    pub fn largest(&self) -> usize {
        self.batches.iter().map(|(_, h)| h.size).max().unwrap_or(0)
    }
}

/// Whether any batch in a Produce request's records field, as far as its framing can be
/// followed, has the transactional attribute (Kafka's `hasTransactionalRecords`, which
/// decides whether the request needs a transactional id). Runs before validation, so it
/// reads only the attributes of each batch.
pub fn has_transactional_batch(records: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(Ok(size)) = peek_size(&records[pos..]) {
        if let Some(attributes) = records.get(pos + 21..pos + 23) {
            if be_i16(attributes, 0) & ATTR_TRANSACTIONAL != 0 {
                return true;
            }
        }
        pos = pos.saturating_add(size);
        if pos >= records.len() {
            break;
        }
    }
    false
}

/// Whether `records` holds whole batches and none of them has a record (batches the log
/// cleaner emptied or filled in).
pub fn only_empty_batches(records: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(Ok(size)) = peek_size(&records[pos..]) {
        let Some(b) = records.get(pos..pos + size) else {
            break;
        };
        match parse_header(b) {
            Ok(h) if h.record_count == 0 => pos += size,
            _ => return false,
        }
    }
    pos > 0
}

/// Overwrites the baseOffset field of the batch starting at `batch` (not covered by the CRC).
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// `sequence + increment`, wrapping past `i32::MAX` to 0 as Kafka's
/// `DefaultRecordBatch.incrementSequence` does.
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    // Computed in i64 so that garbage inputs cannot overflow.
    let next = i64::from(sequence) + i64::from(increment);
    if next > i64::from(i32::MAX) {
        (next - i64::from(i32::MAX) - 1) as i32
    } else {
        next as i32
    }
}

/// One record to encode with [`encode_batch`].
#[derive(Debug, Clone, Default)]
pub struct RecordSpec<'a> {
    /// Record timestamp (milliseconds).
    pub timestamp: i64,
    /// Key, or `None` for null.
    pub key: Option<&'a [u8]>,
    /// Value, or `None` for null.
    pub value: Option<&'a [u8]>,
    /// Headers (key, value).
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
}

/// Batch-level fields for [`encode_batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchSpec {
    /// Base offset to write (the store rewrites it on append).
    pub base_offset: i64,
    /// Attribute bits (compression must be 0: records are written uncompressed).
    pub attributes: i16,
    /// Producer id or -1.
    pub producer_id: i64,
    /// Producer epoch or -1.
    pub producer_epoch: i16,
    /// First sequence or -1.
    pub base_sequence: i32,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            base_offset: 0,
            attributes: 0,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: -1,
            base_sequence: -1,
        }
    }
}

fn put_varlong(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn put_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.put_slice(b);
        }
    }
}

/// Encodes an uncompressed RecordBatch v2 with a correct CRC-32C. Used for control batches
/// (transaction markers) the broker writes itself, and by tests to build producer batches.
pub fn encode_batch(spec: BatchSpec, records: &[RecordSpec<'_>]) -> BytesMut {
    let base_ts = records.first().map_or(-1, |r| r.timestamp);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(-1);
    let mut body = BytesMut::new();
    for (i, r) in records.iter().enumerate() {
        let mut rec = BytesMut::new();
        rec.put_i8(0);
        put_varlong(&mut rec, r.timestamp - base_ts);
        put_varlong(&mut rec, i as i64);
        put_bytes(&mut rec, r.key);
        put_bytes(&mut rec, r.value);
        put_varlong(&mut rec, r.headers.len() as i64);
        for (k, v) in &r.headers {
            put_bytes(&mut rec, Some(k));
            put_bytes(&mut rec, *v);
        }
        put_varlong(&mut body, rec.len() as i64);
        body.put_slice(&rec);
    }
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    out.put_i64(spec.base_offset);
    out.put_i32((HEADER_LEN - LOG_OVERHEAD + body.len()) as i32);
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(0);
    out.put_i16(spec.attributes & !ATTR_COMPRESSION_MASK);
    out.put_i32(records.len().saturating_sub(1) as i32);
    out.put_i64(base_ts);
    out.put_i64(max_ts);
    out.put_i64(spec.producer_id);
    out.put_i16(spec.producer_epoch);
    out.put_i32(spec.base_sequence);
    out.put_i32(records.len() as i32);
    out.put_slice(&body);
    let crc = crate::crc32c(&out[CRC_START..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> BytesMut {
        let recs: Vec<RecordSpec<'_>> = (0..n)
            .map(|i| RecordSpec {
                timestamp: 1000 + i as i64,
                key: Some(b"k"),
                value: Some(b"value"),
                headers: vec![(b"h", Some(b"v"))],
            })
            .collect();
        encode_batch(
            BatchSpec {
                producer_id: 7,
                producer_epoch: 1,
                base_sequence: 5,
                ..BatchSpec::default()
            },
            &recs,
        )
    }

    #[test]
    fn encoded_batch_validates_and_reports_fields() {
        let b = sample(3);
        let h = validate_batch(&b).expect("valid");
        assert_eq!(h.size, b.len());
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (7, 1, 5)
        );
        assert_eq!(h.last_sequence(), 7);
        assert_eq!((h.base_timestamp, h.max_timestamp), (1000, 1002));
    }

    #[test]
    fn kafka_protocol_decodes_encoded_batch() {
        let mut b = sample(2).freeze();
        let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut b).expect("decodes");
        assert_eq!(set.records.len(), 2);
        assert_eq!(set.records[1].offset, 1);
        assert_eq!(set.records[1].value.as_deref(), Some(&b"value"[..]));
    }

    #[test]
    fn rewriting_base_offset_keeps_crc_valid() {
        let mut b = sample(2);
        set_base_offset(&mut b, 12345);
        let h = validate_batch(&b).expect("still valid");
        assert_eq!(h.base_offset, 12345);
        assert_eq!(h.last_offset(), 12346);
    }

    #[test]
    fn flipped_byte_is_corrupt_and_bad_magic_invalid() {
        let mut b = sample(2);
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(validate_batch(&b), Err(BatchFault::Corrupt(_))));
        let mut b = sample(2);
        b[16] = 1;
        assert!(matches!(validate_batch(&b), Err(BatchFault::Invalid(_))));
    }

    #[test]
    fn split_rejects_truncated_and_garbage() {
        let one = sample(2);
        let mut two = one.clone();
        two.extend_from_slice(&one);
        assert_eq!(split_batches(&two).expect("two").len(), 2);
        assert!(split_batches(&two[..two.len() - 1]).is_err());
        assert!(split_batches(&[]).is_err());
        assert!(split_batches(&[0u8; 11]).is_err());
        let mut neg = one.clone();
        neg[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(split_batches(&neg).is_err());
        // A short magic-1 message set is unsupported, not corrupt.
        let mut v1 = vec![0u8; 30];
        v1[8..12].copy_from_slice(&18i32.to_be_bytes());
        v1[16] = 1;
        assert!(matches!(split_batches(&v1), Err(BatchFault::Invalid(_))));
    }

    #[test]
    fn sequence_wraps_like_kafka() {
        assert_eq!(increment_sequence(5, 3), 8);
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(increment_sequence(i32::MAX, 0), i32::MAX);
        assert_eq!(increment_sequence(i32::MAX, i32::MAX), i32::MAX - 1);
        let _ = increment_sequence(i32::MIN, i32::MIN);
    }
}
