//! The log-start checkpoint of a partition (`log-start.checkpoint`): the first offset readers
//! may see once retention or DeleteRecords moved it. DeleteRecords may move it inside a
//! segment, so it cannot be derived from the segment files; retention writes it too, before
//! deleting anything, so recovery can finish an interrupted deletion.
//!
//! Format: `"OFLS" | version u16 = 1 | offset i64 | crc32c u32` (big endian, CRC over the 14
//! bytes before it), replaced atomically.

/// File name inside the partition directory.
pub const LOG_START_FILE: &str = "log-start.checkpoint";
const MAGIC: &[u8; 4] = b"OFLS";
const VERSION: u16 = 1;
const LEN: usize = 4 + 2 + 8 + 4;

/// Encodes a checkpoint of `offset`.
pub fn encode(offset: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    let crc = crate::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes a checkpoint; an error says why it is not trusted.
pub fn decode(bytes: &[u8]) -> Result<i64, String> {
    if bytes.len() != LEN {
        return Err(format!("length {} instead of {LEN}", bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err("bad magic".into());
    }
    let stored = u32::from_be_bytes([bytes[14], bytes[15], bytes[16], bytes[17]]);
    if crate::crc32c(&bytes[..14]) != stored {
        return Err("checksum mismatch".into());
    }
    let version = u16::from_be_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(format!("unknown version {version}"));
    }
    let mut off = [0u8; 8];
    off.copy_from_slice(&bytes[6..14]);
    let offset = i64::from_be_bytes(off);
    if offset < 0 {
        return Err(format!("negative offset {offset}"));
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_and_rejects_damage() {
        let bytes = encode(4711);
        assert_eq!(decode(&bytes), Ok(4711));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x04;
            assert!(decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&bytes[..10]).is_err());
    }
}
