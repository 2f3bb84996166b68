//! Metadata: this node (broker 0) leads every partition and is the controller; unknown
//! topics are auto-created when the request and the configuration allow it.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::acl::CLUSTER_NAME;
use crate::security::{AclOperation, ResourceType};
use crate::state::{BrokerState, TopicLookup, CLUSTER_ID, NODE_ID};

/// Answers Metadata.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: MetadataRequest,
) -> MetadataResponse {
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let requested: Option<Vec<Option<TopicName>>> = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t.into_iter().map(|t| t.name).collect()),
    };
    // Before v4 there is no flag and brokers auto-create.
    let allow_auto_create = ctx.version < 4 || req.allow_auto_topic_creation;
    let describe =
        |name: &str| ctx.authorized(state, AclOperation::Describe, ResourceType::Topic, name);
    // Auto-creation needs Create on the cluster or on the topic, as in Kafka.
    let may_create = |name: &str| {
        ctx.authorized_on_cluster(state, AclOperation::Create)
            || ctx.authorized(state, AclOperation::Create, ResourceType::Topic, name)
    };
    let mut topics: Vec<MetadataResponseTopic> = match requested {
        // All topics: those the principal may not describe are left out.
        None => state
            .store
            .topics()
            .into_iter()
            .filter(|(name, _)| describe(name))
            .map(|(name, count)| topic_entry(&name, count))
            .collect(),
        Some(names) => names
            .into_iter()
            .map(|name| match name {
                None => error_entry(
                    Some(TopicName::default()),
                    ResponseError::UnknownTopicId.code(),
                ),
                Some(name) if !describe(name.0.as_str()) => {
                    error_entry(Some(name), ResponseError::TopicAuthorizationFailed.code())
                }
                Some(name)
                    if allow_auto_create
                        && state.partition_count(name.0.as_str()).is_none()
                        && !may_create(name.0.as_str()) =>
                {
                    error_entry(Some(name), ResponseError::TopicAuthorizationFailed.code())
                }
                Some(name) => match state.lookup_or_create(name.0.as_str(), allow_auto_create) {
                    TopicLookup::Exists(count) => topic_entry(name.0.as_str(), count),
                    TopicLookup::Missing => {
                        error_entry(Some(name), ResponseError::UnknownTopicOrPartition.code())
                    }
                    TopicLookup::InvalidName => {
                        error_entry(Some(name), ResponseError::InvalidTopicException.code())
                    }
                },
            })
            .collect(),
    };
    for t in &mut topics {
        metrics::partition_error("Metadata", t.error_code);
        if ctx.version >= 8 && req.include_topic_authorized_operations && t.error_code == 0 {
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    ctx.authorized_operations(state, ResourceType::Topic, name.0.as_str());
            }
        }
    }
    let cluster_operations =
        if (8..=10).contains(&ctx.version) && req.include_cluster_authorized_operations {
            ctx.authorized_operations(state, ResourceType::Cluster, CLUSTER_NAME)
        } else {
            i32::MIN
        };
    MetadataResponse::default()
        .with_cluster_authorized_operations(cluster_operations)
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(NODE_ID))
            .with_host(StrBytes::from_string(
                ctx.session.listener.advertised_host.clone(),
            ))
            .with_port(ctx.session.listener.advertised_port)])
        .with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)))
        .with_controller_id(BrokerId(NODE_ID))
        .with_topics(topics)
}

fn topic_entry(name: &str, partitions: i32) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
        .with_partitions(
            (0..partitions)
                .map(|index| {
                    MetadataResponsePartition::default()
                        .with_partition_index(index)
                        .with_leader_id(BrokerId(NODE_ID))
                        .with_leader_epoch(0)
                        .with_replica_nodes(vec![BrokerId(NODE_ID)])
                        .with_isr_nodes(vec![BrokerId(NODE_ID)])
                })
                .collect(),
        )
}

fn error_entry(name: Option<TopicName>, code: i16) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name)
        .with_error_code(code)
}
