//! ListOffsets (v1..=7): earliest (-2), latest (-1; for read_committed the partition's last
//! stable offset), max timestamp (-3), or the first record at or after a timestamp (record
//! exact, as Kafka: the storage finds the batch, [`crate::record_timestamps`] the record).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use super::RequestContext;
use crate::decompress::DecompressError;
use crate::metrics;
use crate::record_timestamps::RecordScanError;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::batch::parse_header;
use crate::storage::Partition;

/// Special timestamp: the log start offset.
pub const EARLIEST: i64 = -2;
/// Special timestamp: the high watermark (or last stable offset).
pub const LATEST: i64 = -1;
/// Special timestamp (v7+): the offset of the record with the largest timestamp.
pub const MAX_TIMESTAMP: i64 = -3;

/// Answers ListOffsets.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
    // isolation_level exists from v2; 1 = read_committed: "latest" is the last stable offset.
    let read_committed = ctx.version >= 2 && req.isolation_level == 1;
    let topics = req
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.as_str();
            let denied = !ctx.authorized(state, AclOperation::Describe, ResourceType::Topic, name);
            let partitions = topic
                .partitions
                .into_iter()
                .map(|p| {
                    let base = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    if denied {
                        let code = ResponseError::TopicAuthorizationFailed.code();
                        metrics::partition_error("ListOffsets", code);
                        return base
                            .with_error_code(code)
                            .with_timestamp(-1)
                            .with_offset(-1);
                    }
                    let Some(partition) = state.partition(name, p.partition_index) else {
                        metrics::partition_error(
                            "ListOffsets",
                            ResponseError::UnknownTopicOrPartition.code(),
                        );
                        return base
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_timestamp(-1)
                            .with_offset(-1);
                    };
                    let (offset, timestamp) = match lookup(&partition, p.timestamp, read_committed)
                    {
                        Ok(found) => found,
                        Err(e) => {
                            metrics::partition_error("ListOffsets", e.code());
                            return base
                                .with_error_code(e.code())
                                .with_timestamp(-1)
                                .with_offset(-1);
                        }
                    };
                    let base = base.with_offset(offset).with_timestamp(timestamp);
                    // The leader epoch field exists from v4 on; encoding refuses it before.
                    if ctx.version >= 4 {
                        base.with_leader_epoch(0)
                    } else {
                        base
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// (offset, timestamp) for a ListOffsets timestamp; (-1, -1) when no record qualifies. A
/// batch that inflates past the topic's decompression cap is an error for the partition.
fn lookup(
    partition: &Partition,
    timestamp: i64,
    read_committed: bool,
) -> Result<(i64, i64), ResponseError> {
    Ok(match timestamp {
        EARLIEST => (partition.log_start_offset(), -1),
        LATEST if read_committed => (partition.last_stable_offset(), -1),
        LATEST => (partition.high_watermark(), -1),
        MAX_TIMESTAMP => max_timestamp(partition).unwrap_or((-1, -1)),
        ts if ts >= 0 => {
            // Kafka only answers offsets below the last fetchable offset.
            let fetchable = if read_committed {
                partition.last_stable_offset()
            } else {
                partition.high_watermark()
            };
            offset_for_timestamp(partition, ts)?
                .filter(|&(offset, _)| offset < fetchable)
                // A record below the log start (DeleteRecords inside a batch) answers the start.
                .map(|(offset, t)| (offset.max(partition.log_start_offset()), t))
                .unwrap_or((-1, -1))
        }
        _ => (-1, -1),
    })
}

/// The first record with timestamp >= `ts`: its offset and timestamp. The storage finds the
/// first batch whose max timestamp is >= `ts`; its records are decoded to pick the record. A
/// batch whose records all fall short (an inconsistent max timestamp) is skipped, as Kafka does;
/// a batch that cannot be decoded answers at batch precision (logged); a batch that inflates
/// past the decompression cap ([`crate::decompress::cap_for`]) is UNKNOWN_SERVER_ERROR (logged),
/// never an allocation of that size.
fn offset_for_timestamp(
    partition: &Partition,
    ts: i64,
) -> Result<Option<(i64, i64)>, ResponseError> {
    let Some((mut next, _)) = partition.offset_for_timestamp(ts) else {
        return Ok(None);
    };
    let cap = crate::decompress::cap_for(partition.log_config().max_message_bytes);
    loop {
        // max_bytes 0: exactly the one (whole) batch containing `next`.
        let bytes = match partition.read(next, 0) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(offset = next, error = %e, "timestamp lookup read failed");
                return Ok(None);
            }
        };
        let Ok(header) = parse_header(&bytes) else {
            return Ok(None);
        };
        let Some(batch) = bytes.get(..header.size) else {
            return Ok(None);
        };
        if header.max_timestamp >= ts {
            match crate::record_timestamps::first_record_at_or_after(batch, ts, cap) {
                Ok(Some(hit)) => return Ok(Some(hit)),
                Ok(None) => {}
                Err(RecordScanError::Decompress(e @ DecompressError::TooLarge { .. })) => {
                    tracing::warn!(topic = partition.topic(), partition = partition.index(),
                        offset = header.base_offset, error = %e,
                        "ListOffsets by timestamp refused: batch inflates past the cap");
                    return Err(ResponseError::UnknownServerError);
                }
                Err(e) => {
                    tracing::warn!(offset = header.base_offset, error = %e,
                        "cannot decode batch records; answering at batch precision");
                    return Ok(Some((header.base_offset, header.max_timestamp)));
                }
            }
        }
        let after = header.last_offset().saturating_add(1);
        if after <= next {
            return Ok(None);
        }
        next = after;
    }
}

/// Scans batch headers for the largest max timestamp; returns that batch's last offset
/// (batch-level precision) and the timestamp.
fn max_timestamp(partition: &Partition) -> Option<(i64, i64)> {
    const CHUNK: usize = 1 << 20;
    let end = partition.high_watermark();
    let mut offset = partition.log_start_offset();
    let mut best: Option<(i64, i64)> = None;
    while offset < end {
        let bytes = partition.read(offset, CHUNK).ok()?;
        if bytes.is_empty() {
            break;
        }
        let started_at = offset;
        let mut rest = &bytes[..];
        while let Ok(header) = parse_header(rest) {
            if header.max_timestamp > best.map_or(i64::MIN, |b| b.1) {
                best = Some((header.last_offset(), header.max_timestamp));
            }
            offset = offset.max(header.last_offset().saturating_add(1));
            rest = rest.get(header.size..)?;
        }
        // No progress (unparsable bytes or offsets that do not advance): stop, never spin.
        if rest.len() == bytes.len() || offset <= started_at {
            break;
        }
    }
    best
}
