//! OffsetCommit (v2-v9): checks the member and generation, then stores the offsets durably.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};

use super::RequestContext;
use crate::group::{CommittedOffset, TopicPartition};
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers OffsetCommit.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    // Partitions of unknown topics are refused; the rest go to the coordinator in one batch.
    let mut codes: Vec<Vec<i16>> = Vec::with_capacity(req.topics.len());
    let mut batch = Vec::new();
    // Read on the group, then Read on each topic (Kafka's order).
    let group_denied = !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    );
    for topic in &req.topics {
        let mut topic_codes = Vec::with_capacity(topic.partitions.len());
        let denied = if group_denied {
            Some(ResponseError::GroupAuthorizationFailed.code())
        } else if !ctx.authorized(state, AclOperation::Read, ResourceType::Topic, &topic.name) {
            Some(ResponseError::TopicAuthorizationFailed.code())
        } else {
            None
        };
        for p in &topic.partitions {
            if let Some(code) = denied {
                topic_codes.push(code);
                continue;
            }
            if state
                .partition(topic.name.as_str(), p.partition_index)
                .is_none()
            {
                topic_codes.push(ResponseError::UnknownTopicOrPartition.code());
                continue;
            }
            topic_codes.push(0);
            batch.push((
                TopicPartition::new(topic.name.as_str(), p.partition_index),
                CommittedOffset {
                    offset: p.committed_offset,
                    leader_epoch: if ctx.version >= 6 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    commit_timestamp_ms: now_ms,
                },
            ));
        }
        codes.push(topic_codes);
    }
    let batch_len = batch.len();
    let results = if group_denied {
        Vec::new()
    } else {
        state
            .groups
            .commit_offsets(
                req.group_id.as_str(),
                req.generation_id_or_member_epoch,
                req.member_id.as_str(),
                batch,
            )
            .await
    };
    let mut results = results.into_iter();
    tracing::debug!(group = %req.group_id.as_str(), partitions = batch_len, "offset commit");
    let topics = req
        .topics
        .into_iter()
        .zip(codes)
        .map(|(topic, topic_codes)| {
            let partitions = topic
                .partitions
                .iter()
                .zip(topic_codes)
                .map(|(p, code)| {
                    let code = if code == 0 {
                        results.next().unwrap_or(0)
                    } else {
                        code
                    };
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}
