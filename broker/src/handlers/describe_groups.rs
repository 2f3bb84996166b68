//! DescribeGroups (v0-v5): state, protocol and members of each group.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers DescribeGroups. Unknown groups are reported as `Dead` without error, as Kafka does
/// before v6.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .clone()
        .into_iter()
        .map(|group_id| {
            let base = DescribedGroup::default().with_authorized_operations(i32::MIN);
            if group_id.is_empty() {
                return base
                    .with_group_id(group_id)
                    .with_error_code(ResponseError::InvalidGroupId.code())
                    .with_group_state(StrBytes::from_static_str("Dead"));
            }
            if !ctx.authorized(
                state,
                AclOperation::Describe,
                ResourceType::Group,
                group_id.as_str(),
            ) {
                return base
                    .with_group_id(group_id)
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code());
            }
            let operations = if ctx.version >= 3 && req.include_authorized_operations {
                ctx.authorized_operations(state, ResourceType::Group, group_id.as_str())
            } else {
                i32::MIN
            };
            let base = base.with_authorized_operations(operations);
            let d = state.groups.describe(group_id.as_str());
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    DescribedGroupMember::default()
                        .with_member_id(StrBytes::from_string(m.member_id))
                        .with_group_instance_id(if ctx.version >= 4 {
                            m.group_instance_id.map(StrBytes::from_string)
                        } else {
                            None
                        })
                        .with_client_id(StrBytes::from_string(m.client_id))
                        .with_client_host(StrBytes::from_string(m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment)
                })
                .collect();
            base.with_group_id(group_id)
                .with_group_state(StrBytes::from_static_str(d.state.as_str()))
                .with_protocol_type(StrBytes::from_string(d.protocol_type))
                .with_protocol_data(StrBytes::from_string(d.protocol))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}
