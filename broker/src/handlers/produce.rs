//! Produce (v3+): appends each partition's one RecordBatch as received; per-partition
//! error codes; acks 0 gets no response (the dispatcher drops it), 1 and -1 are the same on
//! one node. Transactional batches need the request's transactional id and are checked
//! against the transaction coordinator before they are appended.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::batch::{self, ProducedBatches};
use crate::storage::{AppendError, AppendOutcome, Partition, PendingAppend};
use crate::txn::TxnProduceError;

/// One partition's part of the request, resolved before appending.
struct Job {
    topic: usize,
    index: i32,
    target: Result<(Arc<Partition>, ProducedBatches), (ResponseError, String)>,
}

/// Answers Produce.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: ProduceRequest,
) -> ProduceResponse {
    let acks_ok = (-1..=1).contains(&req.acks);
    // Kafka: a transactional produce needs Write on its transactional id, every topic Write;
    // transactional batches without a transactional id are refused like an unauthorized one.
    let txn_id_denied = match &req.transactional_id {
        Some(id) => !ctx.authorized(
            state,
            AclOperation::Write,
            ResourceType::TransactionalId,
            id,
        ),
        None => req
            .topic_data
            .iter()
            .flat_map(|t| &t.partition_data)
            .filter_map(|p| p.records.as_deref())
            .any(batch::has_transactional_batch),
    };
    // the coordinator checks each transactional batch's producer id against this id
    let txn_id: Option<Arc<str>> = req.transactional_id.as_ref().map(|t| Arc::from(t.as_str()));
    let mut names: Vec<TopicName> = Vec::with_capacity(req.topic_data.len());
    let mut jobs = Vec::new();
    for (topic_no, topic) in req.topic_data.into_iter().enumerate() {
        let name = topic.name.0.as_str();
        let denied = if txn_id_denied {
            Some(ResponseError::TransactionalIdAuthorizationFailed)
        } else if !ctx.authorized(state, AclOperation::Write, ResourceType::Topic, name) {
            Some(ResponseError::TopicAuthorizationFailed)
        } else {
            None
        };
        for p in topic.partition_data {
            let target = if let Some(error) = denied {
                Err((error, format!("not authorized to write to {name}")))
            } else if !acks_ok {
                Err((
                    ResponseError::InvalidRequiredAcks,
                    format!("acks must be 0, 1 or -1, got {}", req.acks),
                ))
            } else {
                // Produce never creates a topic (Kafka: only Metadata auto-creates).
                match state.partition(name, p.index) {
                    None => Err((
                        ResponseError::UnknownTopicOrPartition,
                        format!("no partition {name}-{}", p.index),
                    )),
                    Some(partition) => match p.records {
                        Some(records) => {
                            parse_records(ctx, &partition, records).map(|b| (partition, b))
                        }
                        None => Err((ResponseError::CorruptMessage, "null records".into())),
                    },
                }
            };
            jobs.push(Job {
                topic: topic_no,
                index: p.index,
                target,
            });
        }
        names.push(topic.name);
    }

    let targets: Vec<_> = jobs
        .iter()
        .map(|j| j.target.as_ref().ok().cloned())
        .collect();
    let outcomes = if state.is_durable() {
        append_in_parallel(state, txn_id, targets).await
    } else {
        targets
            .into_iter()
            // through the transaction layer, which checks transactional batches
            .map(|job| {
                job.map(|(partition, produced)| {
                    state
                        .txn
                        .append_produced(&partition, txn_id.as_deref(), &produced)
                })
            })
            .collect()
    };

    let mut appended = false;
    let mut responses: Vec<TopicProduceResponse> = names
        .iter()
        .map(|n| TopicProduceResponse::default().with_name(n.clone()))
        .collect();
    for (job, outcome) in jobs.into_iter().zip(outcomes) {
        let topic = names[job.topic].0.as_str();
        // the records of a refused batch that caused it (Produce v8+ `record_errors`)
        let mut record_errors = Vec::new();
        let result = match (job.target, outcome) {
            (Err((error, message)), _) => Err((error, message)),
            (Ok(_), None) => Err((
                ResponseError::KafkaStorageError,
                "append task failed".into(),
            )),
            (Ok((partition, _)), Some(Ok(outcome))) => {
                if outcome.duplicate {
                    tracing::debug!(
                        topic,
                        partition = job.index,
                        base_offset = outcome.base_offset,
                        "duplicate batch"
                    );
                } else {
                    appended = true;
                    metrics::log_end_offset(topic, job.index, partition.high_watermark());
                }
                Ok(outcome)
            }
            // refusals of the transaction layer
            (Ok(_), Some(Err(TxnProduceError::Append(e)))) => {
                if let AppendError::RecordErrors { indexes, reason } = &e {
                    if ctx.version >= 8 {
                        record_errors = indexes
                            .iter()
                            .map(|i| {
                                BatchIndexAndErrorMessage::default()
                                    .with_batch_index(*i)
                                    .with_batch_index_error_message(Some(StrBytes::from_string(
                                        reason.clone(),
                                    )))
                            })
                            .collect();
                    }
                }
                Err(map_append_error(ctx.version, &e))
            }
            (Ok(_), Some(Err(TxnProduceError::Refused(code)))) => Err((
                code,
                "transactional batch refused by the coordinator".into(),
            )),
            (Ok(_), Some(Err(TxnProduceError::Txn(e)))) => {
                Err((ResponseError::KafkaStorageError, e.to_string()))
            }
        };
        let response = match result {
            Ok(AppendOutcome {
                base_offset,
                log_append_time,
                log_start_offset,
                ..
            }) => PartitionProduceResponse::default()
                .with_index(job.index)
                .with_base_offset(base_offset)
                .with_log_append_time_ms(log_append_time)
                .with_log_start_offset(log_start_offset),
            Err((error, message)) => {
                tracing::info!(topic, partition = job.index, code = error.code(), %message, "produce refused");
                metrics::partition_error("Produce", error.code());
                PartitionProduceResponse::default()
                    .with_index(job.index)
                    .with_error_code(error.code())
                    .with_base_offset(-1)
                    .with_log_append_time_ms(-1)
                    .with_log_start_offset(-1)
                    .with_record_errors(record_errors)
                    .with_error_message(Some(StrBytes::from_string(message)))
            }
        };
        responses[job.topic].partition_responses.push(response);
    }
    if appended {
        state.appended.notify_waiters();
    }
    ProduceResponse::default().with_responses(responses)
}

