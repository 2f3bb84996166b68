//! The checksummed record framing of the broker's own append-only logs (the group offsets log
//! and the transaction log) and the reader that tells a torn tail from corruption.
//!
//! A frame is `len: u32 | crc32c(payload): u32 | payload[len]`; the byte order of the two
//! header fields is per file (kept as each file always had it). A frame is valid when `len` is
//! between 1 and the file's cap, the payload lies inside the file and its CRC-32C matches.
//!
//! Reading classifies the first invalid frame at byte `p`:
//! - nothing valid anywhere after `p`: a torn tail, the normal result of a crash in the middle
//!   of an append; it is cut;
//! - a valid frame (whose payload also decodes) starts at some later byte `q`: corruption. The
//!   reader refuses with [`CorruptLog`] (file, position, what cutting there would lose), unless
//!   repair was asked for, in which case bytes `p..q` are dropped, reading resumes at `q`, and
//!   every dropped range is returned so the caller can report it.
//!
//! Resynchronising tries every byte position after `p`; candidates whose length field points
//! past the end of the file are rejected without hashing, so a torn tail costs little.
//!
//! Writing goes through [`Appender`], which keeps a failed append from leaving a partial frame
//! that later frames would follow (that would read back as corruption).

use std::path::{Path, PathBuf};

mod appender;
#[cfg(test)]
pub use appender::faulty;
pub use appender::{Appender, LogFile};

/// Byte order of a file's frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    /// Little endian.
    Little,
    /// Big endian.
    Big,
}

/// The framing of one kind of log file.
#[derive(Debug, Clone, Copy)]
pub struct Framing {
    /// Byte order of the `len` and `crc` fields.
    pub order: ByteOrder,
    /// Largest payload accepted when reading (guards against a garbled length field).
    pub max_payload: usize,
    /// Short name of the kind of file, used as a metric label (e.g. `group_offsets`).
    pub kind: &'static str,
}

/// A log holds damage followed by valid records and repair was not asked for. The operator's
/// decision is needed: retrying will not help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path}: corrupt record at byte {position} (damaged bytes {position}..{resume_at}); \
     {records_after} valid records ({bytes_after} bytes) follow it and would be lost by cutting \
     the file there; the file was left unchanged. Restart with --repair-corrupt-logs to drop \
     the damaged bytes ({damaged_bytes} bytes in {damaged_ranges} range(s)) and keep the valid \
     records after them"
)]
pub struct CorruptLog {
    /// The damaged file.
    pub path: PathBuf,
    /// Byte position of the first invalid frame.
    pub position: u64,
    /// Byte position of the first valid frame after it.
    pub resume_at: u64,
    /// Valid records after `position` (all damaged ranges skipped).
    pub records_after: u64,
    /// Bytes from `resume_at` to the end of the file.
    pub bytes_after: u64,
    /// Total damaged bytes that repair would drop (all ranges, the torn tail excluded).
    pub damaged_bytes: u64,
    /// Number of damaged ranges.
    pub damaged_ranges: u64,
}

/// A range of bytes that was not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// First byte of the range.
    pub start: u64,
    /// One past the last byte (where the next valid frame starts, or the end of the file).
    pub end: u64,
    /// Valid records read before this range.
    pub records_before: u64,
}

/// What reading a log produced.
#[derive(Debug)]
pub struct Scan<T> {
    /// The decoded records, in file order.
    pub records: Vec<T>,
    /// Damaged ranges with valid frames after them (non-empty only when repairing).
    pub dropped: Vec<Damage>,
    /// The torn tail that was found (its bytes are not part of any record).
    pub torn_tail: Option<Damage>,
}

/// A frame that passes its checksum but whose payload does not decode: a bug or a file written
/// by an incompatible version (not repairable by dropping bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// Byte position of the frame.
    pub position: u64,
    /// The decoder's reason.
    pub reason: String,
}

/// Why reading failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// Damage followed by valid records, without repair.
    Corrupt(CorruptLog),
    /// A checksum-valid frame that does not decode.
    Undecodable(Undecodable),
}

