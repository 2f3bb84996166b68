//! AddOffsetsToTxn (v0..=3): adds a consumer group's offsets to the producer's open
//! transaction, so its commit or abort marker also applies or drops the group's
//! transactional offsets (sent next with TxnOffsetCommit).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers AddOffsetsToTxn.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    // Write on the transactional id, then Read on the group.
    let denied = if !ctx.authorized(
        state,
        AclOperation::Write,
        ResourceType::TransactionalId,
        &req.transactional_id,
    ) {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !ctx.authorized(
        state,
        AclOperation::Read,
        ResourceType::Group,
        &req.group_id,
    ) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        None
    };
    if let Some(error) = denied {
        metrics::partition_error("AddOffsetsToTxn", error.code());
        return AddOffsetsToTxnResponse::default().with_error_code(error.code());
    }
    let txn_id = req.transactional_id.0.to_string();
    let group = req.group_id.0.to_string();
    let st = Arc::clone(state);
    let res = tokio::task::spawn_blocking(move || {
        st.txn
            .add_offsets(&txn_id, req.producer_id.0, req.producer_epoch, &group)
    })
    .await;
    let code = match res {
        Ok(Ok(Ok(()))) => 0,
        Ok(Ok(Err(code))) => code.code(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "AddOffsetsToTxn: transaction log write failed");
            ResponseError::KafkaStorageError.code()
        }
        Err(e) => {
            tracing::error!(error = %e, "AddOffsetsToTxn task failed");
            ResponseError::UnknownServerError.code()
        }
    };
    if code != 0 {
        metrics::partition_error("AddOffsetsToTxn", code);
    }
    AddOffsetsToTxnResponse::default().with_error_code(code)
}
