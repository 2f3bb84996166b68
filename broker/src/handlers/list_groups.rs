//! ListGroups (v0-v5): every group this coordinator knows, optionally filtered by state
//! (v4+) and type (v5+; all groups here are `classic`).

use std::sync::Arc;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// The group type of classic-protocol groups (KIP-848 names).
const CLASSIC: &str = "classic";

/// Answers ListGroups.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: ListGroupsRequest,
) -> ListGroupsResponse {
    let types_match = ctx.version < 5
        || req.types_filter.is_empty()
        || req
            .types_filter
            .iter()
            .any(|t| t.as_str().eq_ignore_ascii_case(CLASSIC));
    let states: Vec<String> = if ctx.version >= 4 {
        req.states_filter.iter().map(|s| s.to_string()).collect()
    } else {
        Vec::new()
    };
    let cluster_describe = ctx.authorized_on_cluster(state, AclOperation::Describe);
    let groups = if types_match {
        state
            .groups
            .list(&states)
            .into_iter()
            // Describe on the cluster lists every group; else the groups the principal may
            // describe.
            .filter(|g| {
                cluster_describe
                    || ctx.authorized(
                        state,
                        AclOperation::Describe,
                        ResourceType::Group,
                        &g.group_id,
                    )
            })
            .map(|g| {
                ListedGroup::default()
                    .with_group_id(GroupId(StrBytes::from_string(g.group_id)))
                    .with_protocol_type(StrBytes::from_string(g.protocol_type))
                    .with_group_state(StrBytes::from_static_str(g.state.as_str()))
                    .with_group_type(StrBytes::from_static_str(CLASSIC))
            })
            .collect()
    } else {
        Vec::new()
    };
    ListGroupsResponse::default().with_groups(groups)
}
