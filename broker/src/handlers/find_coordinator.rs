//! FindCoordinator (v0..=3): this single node is the group coordinator and the transaction
//! coordinator for every key.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::state::{BrokerState, NODE_ID};

/// Coordinator type of consumer groups.
pub const KEY_TYPE_GROUP: i8 = 0;
/// Coordinator type of transactional ids.
pub const KEY_TYPE_TRANSACTION: i8 = 1;

/// Answers FindCoordinator.
pub fn handle(
    state: &Arc<BrokerState>,
    _ctx: &RequestContext,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    if !matches!(req.key_type, KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION) {
        return FindCoordinatorResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(StrBytes::from_string(format!(
                "unknown coordinator key type {}",
                req.key_type
            ))))
            .with_node_id(BrokerId(-1))
            .with_port(-1);
    }
    tracing::debug!(key = %req.key.as_str(), key_type = req.key_type, "FindCoordinator");
    FindCoordinatorResponse::default()
        .with_node_id(BrokerId(NODE_ID))
        .with_host(StrBytes::from_string(state.advertised_host.clone()))
        .with_port(state.advertised_port)
}
