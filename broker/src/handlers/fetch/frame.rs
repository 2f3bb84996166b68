//! Fetch responses as frames whose record bytes are the stored bytes themselves.
//!
//! kafka-protocol's encoder copies every partition's records into one response buffer; for a
//! consumer reading megabytes per request that copy (into freshly allocated memory) is most of
//! the broker's work. Here the structure around the records (response header, topics,
//! partition fields) is encoded into small buffers and each partition's records travel as
//! their own piece of the [`ResponseFrame`], shared with the log, so the bytes go from the
//! store to the socket without an intermediate copy. The partition fields are encoded by
//! kafka-protocol itself (with null records, then the real records length is put in place of
//! the null marker); only the top and topic levels are written here. The pieces concatenated
//! are byte for byte what kafka-protocol encodes (tested for every version served).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;

use crate::codec::{self, CodecError, ResponseFrame};

/// Records shorter than this are copied into the frame (a separate piece costs more).
const SHARED_RECORDS_MIN: usize = 8 * 1024;

/// Fetch versions whose layout this module writes; others go through kafka-protocol whole.
const VERSIONS: std::ops::RangeInclusive<i16> = 4..=12;

/// Encodes `response` (with its size prefix and header) for `version`.
pub fn encode(
    version: i16,
    correlation_id: i32,
    response: &FetchResponse,
) -> Result<ResponseFrame, CodecError> {
    if !VERSIONS.contains(&version) || !plain(response) {
        return codec::encode_response(ApiKey::Fetch, version, correlation_id, response)
            .map(ResponseFrame::from);
    }
    let encode_err = |reason: String| CodecError::Encode {
        what: format!("Fetch v{version}"),
        reason,
    };
    let flexible = version >= 12;
    let mut out = Pieces::default();
    out.head.put_i32(0); // size, filled in at the end
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(
            &mut out.head,
            ApiKey::Fetch.response_header_version(version),
        )
        .map_err(|e| encode_err(e.to_string()))?;
    out.head.put_i32(response.throttle_time_ms);
    if version >= 7 {
        out.head.put_i16(response.error_code);
        out.head.put_i32(response.session_id);
    } else if response.error_code != 0 || response.session_id != 0 {
        return Err(encode_err("error code or session id below v7".into()));
    }
    put_len(&mut out.head, flexible, response.responses.len());
    for topic in &response.responses {
        let name = topic.topic.0.as_bytes();
        if flexible {
            put_uvarint(&mut out.head, name.len() as u64 + 1);
        } else {
            let len = i16::try_from(name.len()).map_err(|_| encode_err("topic name".into()))?;
            out.head.put_i16(len);
        }
        out.head.put_slice(name);
        put_len(&mut out.head, flexible, topic.partitions.len());
        for partition in &topic.partitions {
            put_partition(&mut out, version, partition).map_err(encode_err)?;
        }
        if flexible {
            put_uvarint(&mut out.head, 0); // tagged fields
        }
    }
    if flexible {
        put_uvarint(&mut out.head, 0);
    }
    Ok(out.finish())
}

/// Whether the response uses only fields this module writes (no tagged fields, no
/// diverging epoch, leader or snapshot hints, no node endpoints).
fn plain(response: &FetchResponse) -> bool {
    let partition_plain = |p: &PartitionData| {
        let defaults = PartitionData::default();
        p.unknown_tagged_fields.is_empty()
            && p.diverging_epoch == defaults.diverging_epoch
            && p.current_leader == defaults.current_leader
            && p.snapshot_id == defaults.snapshot_id
            && p.aborted_transactions
                .iter()
                .flatten()
                .all(|a| a.unknown_tagged_fields.is_empty())
    };
    let topic_plain = |t: &FetchableTopicResponse| {
        t.unknown_tagged_fields.is_empty()
            && t.topic_id.is_nil()
            && t.partitions.iter().all(partition_plain)
    };
    response.unknown_tagged_fields.is_empty()
        && response.node_endpoints.is_empty()
        && response.responses.iter().all(topic_plain)
}

/// One partition: its fields encoded by kafka-protocol with null records, then the records.
fn put_partition(out: &mut Pieces, version: i16, p: &PartitionData) -> Result<(), String> {
    let flexible = version >= 12;
    let fields = p.clone().with_records(None);
    let start = out.head.len();
    fields
        .encode(&mut out.head, version)
        .map_err(|e| e.to_string())?;
    // Null records are the last field: i32 -1, or (flexible) varint 0 and then an empty
    // tagged-field section (varint 0), which `plain` guarantees.
    let marker: &[u8] = if flexible { &[0, 0] } else { &[0xff; 4] };
    if out.head.len() < start + marker.len() || !out.head.ends_with(marker) {
        return Err("unexpected partition encoding".into());
    }
    out.head.truncate(out.head.len() - marker.len());
    match &p.records {
        None if flexible => put_uvarint(&mut out.head, 0),
        None => out.head.put_i32(-1),
        Some(records) => {
            if flexible {
                put_uvarint(&mut out.head, records.len() as u64 + 1);
            } else {
                let len = i32::try_from(records.len()).map_err(|_| "records too large")?;
                out.head.put_i32(len);
            }
            out.push_records(records);
        }
    }
    if flexible {
        put_uvarint(&mut out.head, 0); // tagged fields
    }
    Ok(())
}

