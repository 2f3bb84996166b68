//! Decompression of a stored batch's records section with a hard cap on the output.
//!
//! The broker keeps batches compressed as producers sent them; only a few paths (ListOffsets
//! by timestamp, the log cleaner) look inside. What they decompress comes from outside the
//! process, so a small batch that inflates to gigabytes (a "zip bomb") must fail with an error
//! instead of taking the broker's memory: every codec is read as a stream and stops one byte
//! past the cap. The cap derives from the topic's `max.message.bytes` ([`cap_for`]).

use std::io::Read;

/// How many times `max.message.bytes` a batch may inflate to. Real record data compresses
/// 2-10x; this leaves room for very repetitive values while bounding memory per request.
pub const INFLATION_LIMIT: usize = 64;

/// Never cap below this (a topic with a tiny `max.message.bytes` still decodes its batches).
pub const MIN_CAP: usize = 1 << 20;

/// The decompressed-size cap for a topic whose `max.message.bytes` is `max_message_bytes`.
pub fn cap_for(max_message_bytes: i32) -> usize {
    usize::try_from(max_message_bytes)
        .unwrap_or(0)
        .saturating_mul(INFLATION_LIMIT)
        .max(MIN_CAP)
}

/// Why a records section could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    /// Attributes name a compression codec Kafka does not define.
    #[error("unknown compression codec {0}")]
    UnknownCodec(i16),
    /// The codec refused the bytes.
    #[error("decompression failed: {0}")]
    Codec(String),
    /// The output would exceed the cap; nothing beyond the cap was kept in memory.
    #[error("records inflate past the cap of {cap} bytes")]
    TooLarge {
        /// The cap that was hit.
        cap: usize,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, DecompressError>;

/// Decompresses `compressed` (codec from the batch attributes' low 3 bits: 1 gzip, 2 snappy,
/// 3 lz4, 4 zstd; 0 returns the bytes as they are) into at most `cap` bytes.
pub fn decompress_capped(codec: i16, compressed: &[u8], cap: usize) -> Result<Vec<u8>> {
    let codec_err = |e: std::io::Error| DecompressError::Codec(e.to_string());
    match codec {
        0 if compressed.len() > cap => Err(DecompressError::TooLarge { cap }),
        0 => Ok(compressed.to_vec()),
        1 => read_capped(flate2::read::MultiGzDecoder::new(compressed), cap),
        2 => snappy(compressed, cap),
        3 => read_capped(lz4::Decoder::new(compressed).map_err(codec_err)?, cap),
        4 => read_capped(
            zstd::stream::read::Decoder::with_buffer(compressed).map_err(codec_err)?,
            cap,
        ),
        other => Err(DecompressError::UnknownCodec(other)),
    }
}

/// Reads a decoder to its end, failing as soon as it yields more than `cap` bytes.
fn read_capped(reader: impl Read, cap: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| DecompressError::Codec(e.to_string()))?;
    if out.len() > cap {
        return Err(DecompressError::TooLarge { cap });
    }
    Ok(out)
}

/// snappy-java's framing, which Kafka uses: a 16-byte magic header, then blocks of a 4-byte
/// big-endian length and raw snappy bytes. Without the header the bytes are one raw snappy
/// block (what snappy-java's input stream also accepts). Each block states its decompressed
/// length up front, so the cap is checked before anything is allocated.
fn snappy(compressed: &[u8], cap: usize) -> Result<Vec<u8>> {
    const MAGIC: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
    let mut out = Vec::new();
    let append = |block: &[u8], out: &mut Vec<u8>| -> Result<()> {
        let len = snap::raw::decompress_len(block)
            .map_err(|e| DecompressError::Codec(format!("snappy block header: {e}")))?;
        if out.len().saturating_add(len) > cap {
            return Err(DecompressError::TooLarge { cap });
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| DecompressError::Codec(format!("snappy block: {e}")))?;
        Ok(())
    };
    let Some(mut rest) = compressed.strip_prefix(MAGIC.as_slice()) else {
        append(compressed, &mut out)?;
        return Ok(out);
    };
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| DecompressError::Codec("snappy block length truncated".into()))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = tail
            .get(..len)
            .ok_or_else(|| DecompressError::Codec("snappy block truncated".into()))?;
        append(block, &mut out)?;
        rest = &tail[len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};

    fn compress(codec: i16, data: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let fill = |b: &mut BytesMut| {
            b.extend_from_slice(data);
            Ok(())
        };
        match codec {
            1 => Gzip::compress(&mut out, fill),
            2 => Snappy::compress(&mut out, fill),
            3 => Lz4::compress(&mut out, fill),
            4 => Zstd::compress(&mut out, fill),
            _ => unreachable!(),
        }
        .expect("compress");
        Bytes::from(out).to_vec()
    }

    #[test]
    fn every_codec_round_trips_under_the_cap() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for codec in 1..=4 {
            let packed = compress(codec, &data);
            assert_eq!(
                decompress_capped(codec, &packed, data.len()).as_deref(),
                Ok(&data[..]),
                "codec {codec}"
            );
        }
    }

    #[test]
    fn every_codec_stops_one_byte_past_the_cap() {
        let data = vec![7u8; 4 << 20];
        for codec in 1..=4 {
            let packed = compress(codec, &data);
            assert!(packed.len() < data.len() / 10, "codec {codec} compresses");
            assert_eq!(
                decompress_capped(codec, &packed, data.len() - 1),
                Err(DecompressError::TooLarge {
                    cap: data.len() - 1
                }),
                "codec {codec}"
            );
        }
        assert_eq!(
            decompress_capped(0, &[1, 2, 3], 2),
            Err(DecompressError::TooLarge { cap: 2 })
        );
    }

    #[test]
    fn garbage_and_unknown_codecs_are_errors() {
        for codec in 1..=4 {
            assert!(matches!(
                decompress_capped(codec, b"not compressed at all", 1 << 20),
                Err(DecompressError::Codec(_))
            ));
        }
        assert_eq!(
            decompress_capped(5, b"x", 10),
            Err(DecompressError::UnknownCodec(5))
        );
    }

    #[test]
    fn the_cap_follows_max_message_bytes() {
        assert_eq!(cap_for(1_048_588), 1_048_588 * INFLATION_LIMIT);
        assert_eq!(cap_for(10), MIN_CAP);
        assert_eq!(cap_for(-1), MIN_CAP);
    }
}
