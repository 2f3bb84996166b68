//! InitProducerId without a transactional id: a fresh producer id with epoch 0, as Kafka does
//! for idempotent producers. Transactional ids are refused until the transaction coordinator
//! exists (issue 3).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::RequestContext;
use crate::metrics;
use crate::state::BrokerState;

/// Answers InitProducerId.
pub async fn handle(
    state: &Arc<BrokerState>,
    _ctx: &RequestContext,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        metrics::partition_error("InitProducerId", error.code());
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if req
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        tracing::info!(
            "InitProducerId with a transactional id: transactions are not implemented yet"
        );
        return refused(ResponseError::TransactionalIdAuthorizationFailed);
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
