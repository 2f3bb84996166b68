//! DescribeTransactions (v0, KIP-664): for each transactional id, the coordinator's state,
//! transaction timeout, start time of the open transaction (-1 if none), producer id and
//! epoch, and the topic-partitions in the transaction. An unknown (or expired) id gets
//! TRANSACTIONAL_ID_NOT_FOUND. As in Kafka's `KafkaApis`, the topics the principal may not
//! Describe are left out of a described transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::txn::{TxnMetadata, TxnState};

/// Answers DescribeTransactions.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let states = req
        .transactional_ids
        .into_iter()
        .map(|id| {
            if !ctx.authorized(
                state,
                AclOperation::Describe,
                ResourceType::TransactionalId,
                id.0.as_str(),
            ) {
                let code = ResponseError::TransactionalIdAuthorizationFailed.code();
                metrics::partition_error("DescribeTransactions", code);
                return TransactionState::default()
                    .with_transactional_id(id)
                    .with_error_code(code)
                    .with_transaction_state(StrBytes::from_static_str(""))
                    .with_transaction_start_time_ms(-1)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1);
            }
            let found = state
                .txn
                .describe(id.0.as_str())
                .filter(|m| m.state != TxnState::Dead);
            let base = TransactionState::default().with_transactional_id(id);
            match found {
                Some(m) => describe(base, &m, |topic| {
                    ctx.authorized(state, AclOperation::Describe, ResourceType::Topic, topic)
                }),
                None => {
                    let code = ResponseError::TransactionalIdNotFound.code();
                    metrics::partition_error("DescribeTransactions", code);
                    base.with_error_code(code)
                        .with_transaction_state(StrBytes::from_static_str(""))
                        .with_transaction_start_time_ms(-1)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1)
                }
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

fn describe(
    base: TransactionState,
    m: &TxnMetadata,
    may_describe: impl Fn(&str) -> bool,
) -> TransactionState {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in &m.partitions {
        by_topic.entry(topic).or_default().push(*partition);
    }
    by_topic.retain(|topic, _| may_describe(topic));
    let topics = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            TopicData::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(partitions)
        })
        .collect();
    base.with_transaction_state(StrBytes::from_static_str(m.state.name()))
        .with_transaction_timeout_ms(m.timeout_ms)
        .with_transaction_start_time_ms(m.txn_start_ms)
        .with_producer_id(ProducerId(m.producer_id))
        .with_producer_epoch(m.producer_epoch)
        .with_topics(topics)
}
