//! On-disk framing of snapshot and metadata files: magic, format version, kind, payload
//! length and a crc32c of the payload, so truncation and corruption are detected and
//! reported with the file's path.
//!
//! Layout (little endian): `b"OFLW"` | version u16 | kind u8 | reserved u8 | len u64 |
//! crc32c u32 | payload (`len` bytes, bincode 2 of a serde type).

use std::path::Path;

use serde::{de::DeserializeOwned, Serialize};

use crate::{Error, Result};

/// Magic bytes at the start of every file.
pub const MAGIC: &[u8; 4] = b"OFLW";
/// Current snapshot format version; readers reject newer versions.
///
/// History: 1 placed keys in key groups by FNV over the std `Hash` stream; 2 by the stable
/// hash of [`crate::keygroup`]. A version-1 checkpoint cannot be restored by this build: its
/// keys would land in other key groups than their state. 3 lets the metadata carry small
/// subtask snapshots inline (`StateFileMetadata::inline`); state frames are unchanged, and a
/// version-2 metadata file is read as one without inline state. 4 adds a source's event time
/// per split to its state (`SubtaskSnapshot::event_times`); older state frames restore
/// without it.
pub const FORMAT_VERSION: u16 = 4;
/// Oldest format version this build restores.
pub const MIN_FORMAT_VERSION: u16 = 2;
/// Size of the frame header.
pub const HEADER_LEN: usize = 20;

/// What a frame contains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A subtask's state snapshot.
    State = 1,
    /// A checkpoint's metadata.
    Metadata = 2,
}

/// bincode configuration used for every snapshot.
pub fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Serializes a serde value with bincode 2.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, bincode_config()).map_err(Error::serialization)
}

/// Largest allocation a decoded value may claim, whatever the input's length.
#[cfg(target_pointer_width = "64")]
pub const DECODE_LIMIT: usize = 1 << 34;
/// Largest allocation a decoded value may claim, whatever the input's length.
#[cfg(not(target_pointer_width = "64"))]
pub const DECODE_LIMIT: usize = 1 << 30;

/// How much memory a decoded value may claim per byte of input. bincode counts a collection's
/// claim as its length times the in-memory size of its element, and an element takes at least
/// one byte of input (a `String` or `Vec` of length 0 is 24 bytes in memory, 1 byte encoded),
/// so real values stay far below this; a corrupt length prefix in a short input cannot claim
/// gigabytes.
pub const DECODE_INFLATION: usize = 64;

/// The smallest claim limit (small inputs of legitimately wide types still decode).
pub const MIN_DECODE_LIMIT: usize = 1 << 20;

/// The claim limit for an input of `len` bytes: `len` x [`DECODE_INFLATION`], rounded up to a
/// power of two, within [`MIN_DECODE_LIMIT`]..=[`DECODE_LIMIT`].
pub fn decode_limit_for(len: usize) -> usize {
    len.saturating_mul(DECODE_INFLATION)
        .checked_next_power_of_two()
        .unwrap_or(DECODE_LIMIT)
        .clamp(MIN_DECODE_LIMIT, DECODE_LIMIT)
}

fn decode_limited<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8]) -> Result<T> {
    let config = bincode_config().with_limit::<LIMIT>();
    let (v, used) =
        bincode::serde::decode_from_slice::<T, _>(bytes, config).map_err(Error::serialization)?;
    if used != bytes.len() {
        return Err(Error::Serialization(format!(
            "{} trailing bytes after value",
            bytes.len() - used
        )));
    }
    Ok(v)
}

/// Deserializes a serde value with bincode 2; trailing bytes are an error. What the value may
/// allocate is bounded by the input's length ([`decode_limit_for`]): a corrupt file or a state
/// type changed between deploys fails with an error, never with a huge allocation.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    // bincode takes the limit as a const parameter: one instantiation per power of two
    macro_rules! ladder {
        ($limit:expr; $($bits:literal)*) => {
            match $limit.trailing_zeros() {
                $($bits => decode_limited::<T, { 1usize << $bits }>(bytes),)*
                _ => decode_limited::<T, DECODE_LIMIT>(bytes),
            }
        };
    }
    let limit = decode_limit_for(bytes.len());
    #[cfg(target_pointer_width = "64")]
    return ladder!(limit; 20 21 22 23 24 25 26 27 28 29 30 31 32 33);
    #[cfg(not(target_pointer_width = "64"))]
    return ladder!(limit; 20 21 22 23 24 25 26 27 28 29);
}

/// Wraps `payload` in a frame.
pub fn frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Verifies a frame read from `path` and returns its payload.
pub fn unframe<'a>(kind: FrameKind, bytes: &'a [u8], path: &Path) -> Result<&'a [u8]> {
    unframe_versioned(kind, bytes, path).map(|(_, payload)| payload)
}

