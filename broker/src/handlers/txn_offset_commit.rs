//! TxnOffsetCommit (v0..=3): stages a transaction's consumer offsets in the group offsets
//! store. They stay invisible (OffsetFetch with require_stable answers
//! UNSTABLE_OFFSET_COMMIT) until the transaction's COMMIT marker applies them; ABORT drops
//! them. v3 carries the group generation and member id, checked as KIP-447 asks.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};

use super::RequestContext;
use crate::group::{CommittedOffset, TopicPartition};
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::txn::now_ms;

fn respond(
    req: &TxnOffsetCommitRequest,
    code: impl Fn(&str, i32) -> i16,
) -> TxnOffsetCommitResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code(t.name.0.as_str(), p.partition_index))
                        })
                        .collect(),
                )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

/// Answers TxnOffsetCommit.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    // Write on the transactional id, Read on the group, then Read on each topic.
    if !ctx.authorized(
        state,
        AclOperation::Write,
        ResourceType::TransactionalId,
        &req.transactional_id,
    ) {
        let code = ResponseError::TransactionalIdAuthorizationFailed.code();
        metrics::partition_error("TxnOffsetCommit", code);
        return respond(&req, |_, _| code);
    }
    if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        let code = ResponseError::GroupAuthorizationFailed.code();
        metrics::partition_error("TxnOffsetCommit", code);
        return respond(&req, |_, _| code);
    }
    let denied_topics: Vec<&str> = req
        .topics
        .iter()
        .map(|t| t.name.0.as_str())
        .filter(|t| !ctx.authorized(state, AclOperation::Read, ResourceType::Topic, t))
        .collect();
    if !denied_topics.is_empty() {
        let code = ResponseError::TopicAuthorizationFailed.code();
        metrics::partition_error("TxnOffsetCommit", code);
        return respond(&req, |t, _| {
            if denied_topics.contains(&t) {
                code
            } else {
                ResponseError::OperationNotAttempted.code()
            }
        });
    }
    let group = req.group_id.0.to_string();
    let pid = req.producer_id.0;
    // 1. The transaction coordinator: current epoch, group added with AddOffsetsToTxn.
    if let Err(code) = state.txn.check_txn_offsets(
        req.transactional_id.0.as_str(),
        pid,
        req.producer_epoch,
        &group,
    ) {
        metrics::partition_error("TxnOffsetCommit", code.code());
        return respond(&req, |_, _| code.code());
    }
    // 2. The group coordinator: generation and member (v3+, KIP-447).
    let (generation, member) = if ctx.version >= 3 {
        (req.generation_id, req.member_id.to_string())
    } else {
        (-1, String::new())
    };
    let code = state
        .groups
        .validate_commit(&group, generation, &member, true);
    if code != 0 {
        metrics::partition_error("TxnOffsetCommit", code);
        return respond(&req, |_, _| code);
    }
    let now = now_ms();
    let offsets: Vec<(TopicPartition, CommittedOffset)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    TopicPartition::new(t.name.0.as_str(), p.partition_index),
                    CommittedOffset {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p
                            .committed_metadata
                            .as_ref()
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                        commit_timestamp_ms: now,
                    },
                )
            })
        })
        .collect();
    // 3. Stage them in the offsets store (durable; applied or dropped by the marker).
    let store = state.groups.offsets().clone();
    let g = group.clone();
    let staged =
        tokio::task::spawn_blocking(move || store.stage_txn_offsets(&g, pid, offsets)).await;
    let code = match staged {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            tracing::error!(%group, error = %e, "staging transactional offsets failed");
            ResponseError::CoordinatorNotAvailable.code()
        }
        Err(e) => {
            tracing::error!(%group, error = %e, "TxnOffsetCommit task failed");
            ResponseError::CoordinatorNotAvailable.code()
        }
    };
    if code != 0 {
        metrics::partition_error("TxnOffsetCommit", code);
    }
    respond(&req, |_, _| code)
}
