//! AlterConfigs (v0..=2): replaces the whole config set of a TOPIC resource (configs not
//! listed return to their defaults). Every entry is validated first; one invalid entry is
//! INVALID_CONFIG for that resource and nothing changes. `validate_only` checks without
//! changing anything. Applied changes are persisted and reach the partitions at once.
//! BROKER resources are read-only here (set by command-line flags): INVALID_REQUEST.
//!
//! `admit` and `apply_topic` are shared with IncrementalAlterConfigs.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use super::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use super::{topic_configs, RequestContext};
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::StorageError;

/// A refusal of one resource: the error code and the message sent with it.
pub(super) type Refusal = (ResponseError, String);

/// Answers AlterConfigs.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let mut seen = HashSet::new();
    let mut responses = Vec::with_capacity(req.resources.len());
    for resource in req.resources {
        let name = resource.resource_name.to_string();
        let outcome = match admit(state, ctx, &mut seen, resource.resource_type, &name) {
            Err(refusal) => Err(refusal),
            Ok(()) => {
                let entries: Vec<(String, Option<String>)> = resource
                    .configs
                    .iter()
                    .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
                    .collect();
                match replacement(&entries) {
                    Ok(configs) => apply_topic(state, &name, configs, req.validate_only).await,
                    Err(refusal) => Err(refusal),
                }
            }
        };
        let response = AlterConfigsResourceResponse::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err((error, message)) => {
                refused("AlterConfigs", &name, error, &message);
                response
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message)))
            }
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// The checks every resource of an AlterConfigs or IncrementalAlterConfigs request passes
/// before its configs are looked at: listed once in the request (`seen` holds those before
/// it), the principal allowed to alter it, and an existing topic.
pub(super) fn admit(
    state: &BrokerState,
    ctx: &RequestContext,
    seen: &mut HashSet<(i8, String)>,
    resource_type: i8,
    name: &str,
) -> Result<(), Refusal> {
    if !seen.insert((resource_type, name.to_string())) {
        return Err((
            ResponseError::InvalidRequest,
            format!("resource {name:?} listed twice in one request"),
        ));
    }
    check_config_access(state, ctx, resource_type, name, AclOperation::AlterConfigs)?;
    check_resource(state, resource_type, name)
}

/// The new config set of an AlterConfigs resource, each entry validated.
fn replacement(entries: &[(String, Option<String>)]) -> Result<BTreeMap<String, String>, Refusal> {
    let mut configs = BTreeMap::new();
    for (name, value) in entries {
        topic_configs::validate(name, value.as_deref())
            .map_err(|e| (ResponseError::InvalidConfig, e.to_string()))?;
        if configs
            .insert(name.clone(), value.clone().unwrap_or_default())
            .is_some()
        {
            return Err((
                ResponseError::InvalidRequest,
                format!("config {name:?} listed twice for one resource"),
            ));
        }
    }
    Ok(configs)
}

/// Refuses what is not an existing topic: unknown topics (UNKNOWN_TOPIC_OR_PARTITION),
/// broker resources (read-only on this broker) and other resource types (INVALID_REQUEST).
/// Kafka's config authorization: `operation` (DescribeConfigs or AlterConfigs) on the topic
/// (TOPIC_AUTHORIZATION_FAILED) or on the cluster for broker configs
/// (CLUSTER_AUTHORIZATION_FAILED).
pub(super) fn check_config_access(
    state: &BrokerState,
    ctx: &RequestContext,
    resource_type: i8,
    name: &str,
    operation: AclOperation,
) -> Result<(), Refusal> {
    match resource_type {
        RESOURCE_TOPIC if !ctx.authorized(state, operation, ResourceType::Topic, name) => Err((
            ResponseError::TopicAuthorizationFailed,
            format!("not authorized for {operation} on topic {name:?}"),
        )),
        RESOURCE_BROKER if !ctx.authorized_on_cluster(state, operation) => Err((
            ResponseError::ClusterAuthorizationFailed,
            format!("not authorized for {operation} on the cluster"),
        )),
        _ => Ok(()),
    }
}

fn check_resource(state: &BrokerState, resource_type: i8, name: &str) -> Result<(), Refusal> {
    match resource_type {
        RESOURCE_TOPIC if state.partition_count(name).is_some() => Ok(()),
        RESOURCE_TOPIC => Err((
            ResponseError::UnknownTopicOrPartition,
            format!("unknown topic {name:?}"),
        )),
        RESOURCE_BROKER => Err((
            ResponseError::InvalidRequest,
            format!(
                "broker {name:?}: broker configs cannot be changed at run time on this \
                 single-node broker; set them with its command-line flags"
            ),
        )),
        other => Err((
            ResponseError::InvalidRequest,
            format!("resource type {other} cannot be altered on this broker"),
        )),
    }
}

/// Replaces the configs of `topic` with `configs` (validated) unless `validate_only`:
/// persisted, then applied to the partitions.
pub(super) async fn apply_topic(
    state: &Arc<BrokerState>,
    topic: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), Refusal> {
    if validate_only {
        return Ok(());
    }
    let store = state.store.clone();
    let name = topic.to_string();
    let alter = move || store.alter_topic_configs(&name, configs);
    let outcome = if state.is_durable() {
        tokio::task::spawn_blocking(alter)
            .await
            .unwrap_or_else(|e| {
                Err(StorageError::io(
                    "alter configs task",
                    std::io::Error::other(e.to_string()),
                ))
            })
    } else {
        alter()
    };
    match outcome {
        Ok(()) => Ok(()),
        Err(StorageError::UnknownTopic(_)) => Err((
            ResponseError::UnknownTopicOrPartition,
            format!("unknown topic {topic:?}"),
        )),
        Err(e) => {
            tracing::error!(topic, error = %e, "persisting topic configs failed");
            Err((ResponseError::KafkaStorageError, e.to_string()))
        }
    }
}

/// Logs and counts a refused resource.
pub(super) fn refused(api: &'static str, resource: &str, error: ResponseError, message: &str) {
    tracing::info!(
        api,
        resource,
        code = error.code(),
        message,
        "config change refused"
    );
    metrics::partition_error(api, error.code());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, value: Option<&str>) -> (String, Option<String>) {
        (name.to_string(), value.map(str::to_string))
    }

    #[test]
    fn replacement_validates_every_entry() {
        let ok = replacement(&[
            entry("retention.ms", Some("1000")),
            entry("compression.type", Some("lz4")),
        ])
        .expect("valid");
        assert_eq!(ok.len(), 2);
        for bad in [
            vec![
                entry("retention.ms", Some("1000")),
                entry("nope", Some("1")),
            ],
            vec![entry("retention.ms", Some("soon"))],
            vec![entry("cleanup.policy", Some("shred"))],
            vec![entry("retention.ms", None)],
        ] {
            assert_eq!(
                replacement(&bad).map_err(|e| e.0),
                Err(ResponseError::InvalidConfig)
            );
        }
        assert_eq!(
            replacement(&[
                entry("retention.ms", Some("1")),
                entry("retention.ms", Some("2"))
            ])
            .map_err(|e| e.0),
            Err(ResponseError::InvalidRequest)
        );
    }
}
