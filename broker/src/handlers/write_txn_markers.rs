//! WriteTxnMarkers (v1), the call Kafka's `Admin.abortTransaction` (KIP-664) sends to a
//! partition leader to abort a hanging transaction. Only ABORT results are accepted: a
//! COMMIT marker from outside the coordinator could make a transaction the coordinator
//! aborted visible, so it is refused with INVALID_REQUEST on every named partition. What an
//! abort does (fence and abort through the coordinator when it still runs the transaction,
//! else a marker on the partition) is described at
//! [`TxnManager::abort_by_admin`](crate::txn::TxnManager::abort_by_admin).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::write_txn_markers_request::WritableTxnMarker;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use super::RequestContext;
use crate::metrics;
use crate::security::AclOperation;
use crate::state::BrokerState;

/// Answers WriteTxnMarkers.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    // Inter-broker API: ClusterAction on the cluster.
    if !ctx.authorized_on_cluster(state, AclOperation::ClusterAction) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        let results = req
            .markers
            .iter()
            .map(|m| {
                WritableTxnMarkerResult::default()
                    .with_producer_id(m.producer_id)
                    .with_topics(
                        m.topics
                            .iter()
                            .map(|t| {
                                WritableTxnMarkerTopicResult::default()
                                    .with_name(t.name.clone())
                                    .with_partitions(
                                        t.partition_indexes
                                            .iter()
                                            .map(|&p| {
                                                WritableTxnMarkerPartitionResult::default()
                                                    .with_partition_index(p)
                                                    .with_error_code(code)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    )
            })
            .collect();
        return WriteTxnMarkersResponse::default().with_markers(results);
    }
    let mut results = Vec::with_capacity(req.markers.len());
    for marker in req.markers {
        results.push(write_one(state, marker).await);
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}

async fn write_one(state: &Arc<BrokerState>, marker: WritableTxnMarker) -> WritableTxnMarkerResult {
    let partitions: Vec<(String, i32)> = marker
        .topics
        .iter()
        .flat_map(|t| {
            t.partition_indexes
                .iter()
                .map(|&p| (t.name.0.as_str().to_string(), p))
        })
        .collect();
    let (pid, epoch, coordinator_epoch) = (
        marker.producer_id.0,
        marker.producer_epoch,
        marker.coordinator_epoch,
    );
    let codes: Vec<i16> = if marker.transaction_result {
        tracing::info!(
            producer_id = pid,
            "WriteTxnMarkers with a COMMIT result refused"
        );
        vec![ResponseError::InvalidRequest.code(); partitions.len()]
    } else {
        let txn = Arc::clone(&state.txn);
        let named = partitions.clone();
        let res = tokio::task::spawn_blocking(move || {
            txn.abort_by_admin(pid, epoch, coordinator_epoch, &named)
        })
        .await;
        match res {
            Ok(Ok(codes)) => codes,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "WriteTxnMarkers: transaction log write failed");
                vec![ResponseError::KafkaStorageError.code(); partitions.len()]
            }
            Err(e) => {
                tracing::error!(error = %e, "WriteTxnMarkers task failed");
                vec![ResponseError::UnknownServerError.code(); partitions.len()]
            }
        }
    };
    let mut codes = codes.into_iter();
    let topics = marker
        .topics
        .into_iter()
        .map(|t| {
            let results = t
                .partition_indexes
                .iter()
                .map(|&p| {
                    let code = codes
                        .next()
                        .unwrap_or(ResponseError::UnknownServerError.code());
                    if code != 0 {
                        metrics::partition_error("WriteTxnMarkers", code);
                    }
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(p)
                        .with_error_code(code)
                })
                .collect();
            WritableTxnMarkerTopicResult::default()
                .with_name(t.name)
                .with_partitions(results)
        })
        .collect();
    WritableTxnMarkerResult::default()
        .with_producer_id(marker.producer_id)
        .with_topics(topics)
}
