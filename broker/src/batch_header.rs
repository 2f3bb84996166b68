//! Read-only view of a RecordBatch v2 header, for the few places the server looks inside
//! stored batches (the storage module owns validation).
//!
//! Layout: baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32,
//! attributes i16, lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64,
//! producerEpoch i16, baseSequence i32, records count i32 (61 bytes).

/// Size of the fixed RecordBatch v2 header.
pub const HEADER_LEN: usize = 61;

/// The header fields the server needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Bytes after the length field.
    pub batch_length: i32,
    /// Last offset minus base offset.
    pub last_offset_delta: i32,
    /// Largest record timestamp in the batch.
    pub max_timestamp: i64,
}

impl BatchHeader {
    /// Parses the header at the start of `bytes`; None when the bytes are too short or the
    /// length field is impossible.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let header = bytes.get(..HEADER_LEN)?;
        let i64_at = |at: usize| {
            header
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(i64::from_be_bytes)
        };
        let i32_at = |at: usize| {
            header
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_be_bytes)
        };
        let parsed = Self {
            base_offset: i64_at(0)?,
            batch_length: i32_at(8)?,
            last_offset_delta: i32_at(23)?,
            max_timestamp: i64_at(35)?,
        };
        (usize::try_from(parsed.batch_length).ok()? + 12 >= HEADER_LEN).then_some(parsed)
    }

    /// Offset of the last record.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// Bytes of the whole batch, offset and length fields included.
    pub fn total_len(&self) -> usize {
        usize::try_from(self.batch_length).unwrap_or(0) + 12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_rejects_short_input() {
        let mut b = vec![0u8; HEADER_LEN];
        b[..8].copy_from_slice(&7i64.to_be_bytes());
        b[8..12].copy_from_slice(&((HEADER_LEN - 12) as i32).to_be_bytes());
        b[23..27].copy_from_slice(&2i32.to_be_bytes());
        b[35..43].copy_from_slice(&99i64.to_be_bytes());
        let h = BatchHeader::parse(&b).unwrap();
        assert_eq!(
            (
                h.base_offset,
                h.last_offset(),
                h.max_timestamp,
                h.total_len()
            ),
            (7, 9, 99, HEADER_LEN)
        );
        assert!(BatchHeader::parse(&b[..60]).is_none());
        b[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(BatchHeader::parse(&b).is_none());
    }
}
