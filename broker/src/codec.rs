//! Kafka wire framing: 4-byte big-endian size prefix, request header, response encoding.
//!
//! Sans-I/O apart from [`FrameReader`]: headers are decoded from and responses encoded into
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

/// Smallest buffer a connection reads into.
const MIN_READ_BUFFER: usize = 64 * 1024;

/// Largest buffer a connection reads into ahead of need; a larger frame gets a buffer of
/// exactly its size.
const MAX_READ_BUFFER: usize = 4 * 1024 * 1024;

/// Earlier read buffers a connection keeps for reuse.
const SPARE_READ_BUFFERS: usize = 4;

/// Reads size-prefixed frames from a connection into reused buffers.
///
/// Frames are cut out of a buffer as shared [`Bytes`] (no copy), so a frame stays valid while
/// the connection reads on. Once every frame cut from a buffer has been dropped, the buffer
/// is used again instead of allocating: a producer streaming megabyte requests costs no fresh
/// memory per request (fresh pages are zeroed by the kernel, which dominated the broker's CPU
/// profile at 1 KiB records). A socket read fills whatever room the buffer has, so small
/// requests arrive several per system call. The buffer grows as bytes arrive (at most
/// doubling what is buffered, until a frame of that size was completed once), so a large
/// announced size costs nothing until it is sent.
#[derive(Debug)]
pub struct FrameReader<R> {
    reader: R,
    max: usize,
    /// Unconsumed bytes (the start of the next frame) plus room to read into.
    buf: BytesMut,
    /// Size of `buf`'s allocation.
    buf_capacity: usize,
    /// How much room a new buffer gets: four times the largest frame seen (rounded up to a
    /// power of two), within limits.
    target: usize,
    /// Earlier buffers (and their allocation sizes), reused once their frames are dropped.
    spares: Vec<(BytesMut, usize)>,
    /// Buffers allocated so far.
    allocations: u64,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads frames of at most `max` bytes (size prefix excluded) from `reader`.
    pub fn new(reader: R, max: usize) -> Self {
        FrameReader {
            reader,
            max,
            buf: BytesMut::new(),
            buf_capacity: 0,
            target: MIN_READ_BUFFER,
            spares: Vec::new(),
            allocations: 0,
        }
    }

    /// Changes the largest frame accepted from here on (e.g. once a SASL client has
    /// authenticated).
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// How many buffers the reader has allocated so far.
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// The next frame without its size prefix; `Ok(None)` on a clean end of stream between
    /// frames.
    pub async fn next_frame(&mut self) -> Result<Option<Bytes>> {
        loop {
            let missing = match self.frame_size()? {
                Some(want) if self.buf.len() >= 4 + want => {
                    // Powers of two, so that slowly growing frames do not make every buffer
                    // too small.
                    let wanted = want.saturating_add(4).saturating_mul(4).next_power_of_two();
                    self.target = self.target.max(wanted.min(MAX_READ_BUFFER));
                    self.buf.advance(4);
                    return Ok(Some(self.buf.split_to(want).freeze()));
                }
                Some(want) => 4 + want - self.buf.len(),
                None => 4 - self.buf.len(),
            };
            // Room for what the frame still lacks, but no more than the bytes already here or
            // the buffer size of frames this connection completed: a peer that announces a
            // large frame and sends little of it costs memory in proportion to what it sent.
            let room = missing
                .min(MAX_READ_BUFFER)
                .min(self.target.max(self.buf.len()));
            self.make_room(room);
            if self.reader.read_buf(&mut self.buf).await? == 0 {
                return match self.frame_size()? {
                    _ if self.buf.is_empty() => Ok(None),
                    None => Err(CodecError::Truncated {
                        got: self.buf.len(),
                        want: 4,
                    }),
                    Some(want) => Err(CodecError::Truncated {
                        got: self.buf.len() - 4,
                        want,
                    }),
                };
            }
        }
    }

