//! Kafka transactions for the reference broker: the transaction coordinator (state machine
//! and durable transaction log), the Produce-side guard, marker writing (the partition-level
//! open transactions, last stable offset and aborted-transaction index live in the storage),
//! recovery after a crash, timeouts and expiry. See `broker/docs/TRANSACTIONS.md`.

pub mod coordinator;
pub mod error;
pub mod log;
pub mod manager;
pub mod marker;
pub mod metrics;
pub mod produce_view;
pub mod state;

pub use coordinator::{
    AbortCause, Coordinator, CoordinatorConfig, CountingProducerIds, MarkerJob, ProducerIdSource,
};
pub use error::{Result, TxnError};
pub use manager::{now_ms, AppendNotifier, TxnConfig, TxnManager, TxnOffsetsSink, TxnProduceError};
pub use marker::MarkerKind;
pub use state::{TxnMetadata, TxnState};

impl ProducerIdSource for crate::producer_ids::ProducerIdAllocator {
    fn next_producer_id(&self) -> std::result::Result<i64, String> {
        self.allocate().map_err(|e| e.to_string())
    }
}

impl TxnOffsetsSink for crate::group::OffsetStore {
    fn complete_txn(
        &self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> std::result::Result<(), String> {
        crate::group::OffsetStore::complete_txn(self, group, producer_id, commit)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
