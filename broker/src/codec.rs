//! Kafka wire framing: 4-byte big-endian size prefix, request header, response encoding.
//!
//! Sans-I/O apart from [`read_frame`]: headers are decoded from and responses encoded into
//! `bytes` buffers with the kafka-protocol crate, choosing the header version per API and
//! version (flexible versions use header v2 for requests and v1 for responses, ApiVersions
//! responses always v0).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Smallest request: api key (2) + api version (2) + correlation id (4) + client id length (2).
pub const MIN_REQUEST_BYTES: usize = 10;

/// Why a frame or header could not be handled; every variant closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Reading from the socket failed (peer reset, broken pipe).
    #[error("socket read: {0}")]
    Io(#[from] std::io::Error),
    /// The size prefix is negative or exceeds the configured limit (client bug or garbage).
    #[error("frame size {size} outside 10..={max} bytes")]
    BadFrameSize {
        /// The size the peer announced.
        size: i64,
        /// The configured maximum.
        max: usize,
    },
    /// The connection ended inside a frame.
    #[error("connection closed inside a frame ({got} of {want} bytes)")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes announced.
        want: usize,
    },
    /// The API key is not one Kafka defines.
    #[error("unknown api key {0}")]
    UnknownApiKey(i16),
    /// The header or body did not decode at its version (malformed input from the peer).
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// The decoder's message.
        reason: String,
    },
    /// A response could not be encoded: a broker bug.
    #[error("cannot encode response {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// The encoder's message.
        reason: String,
    },
}

/// Result type of the codec.
pub type Result<T> = std::result::Result<T, CodecError>;

/// Reads one size-prefixed frame. `Ok(None)` on a clean end of stream between frames.
/// The buffer grows as bytes arrive, so a large announced size costs nothing until sent.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, max: usize) -> Result<Option<Bytes>> {
    let mut size_buf = [0u8; 4];
    let mut filled = 0;
    while filled < 4 {
        let n = reader.read(&mut size_buf[filled..]).await?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(CodecError::Truncated {
                    got: filled,
                    want: 4,
                })
            };
        }
        filled += n;
    }
    let size = i32::from_be_bytes(size_buf);
    let want = usize::try_from(size)
        .ok()
        .filter(|s| (MIN_REQUEST_BYTES..=max).contains(s));
    let Some(want) = want else {
        return Err(CodecError::BadFrameSize {
            size: i64::from(size),
            max,
        });
    };
    let mut buf = BytesMut::with_capacity(want.min(64 * 1024));
    while buf.len() < want {
        if buf.capacity() == buf.len() {
            buf.reserve((want - buf.len()).min(buf.len().max(64 * 1024)));
        }
        let room = want - buf.len();
        let n = (&mut *reader).take(room as u64).read_buf(&mut buf).await?;
        if n == 0 {
            return Err(CodecError::Truncated {
                got: buf.len(),
                want,
            });
        }
    }
    Ok(Some(buf.freeze()))
}

/// The fixed prefix every request header version shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPrefix {
    /// Raw API key.
    pub api_key: i16,
    /// Requested API version.
    pub api_version: i16,
    /// Correlation id to echo.
    pub correlation_id: i32,
}

/// Reads the api key, version and correlation id without consuming the frame.
pub fn peek_prefix(frame: &[u8]) -> Result<HeaderPrefix> {
    let mut b = frame.get(..8).ok_or_else(|| CodecError::Decode {
        what: "request header".into(),
        reason: format!("{} bytes", frame.len()),
    })?;
    Ok(HeaderPrefix {
        api_key: b.get_i16(),
        api_version: b.get_i16(),
        correlation_id: b.get_i32(),
    })
}

/// Decodes the request header at the version its API key and version call for; returns the
/// header and the remaining body bytes.
pub fn decode_header(api_key: ApiKey, mut frame: Bytes) -> Result<(RequestHeader, Bytes)> {
    let version = peek_prefix(&frame)?.api_version;
    let header_version = api_key.request_header_version(version);
    let header =
        RequestHeader::decode(&mut frame, header_version).map_err(|e| CodecError::Decode {
            what: format!("{api_key:?} v{version} request header v{header_version}"),
            reason: e.to_string(),
        })?;
    Ok((header, frame))
}

