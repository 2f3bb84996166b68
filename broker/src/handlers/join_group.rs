//! JoinGroup (v0-v9): hands the request to the group coordinator and waits for the rebalance.

use std::sync::Arc;

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::group::JoinParams;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers JoinGroup (may wait up to the group's rebalance timeout).
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: JoinGroupRequest,
) -> JoinGroupResponse {
    if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        return JoinGroupResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code())
            .with_generation_id(-1);
    }
    let params = JoinParams {
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: ctx.client_id.clone().unwrap_or_default(),
        client_host: String::new(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if ctx.version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: ctx.version >= 4,
    };
    let result = state.groups.join(req.group_id.as_str(), params).await;
    let members = result
        .members
        .into_iter()
        .map(|m| {
            JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_string(m.member_id))
                .with_group_instance_id(if ctx.version >= 5 {
                    m.group_instance_id.map(StrBytes::from_string)
                } else {
                    None
                })
                .with_metadata(m.metadata)
        })
        .collect();
    // Before v7 the protocol name is not nullable.
    let protocol_name = match result.protocol_name {
        Some(name) => Some(StrBytes::from_string(name)),
        None if ctx.version < 7 => Some(StrBytes::default()),
        None => None,
    };
    JoinGroupResponse::default()
        .with_error_code(result.error)
        .with_generation_id(result.generation_id)
        .with_protocol_type(if ctx.version >= 7 {
            result.protocol_type.map(StrBytes::from_string)
        } else {
            None
        })
        .with_protocol_name(protocol_name)
        .with_leader(StrBytes::from_string(result.leader))
        .with_member_id(StrBytes::from_string(result.member_id))
        .with_members(members)
}
