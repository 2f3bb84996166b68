//! InitProducerId: without a transactional id a fresh producer id with epoch 0, as Kafka does
//! for idempotent producers; a transactional id goes to the transaction coordinator (epoch
//! bump, abort of its open transaction, fencing of the previous producer).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers InitProducerId.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        metrics::partition_error("InitProducerId", error.code());
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    // transactional ids go to the transaction coordinator
    if let Some(txn_id) = req.transactional_id.as_ref().filter(|t| !t.0.is_empty()) {
        if !ctx.authorized(
            state,
            AclOperation::Write,
            ResourceType::TransactionalId,
            txn_id,
        ) {
            return refused(ResponseError::TransactionalIdAuthorizationFailed);
        }
        let txn_id = txn_id.0.to_string();
        let expected = (ctx.version >= 3 && req.producer_id.0 >= 0)
            .then_some((req.producer_id.0, req.producer_epoch));
        let timeout = req.transaction_timeout_ms;
        let st = Arc::clone(state);
        let res = tokio::task::spawn_blocking(move || {
            st.txn.init_producer_id(&txn_id, timeout, expected)
        })
        .await;
        return match res {
            Ok(Ok(Ok((pid, epoch)))) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch),
            Ok(Ok(Err(code))) => refused(code),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "InitProducerId: transaction log write failed");
                refused(ResponseError::KafkaStorageError)
            }
            Err(e) => {
                tracing::error!(error = %e, "InitProducerId task failed");
                refused(ResponseError::UnknownServerError)
            }
        };
    }
    // Idempotent producers: IdempotentWrite on the cluster or Write on some topic (Kafka 2.8+).
    if !ctx.authorized_on_cluster(state, AclOperation::IdempotentWrite)
        && !ctx.authorized_on_any(state, AclOperation::Write, ResourceType::Topic)
    {
        return refused(ResponseError::ClusterAuthorizationFailed);
    }
    let allocator = Arc::clone(state);
    let allocated = if state.is_durable() {
        tokio::task::spawn_blocking(move || allocator.producer_ids.allocate())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    } else {
        state.producer_ids.allocate().map_err(|e| e.to_string())
    };
    match allocated {
        Ok(id) => {
            tracing::debug!(producer_id = id, "allocated producer id");
            InitProducerIdResponse::default()
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(0)
        }
        Err(e) => {
            tracing::error!(error = %e, "allocating a producer id failed");
            refused(ResponseError::KafkaStorageError)
        }
    }
}
