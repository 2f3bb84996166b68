//! OffsetFetch (v1-v9): committed offsets of a group (v8+: of several groups). With
//! `require_stable` (v7+) a partition with transactional offsets still pending answers
//! UNSTABLE_OFFSET_COMMIT, which read_committed consumers retry.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::group::coordinator::FetchedOffset;
use crate::group::TopicPartition;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Groups fetched offsets by topic, keeping the order in which topics first appear.
fn by_topic(fetched: Vec<FetchedOffset>) -> Vec<(String, Vec<FetchedOffset>)> {
    let mut out: Vec<(String, Vec<FetchedOffset>)> = Vec::new();
    for f in fetched {
        match out.iter_mut().find(|(t, _)| *t == f.partition.topic) {
            Some((_, list)) => list.push(f),
            None => out.push((f.partition.topic.clone(), vec![f])),
        }
    }
    out
}

fn metadata(f: &FetchedOffset) -> Option<StrBytes> {
    Some(StrBytes::from_string(
        f.committed
            .as_ref()
            .map(|c| c.metadata.clone())
            .unwrap_or_default(),
    ))
}

fn requested(topics: impl IntoIterator<Item = (String, Vec<i32>)>) -> Vec<TopicPartition> {
    topics
        .into_iter()
        .flat_map(|(topic, parts)| {
            parts
                .into_iter()
                .map(move |p| TopicPartition::new(topic.clone(), p))
        })
        .collect()
}

/// Answers OffsetFetch.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let require_stable = ctx.version >= 7 && req.require_stable;
    // Kafka: Describe on the group; topics without Describe are left out of "all topics"
    // answers and get TOPIC_AUTHORIZATION_FAILED when named.
    let group_described =
        |group: &str| ctx.authorized(state, AclOperation::Describe, ResourceType::Group, group);
    let authorized_topics = |topics: Vec<(String, Vec<FetchedOffset>)>, all: bool| {
        topics
            .into_iter()
            .filter_map(|(topic, mut list)| {
                if ctx.authorized(state, AclOperation::Describe, ResourceType::Topic, &topic) {
                    return Some((topic, list));
                }
                if all {
                    return None;
                }
                for f in &mut list {
                    f.committed = None;
                    f.error = ResponseError::TopicAuthorizationFailed.code();
                }
                Some((topic, list))
            })
            .collect::<Vec<_>>()
    };
    if ctx.version >= 8 {
        let groups = req
            .groups
            .into_iter()
            .map(|g| {
                if !group_described(g.group_id.as_str()) {
                    return OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code());
                }
                let all = g.topics.is_none();
                let partitions = g.topics.map(|topics| {
                    requested(
                        topics
                            .into_iter()
                            .map(|t| (t.name.to_string(), t.partition_indexes)),
                    )
                });
                let fetched =
                    state
                        .groups
                        .fetch_offsets(g.group_id.as_str(), partitions, require_stable);
                let topics = authorized_topics(by_topic(fetched), all)
                    .into_iter()
                    .map(|(topic, list)| {
                        let partitions = list
                            .iter()
                            .map(|f| {
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(f.partition.partition)
                                    .with_committed_offset(
                                        f.committed.as_ref().map_or(-1, |c| c.offset),
                                    )
                                    .with_committed_leader_epoch(
                                        f.committed.as_ref().map_or(-1, |c| c.leader_epoch),
                                    )
                                    .with_metadata(metadata(f))
                                    .with_error_code(f.error)
                            })
                            .collect();
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(StrBytes::from_string(topic)))
                            .with_partitions(partitions)
                    })
                    .collect();
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(topics)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    if !group_described(req.group_id.as_str()) {
        let code = ResponseError::GroupAuthorizationFailed.code();
        return OffsetFetchResponse::default().with_error_code(code);
    }
    let all = req.topics.is_none();
    // v1 always names the partitions; v2+ may send null for "all committed partitions".
    let partitions = req.topics.map(|topics| {
        requested(
            topics
                .into_iter()
                .map(|t| (t.name.to_string(), t.partition_indexes)),
        )
    });
    let fetched = state
        .groups
        .fetch_offsets(req.group_id.as_str(), partitions, require_stable);
    let topics = authorized_topics(by_topic(fetched), all)
        .into_iter()
        .map(|(topic, list)| {
            let partitions = list
                .iter()
                .map(|f| {
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(f.partition.partition)
                        .with_committed_offset(f.committed.as_ref().map_or(-1, |c| c.offset))
                        .with_committed_leader_epoch(if ctx.version >= 5 {
                            f.committed.as_ref().map_or(-1, |c| c.leader_epoch)
                        } else {
                            -1
                        })
                        .with_metadata(metadata(f))
                        .with_error_code(f.error)
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic)))
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}
