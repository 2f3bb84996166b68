//! CRC-32C of a Produce request's record batches, computed while the request arrives.
//!
//! The broker checks every produced batch's CRC-32C before it answers, as Kafka does. Checked
//! once the whole frame is in, the checksum sits between the request's last byte and its
//! answer, over a megabyte that has left the core's cache since the socket read wrote it.
//! [`BatchCrcs`] follows a Produce frame's layout as its bytes arrive and runs the checksum
//! over each piece right after the read that brought it, while the piece is still in the
//! core's cache and the client is still sending the rest.
//!
//! The handler's check ([`crate::storage::batch::validate_batch`]) then takes the value from
//! [`known`] instead of reading the batch again. It still compares it with the CRC the batch
//! carries, so a damaged batch is refused as before. A batch this did not follow (a layout it
//! does not expect, a version it does not know) is checksummed there, as before.

use std::future::Future;

use bytes::Bytes;

/// Produce versions whose layout [`BatchCrcs`] follows (the broker serves 3..=9).
const VERSIONS: std::ops::RangeInclusive<i16> = 3..=9;

/// First flexible Produce version (compact strings and arrays, tagged fields).
const FIRST_FLEXIBLE: i16 = 9;

/// Batches followed per frame at most; a frame of more (tiny) batches has the rest checked by
/// the handler, so what the tracker keeps stays small.
const MAX_BATCHES: usize = 4096;

/// Bytes of a batch before its attributes field, where the CRC-32C starts.
const CRC_START: usize = 21;

/// Bytes of a batch header (v2); a batch is at least this long.
const BATCH_HEADER: usize = 61;

/// A batch of the request being handled, as a slice of its frame, with the CRC-32C of its
/// bytes from the attributes field to its end.
#[derive(Debug, Clone)]
pub struct CheckedBatch {
    bytes: Bytes,
    crc: u32,
}

tokio::task_local! {
    static CHECKED: Vec<CheckedBatch>;
}

/// Runs `handler` (the handling of one request) with the CRCs computed while its frame
/// arrived, for [`known`].
pub async fn scope<F: Future>(checked: Vec<CheckedBatch>, handler: F) -> F::Output {
    CHECKED.scope(checked, handler).await
}

/// The CRC-32C computed on arrival for `batch` (over `batch[21..]`), if `batch` is exactly one
/// of the batches followed in the frame of the request being handled.
///
/// A match is by address and length. Each [`CheckedBatch`] holds its bytes (a shared,
/// immutable [`Bytes`]), so while the request is handled no other bytes can live at that
/// address: an equal address and length are the same bytes the CRC was computed over.
pub fn known(batch: &[u8]) -> Option<u32> {
    CHECKED
        .try_with(|checked| {
            checked
                .iter()
                .find(|c| c.bytes.as_ptr() == batch.as_ptr() && c.bytes.len() == batch.len())
                .map(|c| c.crc)
        })
        .ok()
        .flatten()
        .inspect(|_| {
            metrics::counter!("onceflow_broker_produce_batches_checksummed_on_arrival_total")
                .increment(1)
        })
}

/// Follows one frame's bytes as they arrive (the frame without its size prefix) and checksums
/// the record batches of a Produce request.
#[derive(Debug)]
pub struct BatchCrcs {
    /// Where the frame's structure is being read.
    step: Step,
    /// The next byte of the frame's structure to read.
    pos: usize,
    flexible: bool,
    /// The batch being checksummed.
    running: Option<Running>,
    /// Batches checksummed: start in the frame, length, CRC-32C.
    done: Vec<(usize, usize, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The request header and the body up to the topics array.
    Prefix,
    /// At a topic, `topics` of them left (this one included).
    Topic { topics: u32 },
    /// At a partition of the current topic, `partitions` of them left.
    Partition { topics: u32, partitions: u32 },
    /// Inside a partition's records field, which ends at `end`.
    Batches {
        topics: u32,
        partitions: u32,
        end: usize,
    },
    /// Nothing more to follow: the frame is read to its end, or is not a Produce request
    /// this follows, or its layout was not what a Produce request's is.
    Stopped,
}

#[derive(Debug)]
struct Running {
    start: usize,
    end: usize,
    next: usize,
    digest: crc_fast::Digest,
}

impl Default for BatchCrcs {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchCrcs {
    /// A tracker for a new frame.
    pub fn new() -> Self {
        BatchCrcs {
            step: Step::Prefix,
            pos: 0,
            flexible: false,
            running: None,
            done: Vec::new(),
        }
    }