    /// The announced size of the frame at the front of the buffer, once its prefix is in.
    fn frame_size(&mut self) -> Result<Option<usize>> {
        let Some(prefix) = self.buf.get(..4) else {
            return Ok(None);
        };
        let size = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let want = usize::try_from(size)
            .ok()
            .filter(|s| (MIN_REQUEST_BYTES..=self.max).contains(s));
        let Some(want) = want else {
            return Err(CodecError::BadFrameSize {
                size: i64::from(size),
                max: self.max,
            });
        };
        Ok(Some(want))
    }

    /// Makes room for at least `need` more bytes after the buffered ones: in place if the
    /// buffer's frames are all dropped, else in a spare whose frames are, else in a new
    /// buffer. The buffered bytes (a partial frame) move along.
    fn make_room(&mut self, need: usize) {
        if self.buf.capacity() - self.buf.len() >= need {
            return;
        }
        // Doubling keeps the copying of a frame larger than MAX_READ_BUFFER linear in its size.
        let capacity = (self.buf.len() + need)
            .max(self.target)
            .max(2 * self.buf.len());
        if self.buf_capacity >= capacity && self.buf.try_reclaim(need) {
            return;
        }
        let reusable = self
            .spares
            .iter_mut()
            .position(|(spare, size)| *size >= capacity && spare.try_reclaim(capacity));
        let (mut next, next_capacity) = match reusable {
            Some(i) => self.spares.swap_remove(i),
            None => {
                self.allocations += 1;
                if capacity > crate::bufpool::BUFFER / 2 && capacity <= crate::bufpool::BUFFER {
                    // A pooled buffer's pages are mapped already: the socket read does not
                    // fault them in on the request's path.
                    (crate::bufpool::take(), crate::bufpool::BUFFER)
                } else {
                    (BytesMut::with_capacity(capacity), capacity)
                }
            }
        };
        next.extend_from_slice(&self.buf);
        let mut old = std::mem::replace(&mut self.buf, next);
        let old_capacity = std::mem::replace(&mut self.buf_capacity, next_capacity);
        old.clear();
        // Buffers grown for an unusually large frame are not kept.
        if old_capacity > 0 && old_capacity <= 2 * MAX_READ_BUFFER {
            if self.spares.len() == SPARE_READ_BUFFERS {
                // Kept by the pool if nothing else holds it (the in-memory log keeps the
                // produced batches of a frame as they were read).
                crate::bufpool::give_back(self.spares.remove(0).0);
            }
            self.spares.push((old, old_capacity));
        }
    }
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

/// An encoded response frame, size prefix included, as pieces written to the socket in
/// order. Most responses are one piece; a Fetch response carries the stored record bytes as
/// pieces of their own, shared with the log rather than copied into the frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseFrame {
    parts: Vec<Bytes>,
}

impl ResponseFrame {
    /// A frame made of `parts` (their concatenation is the frame).
    pub fn from_parts(parts: Vec<Bytes>) -> Self {
        ResponseFrame { parts }
    }

    /// The pieces, in the order they are written.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Whether the frame has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame as one contiguous buffer (copies when it has several pieces).
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => {
                let mut out = BytesMut::with_capacity(self.len());
                for part in parts {
                    out.extend_from_slice(part);
                }
                out.freeze()
            }
        }
    }
}

impl From<Bytes> for ResponseFrame {
    fn from(frame: Bytes) -> Self {
        ResponseFrame { parts: vec![frame] }
    }
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

    async fn read_one(input: &[u8], max: usize) -> Result<Option<Bytes>> {
        FrameReader::new(input, max).next_frame().await
    }

