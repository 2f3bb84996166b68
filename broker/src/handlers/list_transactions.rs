//! ListTransactions (v0..=1, KIP-664): the transaction coordinator's transactional ids with
//! their producer id and state, filtered by state names (unknown names are echoed back in
//! `unknown_state_filters`), by producer ids and (v1) by `duration_filter`: only transactions
//! running longer than that many milliseconds. v2's transactional-id regex is not advertised.

use std::sync::Arc;

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::{AclOperation, ResourceType};
use crate::state::BrokerState;
use crate::txn::{now_ms, TxnMetadata, TxnState};

/// Every state a filter may name, as Kafka spells them.
const STATES: [TxnState; 8] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
    TxnState::PrepareEpochFence,
    TxnState::Dead,
];

/// Answers ListTransactions.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut wanted = Vec::new();
    let mut unknown = Vec::new();
    for name in &req.state_filters {
        match STATES.iter().find(|s| s.name() == name.as_str()) {
            Some(s) => wanted.push(*s),
            None => unknown.push(name.clone()),
        }
    }
    let duration = if ctx.version >= 1 {
        req.duration_filter
    } else {
        -1
    };
    let filter = Filter {
        states: wanted,
        // Only known state names count; a filter of unknown names alone matches nothing.
        states_given: !req.state_filters.is_empty(),
        producer_ids: req.producer_id_filters.iter().map(|p| p.0).collect(),
        duration_ms: duration,
        now_ms: now_ms(),
    };
    let listed = state
        .txn
        .list()
        .into_iter()
        .filter(|m| filter.matches(m))
        // Only transactional ids the principal may describe are listed.
        .filter(|m| {
            ctx.authorized(
                state,
                AclOperation::Describe,
                ResourceType::TransactionalId,
                &m.transactional_id,
            )
        })
        .map(|m| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(m.transactional_id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(StrBytes::from_static_str(m.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}

/// The request's filters; an empty list filters nothing.
struct Filter {
    states: Vec<TxnState>,
    states_given: bool,
    producer_ids: Vec<i64>,
    duration_ms: i64,
    now_ms: i64,
}

impl Filter {
    fn matches(&self, m: &TxnMetadata) -> bool {
        if m.state == TxnState::Dead {
            return false;
        }
        if self.states_given && !self.states.contains(&m.state) {
            return false;
        }
        if !self.producer_ids.is_empty() && !self.producer_ids.contains(&m.producer_id) {
            return false;
        }
        if self.duration_ms >= 0 {
            // Only a running transaction has a duration.
            let running = m.txn_start_ms >= 0 && m.state != TxnState::Empty;
            if !running || self.now_ms.saturating_sub(m.txn_start_ms) <= self.duration_ms {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(id: &str, pid: i64, state: TxnState, start: i64) -> TxnMetadata {
        let mut m = TxnMetadata::new(id, pid, 60_000, 0);
        m.state = state;
        m.txn_start_ms = start;
        m
    }

    #[test]
    fn filters_combine() {
        let open = txn("a", 1, TxnState::Ongoing, 1_000);
        let done = txn("b", 2, TxnState::CompleteCommit, -1);
        let all = Filter {
            states: vec![],
            states_given: false,
            producer_ids: vec![],
            duration_ms: -1,
            now_ms: 10_000,
        };
        assert!(all.matches(&open) && all.matches(&done));
        let ongoing = Filter {
            states: vec![TxnState::Ongoing],
            states_given: true,
            ..all
        };
        assert!(ongoing.matches(&open) && !ongoing.matches(&done));
        let by_pid = Filter {
            states: vec![],
            states_given: false,
            producer_ids: vec![2],
            duration_ms: -1,
            now_ms: 10_000,
        };
        assert!(!by_pid.matches(&open) && by_pid.matches(&done));
        let long = |d| Filter {
            states: vec![],
            states_given: false,
            producer_ids: vec![],
            duration_ms: d,
            now_ms: 10_000,
        };
        assert!(long(8_999).matches(&open));
        assert!(!long(9_000).matches(&open));
        assert!(!long(0).matches(&done));
        let unknown_only = Filter {
            states: vec![],
            states_given: true,
            producer_ids: vec![],
            duration_ms: -1,
            now_ms: 10_000,
        };
        assert!(!unknown_only.matches(&open));
    }
}