    /// Reads what arrived: `frame` is the frame's bytes received so far, from its first byte
    /// (the api key); each call passes at least the bytes of the call before.
    pub fn feed(&mut self, frame: &[u8]) {
        loop {
            if let Some(run) = &mut self.running {
                let upto = run.end.min(frame.len());
                if upto > run.next {
                    run.digest.update(&frame[run.next..upto]);
                    run.next = upto;
                }
                if run.next < run.end {
                    return;
                }
                let crc = run.digest.finalize() as u32;
                self.done.push((run.start, run.end - run.start, crc));
                self.running = None;
            }
            if self.step == Step::Stopped {
                return;
            }
            let mut cur = Cursor {
                buf: frame,
                pos: self.pos,
            };
            match self.next_step(&mut cur) {
                Ok(step) => {
                    self.pos = cur.pos;
                    self.step = step;
                }
                Err(Stop::More) => return,
                Err(Stop::Off) => {
                    self.step = Step::Stopped;
                    return;
                }
            }
        }
    }

    /// The batches checksummed, as slices of the whole `frame` these bytes were part of.
    pub fn finish(self, frame: &Bytes) -> Vec<CheckedBatch> {
        self.done
            .into_iter()
            .filter(|&(start, len, _)| start + len <= frame.len())
            .map(|(start, len, crc)| CheckedBatch {
                bytes: frame.slice(start..start + len),
                crc,
            })
            .collect()
    }

