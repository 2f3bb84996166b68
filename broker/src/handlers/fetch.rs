//! Fetch (v4..=12, sessionless): long poll until `min_bytes` are available or `max_wait_ms`
//! passes, woken by appends; whole stored batches within the partition and response byte
//! limits (the response limit capped at the broker's `fetch.max.bytes`; the first batch always
//! whole, KIP-74); empty partitions carry empty record bytes;
//! read_committed fetches stop at the last stable offset and list aborted transactions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId};
use tokio::time::Instant;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};

mod frame;
use crate::state::BrokerState;
use crate::storage::ReadError;
pub use frame::encode as encode_response;

/// Fetch `isolation_level` of read_committed consumers.
pub const READ_COMMITTED: i8 = 1;

/// Longest long poll honoured, whatever the client asks.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Answers Fetch.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: FetchRequest,
) -> FetchResponse {
    // This broker never creates fetch sessions (it answers session id 0), so a client can only
    // name one by mistake.
    if ctx.version >= 7 && req.session_id != 0 {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code());
    }
    if ctx.version >= 7 && !matches!(req.session_epoch, 0 | -1) {
        return FetchResponse::default()
            .with_error_code(ResponseError::InvalidFetchSessionEpoch.code());
    }
    let wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0)).min(MAX_WAIT);
    let deadline = Instant::now() + wait;
    // As Kafka: the client's limits are capped at the broker's `fetch.max.bytes`.
    let min_bytes = usize::try_from(req.min_bytes)
        .unwrap_or(0)
        .min(state.config.fetch_max_bytes);
    let mut shutdown = state.shutdown.clone();
    // Read on each topic, checked once per request (not per long-poll pass).
    let denied: Vec<bool> = req
        .topics
        .iter()
        .map(|t| !ctx.authorized(state, AclOperation::Read, ResourceType::Topic, &t.topic))
        .collect();
    loop {
        // Register for wakeups before reading, so an append in between is not missed.
        let appended = state.appended.notified();
        tokio::pin!(appended);
        appended.as_mut().enable();
        let (response, bytes, errors) = read_once(state, &req, &denied);
        if bytes >= min_bytes || errors || Instant::now() >= deadline || *shutdown.borrow() {
            return response;
        }
        tokio::select! {
            _ = appended => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = crate::state::shutdown_signalled(&mut shutdown) => {}
        }
    }
}

/// One pass over the requested partitions: the response, the record bytes in it, and
/// whether any partition carries an error (which ends the long poll).
fn read_once(
    state: &BrokerState,
    req: &FetchRequest,
    denied: &[bool],
) -> (FetchResponse, usize, bool) {
    let mut remaining = usize::try_from(req.max_bytes)
        .unwrap_or(0)
        .min(state.config.fetch_max_bytes);
    let mut total = 0usize;
    let mut errors = false;
    let mut topics = Vec::with_capacity(req.topics.len());
    for (topic_no, topic) in req.topics.iter().enumerate() {
        let name = topic.topic.0.as_str();
        let topic_denied = denied.get(topic_no).copied().unwrap_or(false);
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let mut data = PartitionData::default()
                .with_partition_index(p.partition)
                .with_preferred_read_replica(BrokerId(-1))
                .with_aborted_transactions(Some(Vec::new()))
                .with_records(Some(Bytes::new()));
            let partition = if topic_denied {
                None
            } else {
                state.partition(name, p.partition)
            };
            let Some(partition) = partition else {
                errors = true;
                let error = if topic_denied {
                    ResponseError::TopicAuthorizationFailed
                } else {
                    ResponseError::UnknownTopicOrPartition
                };
                metrics::partition_error("Fetch", error.code());
                partitions.push(
                    data.with_error_code(error.code())
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1),
                );
                continue;
            };
            let high_watermark = partition.high_watermark();
            data = data
                .with_high_watermark(high_watermark)
                .with_last_stable_offset(partition.last_stable_offset())
                .with_log_start_offset(partition.log_start_offset());
            let limit = usize::try_from(p.partition_max_bytes)
                .unwrap_or(0)
                .min(remaining);
            // Once something is returned, a partition with no budget left gets nothing; the
            // first non-empty partition always gets at least one whole batch (KIP-74).
            if limit == 0 && total > 0 {
                partitions.push(data);
                continue;
            }
            let read = if req.isolation_level == READ_COMMITTED {
                // Only batches below the last stable offset, with the aborted transactions
                // the client must filter out.
                partition.read_committed(p.fetch_offset, limit).map(|r| {
                    let aborted = r
                        .aborted
                        .iter()
                        .map(|a| {
                            AbortedTransaction::default()
                                .with_producer_id(ProducerId(a.producer_id))
                                .with_first_offset(a.first_offset)
                        })
                        .collect();
                    (
                        r.records,
                        Some(aborted),
                        Some((r.high_watermark, r.last_stable_offset)),
                    )
                })
            } else {
                partition
                    .read(p.fetch_offset, limit)
                    .map(|r| (r, None, None))
            };
            match read {
                Ok((records, aborted, offsets)) => {
                    total += records.len();
                    remaining = remaining.saturating_sub(records.len());
                    if let Some(aborted) = aborted {
                        data = data.with_aborted_transactions(Some(aborted));
                    }
                    if let Some((high_watermark, last_stable_offset)) = offsets {
                        data = data
                            .with_high_watermark(high_watermark)
                            .with_last_stable_offset(last_stable_offset);
                    }
                    partitions.push(data.with_records(Some(records)));
                }
                Err(ReadError::OffsetOutOfRange {
                    log_start,
                    high_watermark,
                }) => {
                    errors = true;
                    tracing::debug!(
                        topic = name,
                        partition = p.partition,
                        offset = p.fetch_offset,
                        log_start,
                        high_watermark,
                        "fetch offset out of range"
                    );
                    metrics::partition_error("Fetch", ResponseError::OffsetOutOfRange.code());
                    partitions.push(data.with_error_code(ResponseError::OffsetOutOfRange.code()));
                }
                Err(e @ ReadError::Corrupt { .. }) => {
                    errors = true;
                    tracing::error!(topic = name, partition = p.partition, offset = p.fetch_offset,
                        error = %e, "fetch refused: the stored batch fails its CRC or framing check");
                    metrics::partition_error("Fetch", ResponseError::CorruptMessage.code());
                    partitions.push(data.with_error_code(ResponseError::CorruptMessage.code()));
                }
                Err(ReadError::Storage(e)) => {
                    errors = true;
                    tracing::error!(topic = name, partition = p.partition, error = %e, "fetch read failed");
                    metrics::partition_error("Fetch", ResponseError::KafkaStorageError.code());
                    partitions.push(data.with_error_code(ResponseError::KafkaStorageError.code()));
                }
            }
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(topic.topic.clone())
                .with_partitions(partitions),
        );
    }
    // Session id 0: no fetch session is created, every response is a full one (KIP-227).
    let response = FetchResponse::default()
        .with_session_id(0)
        .with_responses(topics);
    (response, total, errors)
}