impl Framing {
    fn get_u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        match self.order {
            ByteOrder::Little => u32::from_le_bytes(a),
            ByteOrder::Big => u32::from_be_bytes(a),
        }
    }

    fn put_u32(&self, out: &mut Vec<u8>, v: u32) {
        match self.order {
            ByteOrder::Little => out.extend_from_slice(&v.to_le_bytes()),
            ByteOrder::Big => out.extend_from_slice(&v.to_be_bytes()),
        }
    }

    /// Frames one payload.
    pub fn frame(&self, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(payload.len() + 8);
        self.put_u32(&mut out, len);
        self.put_u32(&mut out, crate::crc32c(payload));
        out.extend_from_slice(payload);
        out
    }

    /// The payload of the valid frame at `pos`, if there is one.
    fn payload_at<'a>(&self, data: &'a [u8], pos: usize) -> Option<&'a [u8]> {
        let header = data.get(pos..pos.checked_add(8)?)?;
        let len = self.get_u32(&header[..4]) as usize;
        if len == 0 || len > self.max_payload {
            return None;
        }
        let payload = data.get(pos + 8..(pos + 8).checked_add(len)?)?;
        (crate::crc32c(payload) == self.get_u32(&header[4..])).then_some(payload)
    }

    /// The first position after `from` where a valid frame that decodes starts.
    fn resync<T>(
        &self,
        data: &[u8],
        from: usize,
        decode: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Option<usize> {
        (from + 1..data.len().saturating_sub(8))
            .find(|&q| self.payload_at(data, q).is_some_and(|p| decode(p).is_ok()))
    }

    /// Reads every record of `data` (the contents of `path`), classifying invalid frames as
    /// described in the module docs. With `repair` damaged ranges are skipped and returned;
    /// without it the first one is an error. A torn tail is always returned, never an error.
    pub fn scan<T>(
        &self,
        path: &Path,
        data: &[u8],
        repair: bool,
        decode: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<Scan<T>, ScanError> {
        let mut scan = Scan {
            records: Vec::new(),
            dropped: Vec::new(),
            torn_tail: None,
        };
        let mut pos = 0usize;
        while pos < data.len() {
            if let Some(payload) = self.payload_at(data, pos) {
                match decode(payload) {
                    Ok(record) => scan.records.push(record),
                    Err(reason) => {
                        return Err(ScanError::Undecodable(Undecodable {
                            position: pos as u64,
                            reason,
                        }))
                    }
                }
                pos += 8 + payload.len();
                continue;
            }
            let records_before = scan.records.len() as u64;
            match self.resync(data, pos, &decode) {
                Some(next) => {
                    scan.dropped.push(Damage {
                        start: pos as u64,
                        end: next as u64,
                        records_before,
                    });
                    pos = next;
                }
                None => {
                    scan.torn_tail = Some(Damage {
                        start: pos as u64,
                        end: data.len() as u64,
                        records_before,
                    });
                    break;
                }
            }
        }
        if let (false, Some(first)) = (repair, scan.dropped.first()) {
            return Err(ScanError::Corrupt(CorruptLog {
                path: path.to_path_buf(),
                position: first.start,
                resume_at: first.end,
                records_after: scan.records.len() as u64 - first.records_before,
                bytes_after: data.len() as u64 - first.end,
                damaged_bytes: scan.dropped.iter().map(|d| d.end - d.start).sum(),
                damaged_ranges: scan.dropped.len() as u64,
            }));
        }
        Ok(scan)
    }

    /// Logs (and counts in metrics) what a scan of `path` cut or dropped.
    pub fn report<T>(&self, path: &Path, scan: &Scan<T>) {
        if let Some(tail) = &scan.torn_tail {
            tracing::warn!(path = %path.display(), position = tail.start,
                dropped_bytes = tail.end - tail.start, valid_records = tail.records_before,
                "log has a torn tail (an interrupted append); cutting it");
        }
        for d in &scan.dropped {
            tracing::error!(path = %path.display(), from = d.start, to = d.end,
                dropped_bytes = d.end - d.start, valid_records_before = d.records_before,
                "repairing a corrupt log: dropped damaged bytes (at least one record); the \
                 valid records after them are kept");
            metrics::counter!(REPAIRED_BYTES, "file" => self.kind).increment(d.end - d.start);
            metrics::counter!(REPAIRED_RANGES, "file" => self.kind).increment(1);
        }
    }
}

/// Metric: damaged bytes dropped by `--repair-corrupt-logs`, by kind of file.
pub const REPAIRED_BYTES: &str = "onceflow_broker_corrupt_bytes_dropped_total";
/// Metric: damaged ranges dropped by `--repair-corrupt-logs`, by kind of file.
pub const REPAIRED_RANGES: &str = "onceflow_broker_corrupt_ranges_dropped_total";

#[cfg(test)]
mod tests {
    use super::*;

    const F: Framing = Framing {
        order: ByteOrder::Big,
        max_payload: 1 << 20,
        kind: "test",
    };

    fn decode(p: &[u8]) -> Result<Vec<u8>, String> {
        Ok(p.to_vec())
    }

    fn file(n: u8) -> (Vec<u8>, Vec<usize>) {
        let mut data = Vec::new();
        let mut starts = Vec::new();
        for i in 0..n {
            starts.push(data.len());
            data.extend_from_slice(&F.frame(&[i; 20]));
        }
        (data, starts)
    }

    #[test]
    fn torn_tail_is_cut() {
        let (mut data, starts) = file(5);
        data.truncate(data.len() - 3);
        let scan = F.scan(Path::new("x"), &data, false, decode).unwrap();
        assert_eq!(scan.records.len(), 4);
        assert_eq!(scan.torn_tail.unwrap().start, starts[4] as u64);
        // Garbage (zeros, as a filesystem may leave) after the last record is a torn tail too.
        let (mut data, _) = file(5);
        data.extend_from_slice(&[0; 100]);
        let scan = F.scan(Path::new("x"), &data, false, decode).unwrap();
        assert_eq!(scan.records.len(), 5);
        assert!(scan.dropped.is_empty());
    }

    #[test]
    fn flipped_byte_in_the_middle_is_refused_then_repaired() {
        for at in [0, 3, 5, 12] {
            let (mut data, starts) = file(5);
            data[starts[2] + at] ^= 0x40;
            let err = F.scan(Path::new("x"), &data, false, decode).unwrap_err();
            let ScanError::Corrupt(c) = err else {
                panic!("{err:?}")
            };
            assert_eq!(c.position, starts[2] as u64);
            assert_eq!(c.resume_at, starts[3] as u64);
            assert_eq!(c.records_after, 2);
            assert_eq!(c.bytes_after, (data.len() - starts[3]) as u64);
            let scan = F.scan(Path::new("x"), &data, true, decode).unwrap();
            let kept: Vec<u8> = scan.records.iter().map(|r| r[0]).collect();
            assert_eq!(kept, vec![0, 1, 3, 4]);
            assert_eq!(scan.dropped.len(), 1);
            assert!(scan.torn_tail.is_none());
        }
    }

    #[test]
    fn undecodable_valid_frame_is_an_error() {
        let (data, _) = file(2);
        let err = F
            .scan(Path::new("x"), &data, true, |p: &[u8]| {
                if p[0] == 1 {
                    Err("bad".to_string())
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
        assert!(matches!(
            err,
            ScanError::Undecodable(Undecodable { position: 28, .. })
        ));
    }
}
