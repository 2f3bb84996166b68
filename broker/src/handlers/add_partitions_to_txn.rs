//! AddPartitionsToTxn (v0..=3): adds partitions to the producer's open transaction (opening
//! it if needed), persisted in the transaction log before the answer.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;

/// Answers AddPartitionsToTxn.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let txn_id = req.v3_and_below_transactional_id.0.to_string();
    let producer_id = req.v3_and_below_producer_id.0;
    let epoch = req.v3_and_below_producer_epoch;
    // Write on the transactional id (every partition refused), then Write on each topic
    // (denied topics refused, the others not attempted).
    let txn_denied = !ctx.authorized(
        state,
        AclOperation::Write,
        ResourceType::TransactionalId,
        &req.v3_and_below_transactional_id,
    );
    let denied_topics: Vec<&str> = if txn_denied {
        Vec::new()
    } else {
        req.v3_and_below_topics
            .iter()
            .map(|t| t.name.0.as_str())
            .filter(|t| !ctx.authorized(state, AclOperation::Write, ResourceType::Topic, t))
            .collect()
    };
    if txn_denied || !denied_topics.is_empty() {
        let code_of = |topic: &str| {
            if txn_denied {
                ResponseError::TransactionalIdAuthorizationFailed.code()
            } else if denied_topics.contains(&topic) {
                ResponseError::TopicAuthorizationFailed.code()
            } else {
                ResponseError::OperationNotAttempted.code()
            }
        };
        let results = results(&req, |topic, _| code_of(topic));
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results);
    }
    let mut requested = Vec::new();
    let mut unknown = false;
    for t in &req.v3_and_below_topics {
        for &p in &t.partitions {
            if state.partition(t.name.0.as_str(), p).is_none() {
                unknown = true;
            }
            requested.push((t.name.0.to_string(), p));
        }
    }
    // Kafka answers every partition with the same code; unknown partitions fail the request
    // and the others get OPERATION_NOT_ATTEMPTED.
    let code_for = |topic: &str, p: i32, overall: Option<ResponseError>| -> i16 {
        if unknown {
            if state.partition(topic, p).is_none() {
                ResponseError::UnknownTopicOrPartition.code()
            } else {
                ResponseError::OperationNotAttempted.code()
            }
        } else {
            overall.map_or(0, |e| e.code())
        }
    };
    let overall = if unknown {
        None
    } else {
        let st = Arc::clone(state);
        let parts = requested.clone();
        let res = tokio::task::spawn_blocking(move || {
            st.txn.add_partitions(&txn_id, producer_id, epoch, &parts)
        })
        .await;
        match res {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(code))) => Some(code),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "AddPartitionsToTxn: transaction log write failed");
                Some(ResponseError::KafkaStorageError)
            }
            Err(e) => {
                tracing::error!(error = %e, "AddPartitionsToTxn task failed");
                Some(ResponseError::UnknownServerError)
            }
        }
    };
    if let Some(code) = overall {
        metrics::partition_error("AddPartitionsToTxn", code.code());
    }
    let results = results(&req, |topic, p| code_for(topic, p, overall));
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// One result per requested partition, with the error code `code(topic, partition)`.
fn results(
    req: &AddPartitionsToTxnRequest,
    code: impl Fn(&str, i32) -> i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    req.v3_and_below_topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(code(t.name.0.as_str(), p))
                        })
                        .collect(),
                )
        })
        .collect()
}
