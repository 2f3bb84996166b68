//! EndTxn (v0..=3): commits or aborts the producer's transaction. Accepted from any
//! connection presenting the right transactional id, producer id and epoch (a restarted
//! job resumes its prepared transaction this way); a retry after completion answers success.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse};

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers EndTxn.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: EndTxnRequest,
) -> EndTxnResponse {
    if !ctx.authorized(
        state,
        AclOperation::Write,
        ResourceType::TransactionalId,
        &req.transactional_id,
    ) {
        let code = ResponseError::TransactionalIdAuthorizationFailed.code();
        metrics::partition_error("EndTxn", code);
        return EndTxnResponse::default().with_error_code(code);
    }
    let txn_id = req.transactional_id.0.to_string();
    let st = Arc::clone(state);
    let (pid, epoch, commit) = (req.producer_id.0, req.producer_epoch, req.committed);
    let res =
        tokio::task::spawn_blocking(move || st.txn.end_txn(&txn_id, pid, epoch, commit)).await;
    let code = match res {
        Ok(Ok(Ok(()))) => 0,
        Ok(Ok(Err(code))) => code.code(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "EndTxn: transaction log write failed");
            ResponseError::KafkaStorageError.code()
        }
        Err(e) => {
            tracing::error!(error = %e, "EndTxn task failed");
            ResponseError::UnknownServerError.code()
        }
    };
    if code != 0 {
        metrics::partition_error("EndTxn", code);
    }
    tracing::debug!(transactional_id = %req.transactional_id.0.as_str(), commit, code, "EndTxn");
    EndTxnResponse::default().with_error_code(code)
}