// Appends go through the transaction layer, which checks
// transactional batches against the coordinator and records their first offsets.
type AppendResult = Result<AppendOutcome, TxnProduceError>;

/// Appends on the blocking pool, one task per partition so their fsyncs overlap; appends
/// to the same partition stay in request order. `None` marks a task that died.
async fn append_in_parallel(
    state: &Arc<BrokerState>,
    txn_id: Option<Arc<str>>,
    jobs: Vec<Option<(Arc<Partition>, ProducedBatches)>>,
) -> Vec<Option<AppendResult>> {
    // (partition, [(job slot, records)])
    type Group = (Arc<Partition>, Vec<(usize, ProducedBatches)>);
    let mut groups: Vec<Group> = Vec::new();
    let slots = jobs.len();
    for (slot, job) in jobs.into_iter().enumerate() {
        if let Some((partition, produced)) = job {
            match groups.iter_mut().find(|(p, _)| Arc::ptr_eq(p, &partition)) {
                Some((_, group)) => group.push((slot, produced)),
                None => groups.push((partition, vec![(slot, produced)])),
            }
        }
    }
    let mut outcomes: Vec<Option<AppendResult>> = (0..slots).map(|_| None).collect();
    if let [_] = groups.as_slice() {
        // One partition: write, release the order and fsync in one blocking task, without a
        // round trip through the connection's task in between.
        let (partition, group) = groups.pop().expect("one group");
        if state.store.appends_in_memory() {
            // Nothing to wait for: append on the connection's task, without handing the
            // request to a blocking thread and back.
            let written = write_group(state, &partition, txn_id.as_deref(), group);
            for (slot, result) in sync_group(&partition, written) {
                outcomes[slot] = Some(result);
            }
            return outcomes;
        }
        let order = crate::server::take_request_order();
        let state = Arc::clone(state);
        let task = tokio::task::spawn_blocking(move || {
            let written = write_group(&state, &partition, txn_id.as_deref(), group);
            if let Some(order) = order {
                order.release();
            }
            sync_group(&partition, written)
        });
        match task.await {
            Ok(results) => {
                for (slot, result) in results {
                    outcomes[slot] = Some(result);
                }
            }
            Err(e) => tracing::error!(error = %e, "append task failed"),
        }
        return outcomes;
    }
    // Write phase: the appends, in request order per partition, without waiting for fsync.
    let tasks: Vec<_> = groups
        .into_iter()
        .map(|(partition, group)| {
            let state = Arc::clone(state);
            let txn_id = txn_id.clone();
            tokio::task::spawn_blocking(move || {
                let results = write_group(&state, &partition, txn_id.as_deref(), group);
                (partition, results)
            })
        })
        .collect();
    let mut written = Vec::with_capacity(tasks.len());
    for task in tasks {
        match task.await {
            Ok(group) => written.push(group),
            Err(e) => tracing::error!(error = %e, "append task failed"),
        }
    }
    // Every append of this request is ordered in its log: the connection may start on its
    // next request while the fsyncs below run, so one fsync can cover several requests.
    crate::server::release_request_order();
    // Durability phase: one fsync per partition (shared with concurrent appenders).
    let syncs: Vec<_> = written
        .into_iter()
        .map(|(partition, results)| {
            tokio::task::spawn_blocking(move || sync_group(&partition, results))
        })
        .collect();
    for task in syncs {
        match task.await {
            Ok(results) => {
                for (slot, result) in results {
                    outcomes[slot] = Some(result);
                }
            }
            Err(e) => tracing::error!(error = %e, "append task failed"),
        }
    }
    outcomes
}