/// Decodes a request body of type `T` at `version`.
pub fn decode_body<T: Decodable>(api_key: ApiKey, version: i16, mut body: Bytes) -> Result<T> {
    // The decoder trusts array counts for its allocations; refuse impossible ones first.
    crate::request_guard::check(api_key, version, &body).map_err(|e| CodecError::Decode {
        what: format!("{api_key:?} v{version} request"),
        reason: e.to_string(),
    })?;
    let decoded = T::decode(&mut body, version).map_err(|e| CodecError::Decode {
        what: format!("{api_key:?} v{version} request"),
        reason: e.to_string(),
    })?;
    if body.has_remaining() {
        tracing::debug!(api = ?api_key, version, trailing = body.remaining(), "request has trailing bytes");
    }
    Ok(decoded)
}

/// Encodes a complete response frame: size prefix, response header, body.
pub fn encode_response<T: Encodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &T,
) -> Result<Bytes> {
    encode_response_with_header_version(
        api_key,
        version,
        api_key.response_header_version(version),
        correlation_id,
        body,
    )
}

/// Like [`encode_response`] with an explicit header version (the KIP-511 fallback answers an
/// unsupported ApiVersions request with a v0 body and header).
pub fn encode_response_with_header_version<T: Encodable>(
    api_key: ApiKey,
    version: i16,
    header_version: i16,
    correlation_id: i32,
    body: &T,
) -> Result<Bytes> {
    let encode_err = |reason: String| CodecError::Encode {
        what: format!("{api_key:?} v{version}"),
        reason,
    };
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header
        .compute_size(header_version)
        .and_then(|h| body.compute_size(version).map(|b| h + b))
        .map_err(|e| encode_err(e.to_string()))?;
    let prefix =
        i32::try_from(size).map_err(|_| encode_err(format!("response of {size} bytes")))?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(prefix);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| encode_err(e.to_string()))?;
    body.encode(&mut buf, version)
        .map_err(|e| encode_err(e.to_string()))?;
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsResponse;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as i32).to_be_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[tokio::test]
    async fn frames_are_read_whole_and_in_order() {
        let mut input = frame(&[1; 10]);
        input.extend(frame(&[2; 12]));
        let mut r = &input[..];
        assert_eq!(
            read_frame(&mut r, 100).await.unwrap().unwrap(),
            vec![1u8; 10]
        );
        assert_eq!(
            read_frame(&mut r, 100).await.unwrap().unwrap(),
            vec![2u8; 12]
        );
        assert!(read_frame(&mut r, 100).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn bad_sizes_and_truncation_are_errors() {
        for size in [-1i32, 0, 9, 101] {
            let input = size.to_be_bytes();
            let err = read_frame(&mut &input[..], 100).await.unwrap_err();
            assert!(
                matches!(err, CodecError::BadFrameSize { .. }),
                "{size}: {err}"
            );
        }
        let mut short = 20i32.to_be_bytes().to_vec();
        short.extend([0; 5]);
        let err = read_frame(&mut &short[..], 100).await.unwrap_err();
        assert!(
            matches!(err, CodecError::Truncated { got: 5, want: 20 }),
            "{err}"
        );
        let err = read_frame(&mut &[0u8, 0][..], 100).await.unwrap_err();
        assert!(
            matches!(err, CodecError::Truncated { got: 2, want: 4 }),
            "{err}"
        );
    }

    #[test]
    fn header_prefix_and_response_framing() {
        let prefix = peek_prefix(&[0, 18, 0, 3, 0, 0, 1, 0, 0xff, 0xff]).unwrap();
        assert_eq!(
            prefix,
            HeaderPrefix {
                api_key: 18,
                api_version: 3,
                correlation_id: 256
            }
        );
        assert!(peek_prefix(&[0, 18, 0]).is_err());
        let body = ApiVersionsResponse::default();
        let out = encode_response(ApiKey::ApiVersions, 3, 7, &body).unwrap();
        let size = i32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(size, out.len() - 4);
        // ApiVersions responses always use header v0: just the correlation id.
        assert_eq!(&out[4..8], &7i32.to_be_bytes());
    }
}
