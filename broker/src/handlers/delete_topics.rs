//! DeleteTopics (by name; topic ids are not implemented).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::StorageError;

/// Answers DeleteTopics.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut responses = Vec::with_capacity(req.topic_names.len());
    for name in req.topic_names {
        let topic = name.0.as_str().to_string();
        if !ctx.authorized(state, AclOperation::Delete, ResourceType::Topic, &topic) {
            let code = kafka_protocol::error::ResponseError::TopicAuthorizationFailed.code();
            metrics::partition_error("DeleteTopics", code);
            responses.push(
                DeletableTopicResult::default()
                    .with_name(Some(name))
                    .with_error_code(code),
            );
            continue;
        }
        let store = state.store.clone();
        let delete = {
            let topic = topic.clone();
            move || store.delete_topic(&topic)
        };
        let outcome = if state.is_durable() {
            tokio::task::spawn_blocking(delete)
                .await
                .unwrap_or_else(|e| {
                    Err(StorageError::io(
                        "delete topic task",
                        std::io::Error::other(e.to_string()),
                    ))
                })
        } else {
            delete()
        };
        let (code, message) = match outcome {
            Ok(()) => {
                tracing::info!(%topic, "deleted topic");
                if let Err(e) = state.groups.offsets().delete_topic(&topic) {
                    tracing::warn!(%topic, error = %e, "dropping group offsets of deleted topic failed");
                }
                (0, None)
            }
            Err(StorageError::UnknownTopic(_)) => {
                (ResponseError::UnknownTopicOrPartition.code(), None)
            }
            Err(StorageError::InvalidTopic(_)) => {
                (ResponseError::InvalidTopicException.code(), None)
            }
            Err(e) => {
                tracing::error!(%topic, error = %e, "deleting topic failed");
                (
                    ResponseError::KafkaStorageError.code(),
                    Some(StrBytes::from_string(e.to_string())),
                )
            }
        };
        metrics::partition_error("DeleteTopics", code);
        responses.push(
            DeletableTopicResult::default()
                .with_name(Some(name))
                .with_error_code(code)
                .with_error_message(message),
        );
    }
    DeleteTopicsResponse::default().with_responses(responses)
}
