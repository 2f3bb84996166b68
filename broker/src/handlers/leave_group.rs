//! LeaveGroup (v0-v5): one member (v0-v2) or a batch of members (v3+) leave a group.

use std::sync::Arc;

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers LeaveGroup.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: LeaveGroupRequest,
) -> LeaveGroupResponse {
    if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        return LeaveGroupResponse::default().with_error_code(
            kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code(),
        );
    }
    if ctx.version <= 2 {
        let (top, errors) = state
            .groups
            .leave(req.group_id.as_str(), &[req.member_id.to_string()]);
        // v0-v2 carry one code: the top-level error, else the member's.
        let error = if top != 0 {
            top
        } else {
            errors.first().copied().unwrap_or(0)
        };
        return LeaveGroupResponse::default().with_error_code(error);
    }
    let ids: Vec<String> = req
        .members
        .iter()
        .map(|m| m.member_id.to_string())
        .collect();
    let (top, errors) = state.groups.leave(req.group_id.as_str(), &ids);
    let members = if top != 0 {
        Vec::new()
    } else {
        req.members
            .into_iter()
            .zip(errors)
            .map(|(m, error)| {
                MemberResponse::default()
                    .with_member_id(m.member_id)
                    .with_group_instance_id(m.group_instance_id)
                    .with_error_code(error)
            })
            .collect()
    };
    LeaveGroupResponse::default()
        .with_error_code(top)
        .with_members(members)
}
