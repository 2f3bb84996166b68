//! CreateTopics: any replication factor is accepted on this single node (clients ask for 3);
//! config entries are validated as Kafka does (unknown name, null or bad value: INVALID_CONFIG)
//! and persisted with the topic; those that change the log (retention, cleanup policy,
//! segments) become the partitions' [`LogConfig`](crate::storage::LogConfig).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;

use super::{topic_configs, RequestContext};
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::{BrokerState, MAX_PARTITIONS_PER_TOPIC};
use crate::storage::StorageError;

/// Answers CreateTopics.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    // Create on the cluster covers every topic; else Create on each topic.
    let cluster_create = ctx.authorized_on_cluster(state, AclOperation::Create);
    let mut results = Vec::with_capacity(req.topics.len());
    let mut seen = std::collections::HashSet::new();
    for topic in req.topics {
        let duplicate = !seen.insert(topic.name.clone());
        let result = if duplicate {
            failure(
                &topic,
                ResponseError::InvalidRequest,
                "topic listed twice in one request".into(),
            )
        } else if !cluster_create
            && !ctx.authorized(
                state,
                AclOperation::Create,
                ResourceType::Topic,
                &topic.name,
            )
        {
            failure(
                &topic,
                ResponseError::TopicAuthorizationFailed,
                "not authorized to create the topic".into(),
            )
        } else {
            create_one(state, &topic, req.validate_only).await
        };
        metrics::partition_error("CreateTopics", result.error_code);
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

async fn create_one(
    state: &Arc<BrokerState>,
    topic: &CreatableTopic,
    validate_only: bool,
) -> CreatableTopicResult {
    let name = topic.name.0.as_str().to_string();
    let partitions = if !topic.assignments.is_empty() {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return failure(
                topic,
                ResponseError::InvalidRequest,
                "both assignments and partitions/replication factor given".into(),
            );
        }
        i32::try_from(topic.assignments.len()).unwrap_or(i32::MAX)
    } else if topic.num_partitions == -1 {
        state.config.default_partitions
    } else {
        topic.num_partitions
    };
    if partitions <= 0 || partitions > MAX_PARTITIONS_PER_TOPIC {
        return failure(
            topic,
            ResponseError::InvalidPartitions,
            format!("partition count must be 1..={MAX_PARTITIONS_PER_TOPIC}, got {partitions}"),
        );
    }
    if topic.assignments.is_empty()
        && (topic.replication_factor == 0 || topic.replication_factor < -1)
    {
        return failure(
            topic,
            ResponseError::InvalidReplicationFactor,
            format!(
                "replication factor {} is not positive",
                topic.replication_factor
            ),
        );
    }
    if !is_valid_topic_name(&name) {
        return failure(
            topic,
            ResponseError::InvalidTopicException,
            format!("illegal topic name {name:?}"),
        );
    }
    if state.partition_count(&name).is_some() {
        return failure(
            topic,
            ResponseError::TopicAlreadyExists,
            format!("topic {name:?} already exists"),
        );
    }
    if let Some(e) = topic.configs.iter().find_map(|c| {
        topic_configs::validate(c.name.as_str(), c.value.as_ref().map(|v| v.as_str())).err()
    }) {
        return failure(topic, ResponseError::InvalidConfig, e.to_string());
    }
    let ok = CreatableTopicResult::default()
        .with_name(topic.name.clone())
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    if validate_only {
        return ok;
    }
    let store = state.store.clone();
    let configs: std::collections::BTreeMap<String, String> = topic
        .configs
        .iter()
        .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
        .collect();
    let create = {
        let name = name.clone();
        move || store.create_topic_with_configs(&name, partitions, configs)
    };
    let outcome = if state.is_durable() {
        tokio::task::spawn_blocking(create)
            .await
            .unwrap_or_else(|e| {
                Err(StorageError::io(
                    "create topic task",
                    std::io::Error::other(e.to_string()),
                ))
            })
    } else {
        create()
    };
    match outcome {
        Ok(()) => {
            tracing::info!(topic = %name, partitions, "created topic");
            ok
        }
        Err(StorageError::TopicExists(_)) => failure(
            topic,
            ResponseError::TopicAlreadyExists,
            format!("topic {name:?} already exists"),
        ),
        Err(StorageError::InvalidTopic(_)) => failure(
            topic,
            ResponseError::InvalidTopicException,
            format!("illegal topic name {name:?}"),
        ),
        Err(e) => {
            tracing::error!(topic = %name, error = %e, "creating topic failed");
            failure(topic, ResponseError::KafkaStorageError, e.to_string())
        }
    }
}

/// Kafka's topic name rule: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn is_valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

fn failure(topic: &CreatableTopic, error: ResponseError, message: String) -> CreatableTopicResult {
    tracing::info!(topic = %topic.name.0.as_str(), code = error.code(), %message, "CreateTopics refused");
    CreatableTopicResult::default()
        .with_name(topic.name.clone())
        .with_error_code(error.code())
        .with_error_message(Some(StrBytes::from_string(message)))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
}

#[cfg(test)]
mod tests {
    use super::is_valid_topic_name;

    #[test]
    fn topic_names() {
        assert!(is_valid_topic_name("orders.v1_a-b"));
        assert!(!is_valid_topic_name(""));
        assert!(!is_valid_topic_name("."));
        assert!(!is_valid_topic_name(".."));
        assert!(!is_valid_topic_name("a/b"));
        assert!(!is_valid_topic_name(&"x".repeat(250)));
    }
}
