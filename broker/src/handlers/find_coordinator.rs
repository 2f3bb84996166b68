//! FindCoordinator (v0-v4): this single node coordinates every group and transactional id.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::{BrokerState, NODE_ID};

/// Key type of a consumer group.
const KEY_TYPE_GROUP: i8 = 0;
/// Key type of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;

/// The error code for looking up `key` of `key_type` here (0 when this node coordinates it
/// and the principal may Describe the group or transactional id).
fn lookup_error(state: &BrokerState, ctx: &RequestContext, key_type: i8, key: &str) -> i16 {
    match key_type {
        KEY_TYPE_GROUP => {
            if ctx.authorized(state, AclOperation::Describe, ResourceType::Group, key) {
                0
            } else {
                ResponseError::GroupAuthorizationFailed.code()
            }
        }
        KEY_TYPE_TRANSACTION if !key.is_empty() => {
            if ctx.authorized(
                state,
                AclOperation::Describe,
                ResourceType::TransactionalId,
                key,
            ) {
                0
            } else {
                ResponseError::TransactionalIdAuthorizationFailed.code()
            }
        }
        _ => ResponseError::InvalidRequest.code(),
    }
}

/// Answers FindCoordinator.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let key_type = if ctx.version >= 1 {
        req.key_type
    } else {
        KEY_TYPE_GROUP
    };
    let host = StrBytes::from_string(ctx.session.listener.advertised_host.clone());
    let port = ctx.session.listener.advertised_port;
    if ctx.version >= 4 {
        let coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let error = lookup_error(state, ctx, key_type, key.as_str());
                tracing::debug!(key = %key.as_str(), key_type, error, "find coordinator");
                let found = error == 0;
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(if found { NODE_ID } else { -1 }))
                    .with_host(if found {
                        host.clone()
                    } else {
                        StrBytes::default()
                    })
                    .with_port(if found { port } else { -1 })
                    .with_error_code(error)
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let error = lookup_error(state, ctx, key_type, req.key.as_str());
    tracing::debug!(key = %req.key.as_str(), key_type, error, "find coordinator");
    if error != 0 {
        return FindCoordinatorResponse::default()
            .with_error_code(error)
            .with_node_id(BrokerId(-1))
            .with_port(-1);
    }
    FindCoordinatorResponse::default()
        .with_node_id(BrokerId(NODE_ID))
        .with_host(host)
        .with_port(port)
}