    /// Reads the structure after `cur.pos` up to the next step; a batch found starts
    /// [`Self::running`].
    fn next_step(&mut self, cur: &mut Cursor<'_>) -> Result<Step, Stop> {
        let flexible = self.flexible;
        match self.step {
            Step::Prefix => {
                let api_key = cur.i16()?;
                let version = cur.i16()?;
                if api_key != 0 || !VERSIONS.contains(&version) {
                    return Err(Stop::Off);
                }
                self.flexible = version >= FIRST_FLEXIBLE;
                cur.take(4)?; // correlation id
                              // The header's client id is a nullable string in every header version.
                let client_id = cur.i16()?;
                if client_id > 0 {
                    cur.take(client_id as usize)?;
                }
                if self.flexible {
                    cur.tagged_fields()?;
                }
                cur.string(self.flexible)?; // transactional id
                cur.take(2 + 4)?; // acks, timeout
                let topics = cur.array(self.flexible)?;
                Ok(Step::Topic { topics })
            }
            Step::Topic { topics: 0 } => Ok(Step::Stopped),
            Step::Topic { topics } => {
                cur.string(flexible)?; // name
                let partitions = cur.array(flexible)?;
                Ok(Step::Partition { topics, partitions })
            }
            Step::Partition {
                topics,
                partitions: 0,
            } => {
                if flexible {
                    cur.tagged_fields()?; // the topic's
                }
                Ok(Step::Topic { topics: topics - 1 })
            }
            Step::Partition { topics, partitions } => {
                cur.take(4)?; // index
                match cur.bytes_len(flexible)? {
                    Some(len) => Ok(Step::Batches {
                        topics,
                        partitions,
                        end: cur.pos.checked_add(len).ok_or(Stop::Off)?,
                    }),
                    None => {
                        if flexible {
                            cur.tagged_fields()?; // the partition's
                        }
                        Ok(Step::Partition {
                            topics,
                            partitions: partitions - 1,
                        })
                    }
                }
            }
            Step::Batches {
                topics,
                partitions,
                end,
            } if cur.pos == end => {
                if flexible {
                    cur.tagged_fields()?; // the partition's
                }
                Ok(Step::Partition {
                    topics,
                    partitions: partitions - 1,
                })
            }
            Step::Batches { end, .. } => {
                let start = cur.pos;
                let header = cur.take(CRC_START)?;
                let length = i32::from_be_bytes([header[8], header[9], header[10], header[11]]);
                let magic = header[16];
                let size = usize::try_from(length).map_err(|_| Stop::Off)? + 12;
                // Anything unexpected is left to the handler's check, which reports it.
                if magic != 2
                    || size < BATCH_HEADER
                    || start + size > end
                    || self.done.len() >= MAX_BATCHES
                {
                    return Err(Stop::Off);
                }
                self.running = Some(Running {
                    start,
                    end: start + size,
                    next: cur.pos,
                    digest: crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi),
                });
                cur.pos = start + size;
                Ok(self.step)
            }
            Step::Stopped => Err(Stop::Off),
        }
    }
}

/// Why the structure cannot be read on.
#[derive(Debug)]
enum Stop {
    /// Its next field has not arrived yet.
    More,
    /// It is not what a Produce request's is.
    Off,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::Off)?;
        let out = self.buf.get(self.pos..end).ok_or(Stop::More)?;
        self.pos = end;
        Ok(out)
    }

    fn i16(&mut self) -> Result<i16, Stop> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, Stop> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn uvarint(&mut self) -> Result<u32, Stop> {
        let mut value = 0u32;
        for i in 0..5 {
            let b = self.take(1)?[0];
            value |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Stop::Off)
    }

    /// Skips a (nullable) string.
    fn string(&mut self, flexible: bool) -> Result<(), Stop> {
        let len = if flexible {
            (self.uvarint()? as usize).saturating_sub(1)
        } else {
            self.i16()?.max(0) as usize
        };
        self.take(len).map(|_| ())
    }

    /// An array's length (a null array counts as empty).
    fn array(&mut self, flexible: bool) -> Result<u32, Stop> {
        if flexible {
            Ok(self.uvarint()?.saturating_sub(1))
        } else {
            Ok(self.i32()?.max(0) as u32)
        }
    }

    /// A nullable bytes field's length; `None` for null.
    fn bytes_len(&mut self, flexible: bool) -> Result<Option<usize>, Stop> {
        if flexible {
            Ok(self.uvarint()?.checked_sub(1).map(|n| n as usize))
        } else {
            Ok(usize::try_from(self.i32()?).ok())
        }
    }

    fn tagged_fields(&mut self) -> Result<(), Stop> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?; // tag
            let size = self.uvarint()? as usize;
            self.take(size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::batch::{encode_batch, validate_batch, BatchSpec, RecordSpec};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, RequestHeader, TopicName, TransactionalId};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn batch(records: usize, value: usize, seed: u8) -> Bytes {
        let values: Vec<Vec<u8>> = (0..records)
            .map(|i| vec![seed.wrapping_add(i as u8); value])
            .collect();
        let records: Vec<RecordSpec<'_>> = values
            .iter()
            .map(|v| RecordSpec {
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(v),
                headers: Vec::new(),
            })
            .collect();
        encode_batch(BatchSpec::default(), &records).freeze()
    }

    /// A Produce frame (no size prefix) of `topics`, each a list of partitions' records.
    fn produce_frame(version: i16, topics: &[Vec<Option<Bytes>>]) -> Bytes {
        let header = RequestHeader::default()
            .with_request_api_key(0)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("early-crc-test")));
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(1000)
            .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("txn"))))
            .with_topic_data(
                topics
                    .iter()
                    .enumerate()
                    .map(|(t, partitions)| {
                        TopicProduceData::default()
                            .with_name(TopicName(StrBytes::from(format!("topic-{t}"))))
                            .with_partition_data(
                                partitions
                                    .iter()
                                    .enumerate()
                                    .map(|(p, records)| {
                                        PartitionProduceData::default()
                                            .with_index(p as i32)
                                            .with_records(records.clone())
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        let header_version = if version >= FIRST_FLEXIBLE { 2 } else { 1 };
        let mut out = bytes::BytesMut::new();
        header.encode(&mut out, header_version).unwrap();
        request.encode(&mut out, version).unwrap();
        out.freeze()
    }

    /// What the tracker found, fed `frame` in pieces of `piece` bytes.
    fn follow(frame: &Bytes, piece: usize) -> Vec<CheckedBatch> {
        let mut crcs = BatchCrcs::new();
        let mut have = 0;
        while have < frame.len() {
            have = (have + piece).min(frame.len());
            crcs.feed(&frame[..have]);
        }
        crcs.finish(frame)
    }

    #[test]
    fn every_batch_of_every_partition_is_checksummed_whatever_the_pieces() {
        let topics = vec![
            vec![
                Some(batch(3, 100, 1)),
                None,
                Some([batch(2, 1000, 2), batch(1, 10, 3)].concat().into()),
            ],
            vec![Some(batch(40, 1024, 4))],
        ];
        for version in VERSIONS {
            let frame = produce_frame(version, &topics);
            let expected: Vec<(Vec<u8>, u32)> = [
                batch(3, 100, 1),
                batch(2, 1000, 2),
                batch(1, 10, 3),
                batch(40, 1024, 4),
            ]
            .iter()
            .map(|b| (b.to_vec(), crate::crc32c(&b[CRC_START..])))
            .collect();
            for piece in [1, 7, 64, 1000, 4096, frame.len()] {
                let found = follow(&frame, piece);
                let found: Vec<(Vec<u8>, u32)> =
                    found.iter().map(|c| (c.bytes.to_vec(), c.crc)).collect();
                assert_eq!(found, expected, "version {version}, pieces of {piece}");
            }
        }
    }

    #[test]
    fn other_requests_and_unexpected_layouts_are_left_to_the_handler() {
        // Not a Produce request (Fetch, api key 1).
        let mut fetch = produce_frame(7, &[vec![Some(batch(1, 10, 1))]]).to_vec();
        fetch[1] = 1;
        assert!(follow(&Bytes::from(fetch), 3).is_empty());
        // A version the broker does not serve.
        let mut old = produce_frame(7, &[vec![Some(batch(1, 10, 1))]]).to_vec();
        old[3] = 2;
        assert!(follow(&Bytes::from(old), 3).is_empty());
        // A records field whose batch claims more bytes than the field holds: nothing is
        // checksummed, the handler reports the damage.
        let b = batch(2, 50, 1);
        let mut frame = produce_frame(7, &[vec![Some(b.clone())]]).to_vec();
        let at = frame.len() - b.len();
        frame[at + 8..at + 12].copy_from_slice(&(b.len() as i32).to_be_bytes());
        assert!(follow(&Bytes::from(frame), 5).is_empty());
        // Legacy message sets (magic 1).
        let mut frame = produce_frame(7, &[vec![Some(b.clone())]]).to_vec();
        let at = frame.len() - b.len();
        frame[at + 16] = 1;
        assert!(follow(&Bytes::from(frame), 5).is_empty());
        // A frame cut short never reports a batch it has not seen whole.
        let frame = produce_frame(7, &[vec![Some(b.clone())]]);
        let mut crcs = BatchCrcs::new();
        crcs.feed(&frame[..frame.len() - 1]);
        assert!(crcs.finish(&frame.slice(..frame.len() - 1)).is_empty());
    }

    #[tokio::test]
    async fn the_frame_reader_checksums_a_produce_frame_as_it_arrives_in_pieces() {
        use tokio::io::AsyncWriteExt;
        let b = batch(300, 1024, 5);
        let produce = produce_frame(7, &[vec![Some(b.clone())]]);
        let other = {
            let mut f = produce_frame(7, &[vec![Some(batch(1, 10, 1))]]).to_vec();
            f[1] = 3; // Metadata, say: not followed
            Bytes::from(f)
        };
        // A pipe smaller than the frame: the reader gets it in many pieces.
        let (mut tx, rx) = tokio::io::duplex(997);
        let writer = tokio::spawn(async move {
            for f in [&produce, &other, &produce] {
                tx.write_all(&(f.len() as i32).to_be_bytes()).await.unwrap();
                tx.write_all(f).await.unwrap();
            }
        });
        let mut reader = crate::codec::FrameReader::new(rx, 1 << 24);
        let expected = crate::crc32c(&b[CRC_START..]);
        for kind in ["produce", "other", "produce"] {
            let frame = reader.next_frame().await.unwrap().unwrap();
            let checked = reader.take_checked();
            if kind == "produce" {
                assert_eq!(checked.len(), 1);
                assert_eq!(checked[0].crc, expected);
                assert_eq!(&checked[0].bytes[..], &b[..]);
                let at = checked[0].bytes.as_ptr() as usize - frame.as_ptr() as usize;
                assert!(at + b.len() <= frame.len(), "a slice of the frame returned");
            } else {
                assert!(checked.is_empty(), "nothing carried over to the next frame");
            }
        }
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn the_handler_uses_the_crc_of_exactly_the_batch_followed() {
        let b = batch(5, 200, 9);
        let frame = produce_frame(9, &[vec![Some(b.clone())]]);
        let checked = follow(&frame, 100);
        assert_eq!(checked.len(), 1);
        let at = frame
            .windows(b.len())
            .position(|w| w == &b[..])
            .expect("the batch is in the frame");
        let in_frame = frame.slice(at..at + b.len());
        assert_eq!(&in_frame[..], &b[..]);
        scope(checked.clone(), async {
            assert_eq!(known(&in_frame), Some(crate::crc32c(&b[CRC_START..])));
            assert!(validate_batch(&in_frame).is_ok());
            // Equal bytes elsewhere, or a part of the batch, are not the batch followed.
            assert_eq!(known(&b), None);
            assert_eq!(known(&in_frame[..in_frame.len() - 1]), None);
        })
        .await;
        assert_eq!(known(&in_frame), None, "outside the request's handling");

        // A batch damaged in flight is refused: the CRC computed on arrival is compared
        // with the one the batch carries, as the handler's own would be.
        let mut damaged = frame.to_vec();
        damaged[at + BATCH_HEADER + 3] ^= 0x40;
        let damaged = Bytes::from(damaged);
        let checked = follow(&damaged, 33);
        assert_eq!(checked.len(), 1);
        scope(checked, async {
            let batch = &damaged[at..at + b.len()];
            assert!(known(batch).is_some());
            let error = validate_batch(batch).unwrap_err();
            assert!(error.to_string().contains("CRC-32C mismatch"), "{error}");
        })
        .await;
    }
}