/// One partition's appends of a request, in request order, without waiting for fsync.
fn write_group(
    state: &BrokerState,
    partition: &Arc<Partition>,
    txn_id: Option<&str>,
    group: Vec<(usize, ProducedBatches)>,
) -> Vec<(usize, Result<PendingAppend, TxnProduceError>)> {
    group
        .into_iter()
        .map(|(slot, produced)| {
            (
                slot,
                state
                    .txn
                    .append_produced_unsynced(partition, txn_id, &produced),
            )
        })
        .collect()
}

/// Makes one partition's written appends durable with one fsync (shared with concurrent
/// appenders); an append fails if the fsync its bytes needed failed.
fn sync_group(
    partition: &Partition,
    results: Vec<(usize, Result<PendingAppend, TxnProduceError>)>,
) -> Vec<(usize, AppendResult)> {
    let target = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().and_then(|p| p.durable_at))
        .max();
    let synced = target.map_or(Ok(()), |t| partition.make_durable(t));
    results
        .into_iter()
        .map(|(slot, r)| {
            let r = match (r, &synced) {
                (Ok(p), Err(e)) if p.durable_at.is_some() => Err(TxnProduceError::from(
                    AppendError::Storage(crate::storage::StorageError::io(
                        partition.dir(),
                        std::io::Error::other(e.to_string()),
                    )),
                )),
                (r, _) => r.map(|p| p.outcome),
            };
            (slot, r)
        })
        .collect()
}

/// The Kafka error code (and message) for a refused append.
pub fn map_append_error(version: i16, error: &AppendError) -> (ResponseError, String) {
    let code = match error {
        AppendError::CorruptMessage(_) => ResponseError::CorruptMessage,
        // INVALID_RECORD exists from Produce v8 on; older clients know CORRUPT_MESSAGE.
        AppendError::InvalidRecord(_) | AppendError::RecordErrors { .. } if version >= 8 => {
            ResponseError::InvalidRecord
        }
        AppendError::InvalidRecord(_) | AppendError::RecordErrors { .. } => {
            ResponseError::CorruptMessage
        }
        AppendError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        AppendError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        AppendError::Storage(_) => ResponseError::KafkaStorageError,
    };
    (code, error.to_string())
}

/// Splits and validates one partition's records, once for the whole produce path, and
/// checks them against the topic's max.message.bytes. A batch that is too large is reported
/// as such even when a later batch is damaged.
fn parse_records(
    ctx: &RequestContext,
    partition: &Partition,
    records: Bytes,
) -> Result<ProducedBatches, (ResponseError, String)> {
    let max = partition.log_config().max_message_bytes.max(0) as usize;
    let too_large = |size: usize| {
        (
            ResponseError::MessageTooLarge,
            format!(
                "record batch of {size} bytes is larger than the topic's max.message.bytes {max}"
            ),
        )
    };
    match ProducedBatches::parse(records.clone()) {
        Ok(produced) if produced.largest() > max => Err(too_large(produced.largest())),
        // Kafka's `ProduceRequest.validateRecords`: from v3 on, one batch per partition. A
        // request's batches would otherwise be checked and appended as separate units.
        Ok(produced) if produced.batches().len() != 1 => Err(map_append_error(
            ctx.version,
            &AppendError::InvalidRecord(format!(
                "Produce v3 and later carries exactly one record batch per partition, got {}",
                produced.batches().len()
            )),
        )),
        Ok(produced) => Ok(produced),
        Err(fault) => match largest_batch(&records) {
            Some(size) if size > max => Err(too_large(size)),
            _ => Err(map_append_error(ctx.version, &fault.into())),
        },
    }
}

/// The size of the largest record batch in a Produce request's records field, as far as its
/// framing can be followed.
fn largest_batch(records: &[u8]) -> Option<usize> {
    let mut pos = 0;
    let mut largest = None;
    while let Some(Ok(size)) = crate::storage::batch::peek_size(&records[pos..]) {
        largest = largest.max(Some(size));
        pos = pos.saturating_add(size);
        if pos >= records.len() {
            break;
        }
    }
    largest
}
