//! DescribeProducers (v0, KIP-664): per partition, the producers the partition's log knows
//! (idempotent and transactional): producer id, epoch, last sequence, last timestamp,
//! coordinator epoch of their last marker, and the first offset of their open transaction
//! (-1 if none). The answer comes from the partition's producer state, the same state that
//! the duplicate and fencing checks and the last stable offset use.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::storage::producer_state::ProducerEntry;

/// Answers DescribeProducers.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.as_str();
            let denied = !ctx.authorized(state, AclOperation::Read, ResourceType::Topic, name);
            let partitions = topic
                .partition_indexes
                .iter()
                .map(|&index| {
                    if denied {
                        PartitionResponse::default()
                            .with_partition_index(index)
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    } else {
                        describe_partition(state, name, index)
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}

fn describe_partition(state: &BrokerState, topic: &str, index: i32) -> PartitionResponse {
    let response = PartitionResponse::default().with_partition_index(index);
    let Some(partition) = state.partition(topic, index) else {
        let code = ResponseError::UnknownTopicOrPartition.code();
        metrics::partition_error("DescribeProducers", code);
        return response
            .with_error_code(code)
            .with_error_message(Some(StrBytes::from_string(format!(
                "{topic}-{index} does not exist"
            ))));
    };
    let producers = partition
        .producer_states()
        .into_iter()
        .map(|(pid, e)| producer(pid, &e))
        .collect();
    response.with_active_producers(producers)
}

/// The wire form of one producer's state on a partition.
pub fn producer(producer_id: i64, e: &ProducerEntry) -> ProducerState {
    ProducerState::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(i32::from(e.epoch))
        .with_last_sequence(e.batches.back().map_or(-1, |b| b.last_seq))
        .with_last_timestamp(e.last_timestamp)
        .with_coordinator_epoch(e.coordinator_epoch)
        .with_current_txn_start_offset(e.txn_first_offset.unwrap_or(-1))
}