fn put_len(buf: &mut BytesMut, flexible: bool, len: usize) {
    if flexible {
        put_uvarint(buf, len as u64 + 1);
    } else {
        buf.put_i32(len as i32);
    }
}

fn put_uvarint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// The frame being built: finished pieces plus the structure bytes being written.
#[derive(Default)]
struct Pieces {
    /// Finished pieces; the first one starts with the size prefix.
    done: Vec<BytesMut>,
    shared: Vec<(usize, Bytes)>,
    head: BytesMut,
}

impl Pieces {
    /// Adds record bytes: small ones are copied, larger ones become their own piece.
    fn push_records(&mut self, records: &Bytes) {
        if records.len() < SHARED_RECORDS_MIN {
            self.head.put_slice(records);
        } else {
            self.done.push(self.head.split());
            self.shared.push((self.done.len(), records.clone()));
        }
    }

    /// The frame, with its size prefix filled in.
    fn finish(mut self) -> ResponseFrame {
        self.done.push(self.head.split());
        let total: usize = self.done.iter().map(BytesMut::len).sum::<usize>()
            + self.shared.iter().map(|(_, b)| b.len()).sum::<usize>();
        let size = (total - 4) as i32;
        self.done[0][..4].copy_from_slice(&size.to_be_bytes());
        let mut shared = self.shared.into_iter().peekable();
        let mut parts = Vec::new();
        for (i, piece) in self.done.into_iter().enumerate() {
            while let Some((_, records)) = shared.next_if(|(at, _)| *at == i) {
                parts.push(records);
            }
            if !piece.is_empty() {
                parts.push(piece.freeze());
            }
        }
        ResponseFrame::from_parts(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::AbortedTransaction;
    use kafka_protocol::messages::{BrokerId, ProducerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    fn sample(version: i16) -> FetchResponse {
        let records = |n: usize, fill: u8| Some(Bytes::from(vec![fill; n]));
        let partition = |index: i32, records: Option<Bytes>| {
            PartitionData::default()
                .with_partition_index(index)
                .with_high_watermark(1000 + i64::from(index))
                .with_last_stable_offset(900)
                .with_log_start_offset(if version >= 5 { 3 } else { -1 })
                .with_preferred_read_replica(BrokerId(-1))
                .with_aborted_transactions(Some(vec![AbortedTransaction::default()
                    .with_producer_id(ProducerId(7))
                    .with_first_offset(12)]))
                .with_records(records)
        };
        let mut response = FetchResponse::default().with_responses(vec![
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![
                    partition(0, records(20_000, 1)),
                    partition(1, records(100, 2)),
                    partition(2, None),
                    partition(3, Some(Bytes::new())).with_error_code(1),
                    partition(4, records(300_000, 3)).with_aborted_transactions(None),
                ]),
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![partition(0, records(9_000, 4))]),
        ]);
        if version >= 7 {
            response = response.with_session_id(0).with_error_code(0);
        }
        response.with_throttle_time_ms(5)
    }

    #[test]
    fn pieces_concatenate_to_the_kafka_protocol_encoding() {
        for version in 4..=12 {
            let response = sample(version);
            let expected =
                codec::encode_response(ApiKey::Fetch, version, 42, &response).expect("encodes");
            let frame = encode(version, 42, &response).expect("encodes");
            assert_eq!(frame.len(), expected.len(), "v{version}");
            assert_eq!(frame.to_bytes(), expected, "v{version}");
            // The large record sets are shared with the response, not copied.
            let shared = frame
                .parts()
                .iter()
                .filter(|p| p.len() >= SHARED_RECORDS_MIN)
                .count();
            assert_eq!(shared, 3, "v{version}");
        }
    }

    #[test]
    fn responses_with_other_fields_fall_back_to_one_piece() {
        let mut response = sample(12);
        response.responses[0].partitions[0].diverging_epoch.epoch = 3;
        let expected = codec::encode_response(ApiKey::Fetch, 12, 1, &response).unwrap();
        let frame = encode(12, 1, &response).unwrap();
        assert_eq!(frame.parts().len(), 1);
        assert_eq!(frame.to_bytes(), expected);
    }
}