/// [`unframe`], also returning the frame's format version (readers of a payload whose layout
/// changed between versions decode by it).
pub fn unframe_versioned<'a>(
    kind: FrameKind,
    bytes: &'a [u8],
    path: &Path,
) -> Result<(u16, &'a [u8])> {
    let corrupt = |reason: String| Error::CorruptCheckpoint {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    if &bytes[0..4] != MAGIC {
        return Err(corrupt("bad magic".into()));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version == 0 || version > FORMAT_VERSION {
        return Err(corrupt(format!(
            "unsupported format version {version} (this build reads up to {FORMAT_VERSION})"
        )));
    }
    if version < MIN_FORMAT_VERSION {
        return Err(Error::IncompatibleCheckpoint {
            path: path.to_path_buf(),
            version,
        });
    }
    if bytes[6] != kind as u8 {
        return Err(corrupt(format!("unexpected frame kind {}", bytes[6])));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[8..16]);
    let len = u64::from_le_bytes(len8);
    let mut crc4 = [0u8; 4];
    crc4.copy_from_slice(&bytes[16..20]);
    let crc = u32::from_le_bytes(crc4);
    let payload = &bytes[HEADER_LEN..];
    if payload.len() as u64 != len {
        return Err(corrupt(format!(
            "truncated: header says {len} payload bytes, file has {}",
            payload.len()
        )));
    }
    let actual = crc32c::crc32c(payload);
    if actual != crc {
        return Err(corrupt(format!(
            "checksum mismatch (stored {crc:#010x}, computed {actual:#010x})"
        )));
    }
    Ok((version, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A corrupt length prefix (or a state type changed between deploys) must give an error,
    /// never a huge allocation that aborts the process.
    #[test]
    fn huge_length_prefixes_are_errors_not_allocations() {
        // varint u64 marker 253 followed by u64::MAX / 2 as the element count
        let mut huge = vec![253u8];
        huge.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        huge.extend_from_slice(&[1, 2, 3]);
        assert!(decode::<Vec<u64>>(&huge).is_err());
        assert!(decode::<Vec<(String, Vec<u8>)>>(&huge).is_err());
        assert!(decode::<String>(&huge).is_err());
        assert!(decode::<Vec<u8>>(&huge).is_err());
        assert!(decode::<std::collections::HashMap<u64, String>>(&huge).is_err());
        // 2^33 elements: under the old 16 GiB limit for bytes, far over this input's size
        let mut big = vec![253u8];
        big.extend_from_slice(&(1u64 << 33).to_le_bytes());
        big.extend_from_slice(&[0; 16]);
        assert!(decode::<Vec<u8>>(&big).is_err());
        assert!(decode::<Vec<u64>>(&big).is_err());
        assert!(decode::<String>(&big).is_err());
    }

    #[test]
    fn the_decode_limit_follows_the_input_length() {
        assert_eq!(decode_limit_for(0), MIN_DECODE_LIMIT);
        assert_eq!(decode_limit_for(21), MIN_DECODE_LIMIT);
        assert_eq!(decode_limit_for(1 << 20), 1 << 26);
        assert_eq!(decode_limit_for((1 << 20) + 1), 1 << 27);
        assert_eq!(decode_limit_for(usize::MAX), DECODE_LIMIT);
        // a String claiming 5.3 GB in a 21-byte input (found by fuzzing checkpoint files)
        let mut short = vec![253u8];
        short.extend_from_slice(&5_352_129_283u64.to_le_bytes());
        short.extend_from_slice(&[0; 12]);
        assert!(decode::<(String, Vec<u8>)>(&short).is_err());
        // wide values still decode: 10,000 empty strings are 10,000 bytes, 240 KB in memory
        let wide = encode(&vec![String::new(); 10_000]).unwrap();
        assert_eq!(decode::<Vec<String>>(&wide).unwrap().len(), 10_000);
    }

    #[test]
    fn frame_round_trip_and_detects_damage() {
        let p = Path::new("x.state");
        let f = frame(FrameKind::State, b"hello");
        assert_eq!(unframe(FrameKind::State, &f, p).unwrap(), b"hello");
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        let e = unframe(FrameKind::State, &bad, p).unwrap_err().to_string();
        assert!(e.contains("x.state") && e.contains("checksum"), "{e}");
        let e = unframe(FrameKind::State, &f[..f.len() - 1], p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        assert!(unframe(FrameKind::Metadata, &f, p).is_err());
    }

    #[test]
    fn decode_rejects_absurd_lengths_and_trailing_bytes() {
        // a Vec<u8> claiming u64::MAX elements
        let mut bogus = vec![253u8];
        bogus.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<Vec<u8>>(&bogus).is_err());
        let mut ok = encode(&vec![1u8, 2, 3]).unwrap();
        assert_eq!(decode::<Vec<u8>>(&ok).unwrap(), vec![1, 2, 3]);
        ok.push(0);
        assert!(decode::<Vec<u8>>(&ok).is_err());
    }
}
