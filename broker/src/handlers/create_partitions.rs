//! CreatePartitions (v0..=3): grows a topic's partition count. The new partitions start
//! empty with the topic's current log settings and are durable (the topic registry is
//! rewritten atomically) before the answer; Metadata shows them at once. Errors as Kafka:
//! UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS (count not larger than the current one or
//! above the broker's limit), INVALID_REPLICA_ASSIGNMENT (an assignment naming another broker
//! or not one per new partition), INVALID_REQUEST (a topic listed twice). `validate_only`
//! checks everything and changes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::{BrokerState, MAX_PARTITIONS_PER_TOPIC, NODE_ID};
use crate::storage::StorageError;

/// Answers CreatePartitions.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut counts = std::collections::HashMap::new();
    for topic in &req.topics {
        *counts.entry(topic.name.clone()).or_insert(0usize) += 1;
    }
    let mut results = Vec::with_capacity(req.topics.len());
    for topic in &req.topics {
        let outcome = if counts.get(&topic.name).copied().unwrap_or(0) > 1 {
            Err((
                ResponseError::InvalidRequest,
                "Duplicate topic in request.".to_string(),
            ))
        } else if !ctx.authorized(state, AclOperation::Alter, ResourceType::Topic, &topic.name) {
            Err((
                ResponseError::TopicAuthorizationFailed,
                "not authorized to alter the topic".to_string(),
            ))
        } else {
            grow(state, topic, req.validate_only).await
        };
        let result = match outcome {
            Ok(()) => CreatePartitionsTopicResult::default().with_name(topic.name.clone()),
            Err((error, message)) => {
                tracing::info!(topic = %topic.name.0.as_str(), code = error.code(), %message,
                    "CreatePartitions refused");
                CreatePartitionsTopicResult::default()
                    .with_name(topic.name.clone())
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message)))
            }
        };
        metrics::partition_error("CreatePartitions", result.error_code);
        results.push(result);
    }
    CreatePartitionsResponse::default().with_results(results)
}

type Refusal = (ResponseError, String);

/// Checks one topic's request and, unless `validate_only`, grows the topic.
async fn grow(
    state: &Arc<BrokerState>,
    topic: &CreatePartitionsTopic,
    validate_only: bool,
) -> Result<(), Refusal> {
    let name = topic.name.0.as_str().to_string();
    let current = state.partition_count(&name).ok_or_else(|| {
        (
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        )
    })?;
    let count = topic.count;
    if count <= current {
        let message = if count == current {
            format!("Topic already has {current} partitions.")
        } else {
            format!(
                "Topic currently has {current} partitions, which is higher than the requested \
                 {count}."
            )
        };
        return Err((ResponseError::InvalidPartitions, message));
    }
    if count > MAX_PARTITIONS_PER_TOPIC {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "The requested count {count} is above this broker's limit of \
                 {MAX_PARTITIONS_PER_TOPIC} partitions per topic."
            ),
        ));
    }
    if let Some(assignments) = &topic.assignments {
        check_assignments(assignments, count - current)?;
    }
    if validate_only {
        return Ok(());
    }
    let store = state.store.clone();
    let add = move || store.add_partitions(&name, count);
    let outcome = if state.is_durable() {
        tokio::task::spawn_blocking(add).await.unwrap_or_else(|e| {
            Err(StorageError::io(
                "create partitions task",
                std::io::Error::other(e.to_string()),
            ))
        })
    } else {
        add()
    };
    outcome.map_err(|e| match e {
        StorageError::UnknownTopic(t) => (
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{t}' does not exist."),
        ),
        // A concurrent request grew the topic first.
        StorageError::InvalidTopic(why) => (ResponseError::InvalidPartitions, why),
        other => {
            tracing::error!(topic = %topic.name.0.as_str(), error = %other,
                "adding partitions failed");
            (ResponseError::KafkaStorageError, other.to_string())
        }
    })
}

/// One assignment per new partition, each naming this broker exactly once (the topic's
/// replication factor is 1 on a single node).
fn check_assignments(
    assignments: &[kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment],
    added: i32,
) -> Result<(), Refusal> {
    let invalid = |message: String| Err((ResponseError::InvalidReplicaAssignment, message));
    if i32::try_from(assignments.len()).ok() != Some(added) {
        return invalid(format!(
            "Increasing the number of partitions by {added} but {} assignments provided.",
            assignments.len()
        ));
    }
    for (i, a) in assignments.iter().enumerate() {
        let ids: Vec<i32> = a.broker_ids.iter().map(|b| b.0).collect();
        if ids.is_empty() {
            return invalid(format!("Assignment {i} names no broker."));
        }
        let unique: HashSet<i32> = ids.iter().copied().collect();
        if unique.len() != ids.len() {
            return invalid(format!("Assignment {i} names a broker twice: {ids:?}."));
        }
        let unknown: Vec<i32> = ids.iter().copied().filter(|&b| b != NODE_ID).collect();
        if !unknown.is_empty() {
            return invalid(format!(
                "Unknown broker(s) in replica assignment: {unknown:?} (this cluster has broker \
                 {NODE_ID} only)."
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
    use kafka_protocol::messages::BrokerId;

    use super::*;

    fn assignment(ids: &[i32]) -> CreatePartitionsAssignment {
        CreatePartitionsAssignment::default()
            .with_broker_ids(ids.iter().copied().map(BrokerId).collect())
    }

    #[test]
    fn assignments_must_name_this_broker_once_per_new_partition() {
        let ok = vec![assignment(&[NODE_ID]), assignment(&[NODE_ID])];
        assert!(check_assignments(&ok, 2).is_ok());
        for (bad, added) in [
            (vec![assignment(&[NODE_ID])], 2),
            (vec![assignment(&[1])], 1),
            (vec![assignment(&[NODE_ID, 1])], 1),
            (vec![assignment(&[NODE_ID, NODE_ID])], 1),
            (vec![assignment(&[])], 1),
        ] {
            let err = check_assignments(&bad, added).unwrap_err();
            assert_eq!(err.0, ResponseError::InvalidReplicaAssignment, "{}", err.1);
        }
    }
}