    #[tokio::test]
    async fn frames_are_read_whole_and_in_order() {
        let mut input = frame(&[1; 10]);
        input.extend(frame(&[2; 12]));
        let mut r = FrameReader::new(&input[..], 100);
        assert_eq!(r.next_frame().await.unwrap().unwrap(), vec![1u8; 10]);
        assert_eq!(r.next_frame().await.unwrap().unwrap(), vec![2u8; 12]);
        assert!(r.next_frame().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn bad_sizes_and_truncation_are_errors() {
        for size in [-1i32, 0, 9, 101] {
            let input = size.to_be_bytes();
            let err = read_one(&input, 100).await.unwrap_err();
            assert!(
                matches!(err, CodecError::BadFrameSize { .. }),
                "{size}: {err}"
            );
        }
        let mut short = 20i32.to_be_bytes().to_vec();
        short.extend([0; 5]);
        let err = read_one(&short, 100).await.unwrap_err();
        assert!(
            matches!(err, CodecError::Truncated { got: 5, want: 20 }),
            "{err}"
        );
        let err = read_one(&[0u8, 0], 100).await.unwrap_err();
        assert!(
            matches!(err, CodecError::Truncated { got: 2, want: 4 }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn buffers_are_reused_once_frames_are_dropped_and_held_frames_stay_intact() {
        // Frames of 10..=300 KB, written in pieces that cut through size prefixes.
        let sizes: Vec<usize> = (0..200).map(|i| 10 + (i * 7919) % 300_000).collect();
        let mut input = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            input.extend(frame(&vec![i as u8; *size]));
        }
        let (mut tx, rx) = tokio::io::duplex(8192);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in input.chunks(5_003) {
                tx.write_all(piece).await.unwrap();
            }
        });
        let mut reader = FrameReader::new(rx, 1 << 20);
        let mut held = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let f = reader.next_frame().await.unwrap().unwrap();
            assert_eq!(f.len(), *size, "frame {i}");
            assert!(f.iter().all(|b| *b == i as u8), "frame {i}");
            // Every tenth frame is kept to the end, pinning its buffer.
            if i % 10 == 0 {
                held.push((i, f));
            }
        }
        assert!(reader.next_frame().await.unwrap().is_none());
        writer.await.unwrap();
        for (i, f) in held {
            assert!(f.iter().all(|b| *b == i as u8), "held frame {i}");
        }
        // 30 MB passed through; most of it through reused buffers.
        assert!(
            reader.allocations() < 40,
            "{} buffers allocated",
            reader.allocations()
        );
    }

    #[tokio::test]
    async fn a_reader_whose_frames_are_dropped_stops_allocating() {
        let mut input = Vec::new();
        for i in 0..300usize {
            input.extend(frame(&vec![i as u8; 200_000 + i]));
        }
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&input).await.unwrap();
        });
        let mut reader = FrameReader::new(rx, 1 << 20);
        let mut after_warm_up = 0;
        for i in 0..300usize {
            let f = reader.next_frame().await.unwrap().unwrap();
            assert_eq!(f.len(), 200_000 + i);
            assert!(f.iter().all(|b| *b == i as u8), "frame {i}");
            if i == 10 {
                after_warm_up = reader.allocations();
            }
        }
        writer.await.unwrap();
        // 60 MB after the warm-up without a single new buffer.
        assert_eq!(reader.allocations(), after_warm_up);
    }

    #[tokio::test]
    async fn an_announced_frame_costs_memory_only_as_its_bytes_arrive() {
        use tokio::io::AsyncWriteExt;
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(rx, 100 << 20);
        // 50 MiB announced, 100 bytes sent, then the peer stalls.
        tx.write_all(&(50i32 << 20).to_be_bytes()).await.unwrap();
        tx.write_all(&[0u8; 100]).await.unwrap();
        let stalled =
            tokio::time::timeout(std::time::Duration::from_millis(50), reader.next_frame()).await;
        assert!(stalled.is_err(), "no frame yet");
        assert!(
            reader.buf_capacity <= 2 * MIN_READ_BUFFER,
            "{} bytes of buffer for 104 bytes received",
            reader.buf_capacity
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
