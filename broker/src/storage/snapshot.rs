//! Producer-state snapshot files: `<offset>.snapshot` holds the idempotent-producer state of a
//! partition after every batch below `offset`. Recovery loads the newest valid snapshot at or
//! below the recovered log end and replays the log from there.
//!
//! Format (big endian): `b"OFPS"`, version u16 (1), offset i64, entry count u32, entries, then
//! CRC-32C u32 of everything before it. Entry: producer id i64, epoch i16, last timestamp i64,
//! open transaction first offset i64 (-1 none), coordinator epoch i32, batch count u8, batches
//! (first seq i32, last seq i32, base offset i64, last offset i64).

use std::collections::VecDeque;

use super::producer_state::{BatchMeta, ProducerEntry, ProducerStates, MAX_REMEMBERED_BATCHES};

const MAGIC: &[u8; 4] = b"OFPS";
const VERSION: u16 = 1;

/// Serializes the state as of `offset`.
pub fn encode(offset: i64, states: &ProducerStates) -> Vec<u8> {
    let mut out = Vec::with_capacity(22 + states.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&(states.len() as u32).to_be_bytes());
    let mut entries: Vec<_> = states.iter().collect();
    entries.sort_by_key(|(pid, _)| **pid);
    for (pid, e) in entries {
        out.extend_from_slice(&pid.to_be_bytes());
        out.extend_from_slice(&e.epoch.to_be_bytes());
        out.extend_from_slice(&e.last_timestamp.to_be_bytes());
        out.extend_from_slice(&e.txn_first_offset.unwrap_or(-1).to_be_bytes());
        out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
        out.push(e.batches.len() as u8);
        for b in &e.batches {
            out.extend_from_slice(&b.first_seq.to_be_bytes());
            out.extend_from_slice(&b.last_seq.to_be_bytes());
            out.extend_from_slice(&b.base_offset.to_be_bytes());
            out.extend_from_slice(&b.last_offset.to_be_bytes());
        }
    }
    let crc = crate::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.buf.len() < N {
            return Err("snapshot ends early".into());
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[..N]);
        self.buf = &self.buf[N..];
        Ok(a)
    }
    fn i64(&mut self) -> Result<i64, String> {
        self.take::<8>().map(i64::from_be_bytes)
    }
    fn i32(&mut self) -> Result<i32, String> {
        self.take::<4>().map(i32::from_be_bytes)
    }
    fn i16(&mut self) -> Result<i16, String> {
        self.take::<2>().map(i16::from_be_bytes)
    }
}

/// Decodes and verifies a snapshot: `(offset, state)`, or why it is not trusted.
pub fn decode(bytes: &[u8]) -> Result<(i64, ProducerStates), String> {
    if bytes.len() < 22 {
        return Err(format!("{} bytes is too short for a snapshot", bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crate::crc32c(body) != stored {
        return Err("snapshot CRC mismatch".into());
    }
    let mut r = Reader { buf: body };
    if &r.take::<4>()? != MAGIC {
        return Err("not a producer-state snapshot".into());
    }
    let version = u16::from_be_bytes(r.take::<2>()?);
    if version != VERSION {
        return Err(format!("unsupported snapshot version {version}"));
    }
    let offset = r.i64()?;
    let count = u32::from_be_bytes(r.take::<4>()?);
    let mut states = ProducerStates::default();
    for _ in 0..count {
        let pid = r.i64()?;
        let epoch = r.i16()?;
        let last_timestamp = r.i64()?;
        let txn = r.i64()?;
        let coordinator_epoch = r.i32()?;
        let n = r.take::<1>()?[0] as usize;
        if n > MAX_REMEMBERED_BATCHES {
            return Err(format!("producer {pid} has {n} batches"));
        }
        let mut batches = VecDeque::with_capacity(n);
        for _ in 0..n {
            batches.push_back(BatchMeta {
                first_seq: r.i32()?,
                last_seq: r.i32()?,
                base_offset: r.i64()?,
                last_offset: r.i64()?,
            });
        }
        states.insert(
            pid,
            ProducerEntry {
                epoch,
                batches,
                last_timestamp,
                txn_first_offset: (txn >= 0).then_some(txn),
                coordinator_epoch,
            },
        );
    }
    if !r.buf.is_empty() {
        return Err(format!(
            "{} unexpected bytes after the entries",
            r.buf.len()
        ));
    }
    Ok((offset, states))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::{encode_batch, parse_header, BatchSpec, RecordSpec};

    #[test]
    fn round_trip_and_corruption() {
        let mut s = ProducerStates::default();
        for (pid, seq, off) in [(5, 0, 0), (5, 2, 2), (9, 0, 4)] {
            let b = encode_batch(
                BatchSpec {
                    base_offset: off,
                    producer_id: pid,
                    producer_epoch: 3,
                    base_sequence: seq,
                    ..BatchSpec::default()
                },
                &[RecordSpec::default(), RecordSpec::default()],
            );
            s.replay(&parse_header(&b).unwrap());
        }
        let bytes = encode(6, &s);
        assert_eq!(decode(&bytes), Ok((6, s)));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[]).is_err());
    }
}
