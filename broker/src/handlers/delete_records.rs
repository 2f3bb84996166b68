//! DeleteRecords (v0..=2): moves each partition's log start offset to the given offset (-1 =
//! the high watermark) and answers the new low watermark. Beyond the high watermark (or
//! negative) is OFFSET_OUT_OF_RANGE, an unknown topic or partition UNKNOWN_TOPIC_OR_PARTITION,
//! a topic whose cleanup.policy lacks `delete` POLICY_VIOLATION, as in Kafka. The new start is
//! checkpointed before segments wholly below it are deleted (`Partition::delete_records`).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::{DeleteRecordsError, Partition, StorageError};

/// Answers DeleteRecords.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        let denied = !ctx.authorized(state, AclOperation::Delete, ResourceType::Topic, &name);
        for p in topic.partitions {
            let target = if denied {
                Err(ResponseError::TopicAuthorizationFailed)
            } else {
                state
                    .partition(&name, p.partition_index)
                    .ok_or(ResponseError::UnknownTopicOrPartition)
            };
            let result = match target {
                Err(ResponseError::TopicAuthorizationFailed) => Err((
                    ResponseError::TopicAuthorizationFailed,
                    format!("not authorized to delete records of {name}"),
                )),
                Err(_) => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("no partition {name}-{}", p.partition_index),
                )),
                Ok(partition) => delete(state, partition, p.offset).await,
            };
            let answer =
                DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            partitions.push(match result {
                Ok(low_watermark) => {
                    tracing::info!(topic = %name, partition = p.partition_index, requested = p.offset, low_watermark, "DeleteRecords");
                    answer.with_low_watermark(low_watermark)
                }
                Err((error, message)) => {
                    tracing::info!(topic = %name, partition = p.partition_index, requested = p.offset, code = error.code(), %message, "DeleteRecords refused");
                    metrics::partition_error("DeleteRecords", error.code());
                    answer.with_low_watermark(-1).with_error_code(error.code())
                }
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

async fn delete(
    state: &Arc<BrokerState>,
    partition: Arc<Partition>,
    offset: i64,
) -> Result<i64, (ResponseError, String)> {
    let run = move || partition.delete_records(offset);
    let outcome = if state.is_durable() {
        tokio::task::spawn_blocking(run).await.unwrap_or_else(|e| {
            Err(DeleteRecordsError::Storage(StorageError::io(
                "delete records task",
                std::io::Error::other(e.to_string()),
            )))
        })
    } else {
        run()
    };
    outcome.map_err(|e| match e {
        DeleteRecordsError::OffsetOutOfRange { .. } => {
            (ResponseError::OffsetOutOfRange, e.to_string())
        }
        DeleteRecordsError::PolicyViolation => (ResponseError::PolicyViolation, e.to_string()),
        DeleteRecordsError::Storage(StorageError::UnknownTopic(_)) => {
            (ResponseError::UnknownTopicOrPartition, e.to_string())
        }
        DeleteRecordsError::Storage(e) => {
            tracing::error!(error = %e, "DeleteRecords failed in storage");
            (ResponseError::KafkaStorageError, e.to_string())
        }
    })
}
