//! SyncGroup (v0-v5): the leader hands in the assignment; every member waits for its share.

use std::sync::Arc;

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers SyncGroup (followers wait for the leader's assignment).
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        return SyncGroupResponse::default().with_error_code(
            kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code(),
        );
    }
    let assignments = req
        .assignments
        .into_iter()
        .map(|a| (a.member_id.to_string(), a.assignment))
        .collect();
    let result = state
        .groups
        .sync(
            req.group_id.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            req.protocol_type.as_ref().map(|s| s.as_str()),
            req.protocol_name.as_ref().map(|s| s.as_str()),
            assignments,
        )
        .await;
    let mut response = SyncGroupResponse::default()
        .with_error_code(result.error)
        .with_assignment(result.assignment);
    if ctx.version >= 5 {
        response = response
            .with_protocol_type(result.protocol_type.map(StrBytes::from_string))
            .with_protocol_name(result.protocol_name.map(StrBytes::from_string));
    }
    response
}
