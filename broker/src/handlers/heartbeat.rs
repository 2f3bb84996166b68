//! Heartbeat (v0-v4): keeps a member's session alive and tells it when to rejoin.

use std::sync::Arc;

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers Heartbeat.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: HeartbeatRequest,
) -> HeartbeatResponse {
    if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        return HeartbeatResponse::default().with_error_code(
            kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code(),
        );
    }
    let error = state.groups.heartbeat(
        req.group_id.as_str(),
        req.generation_id,
        req.member_id.as_str(),
    );
    HeartbeatResponse::default().with_error_code(error)
}
