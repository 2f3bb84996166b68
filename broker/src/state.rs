//! Shared broker state handed to every handler as `&Arc<BrokerState>`.

use std::sync::Arc;

use tokio::sync::{watch, Notify};

use crate::config::BrokerConfig;
use crate::producer_ids::ProducerIdAllocator;
use crate::storage::{Partition, StorageError, Store};

/// The node id of this single broker; it leads every partition and is the controller.
pub const NODE_ID: i32 = 0;

/// The cluster id returned by Metadata.
pub const CLUSTER_ID: &str = "onceflow-reference-broker";

/// Upper bound on a topic's partition count (CreateTopics and auto-creation), so one request
/// cannot make the broker create millions of files.
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 10_000;

/// State shared by all connections.
pub struct BrokerState {
    /// The configuration the broker was started with.
    pub config: BrokerConfig,
    /// The partition logs.
    pub store: Store,
    /// Host that the first listener advertises (a connection's Metadata answers with its own
    /// listener's endpoint).
    pub advertised_host: String,
    /// Port that Metadata advertises.
    pub advertised_port: i32,
    /// Woken (`notify_waiters`) after every successful append, for long-polling fetches.
    pub appended: Notify,
    /// Producer ids for InitProducerId, never reused across restarts (shared with the
    /// transaction coordinator: `Arc` added by the broker-txn helper).
    pub producer_ids: Arc<ProducerIdAllocator>,
    /// The transaction coordinator and the partitions' transaction layer.
    pub txn: Arc<crate::txn::TxnManager>,
    /// The consumer group coordinator and group offsets store.
    pub groups: Arc<crate::group::GroupCoordinator>,
    /// TLS configuration, SASL users and the authorizer.
    pub security: Arc<crate::security::Security>,
    /// Flips to true when the broker shuts down.
    pub shutdown: watch::Receiver<bool>,
}

/// The outcome of looking up (and maybe auto-creating) a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicLookup {
    /// The topic exists with this many partitions.
    Exists(i32),
    /// The topic does not exist and was not created.
    Missing,
    /// The name is not a legal topic name.
    InvalidName,
}

impl BrokerState {
    /// Whether the log lives on disk (calls that may fsync then run on the blocking pool).
    pub fn is_durable(&self) -> bool {
        self.config.storage.data_dir.is_some()
    }

    /// Partition count of `topic`, if it exists.
    pub fn partition_count(&self, topic: &str) -> Option<i32> {
        // The store keeps a sorted list; partition 0 existing means the topic exists.
        self.store.partition(topic, 0)?;
        self.store
            .topics()
            .into_iter()
            .find(|(name, _)| name == topic)
            .map(|(_, count)| count)
    }

    /// Looks a topic up and creates it with the default partition count when `auto_create`
    /// is asked for and enabled in the configuration.
    pub fn lookup_or_create(&self, topic: &str, auto_create: bool) -> TopicLookup {
        if let Some(count) = self.partition_count(topic) {
            return TopicLookup::Exists(count);
        }
        if !(auto_create && self.config.auto_create_topics) {
            return TopicLookup::Missing;
        }
        let partitions = self.config.default_partitions;
        match self.store.create_topic(topic, partitions) {
            Ok(()) => {
                tracing::info!(topic, partitions, "auto-created topic");
                TopicLookup::Exists(partitions)
            }
            Err(StorageError::TopicExists(_)) => self
                .partition_count(topic)
                .map_or(TopicLookup::Missing, TopicLookup::Exists),
            Err(StorageError::InvalidTopic(_)) => TopicLookup::InvalidName,
            Err(e) => {
                tracing::error!(topic, error = %e, "auto-creating topic failed");
                TopicLookup::Missing
            }
        }
    }

    /// The partition, if its topic and index exist.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        self.store.partition(topic, partition)
    }
}

/// Resolves once shutdown is signalled; never resolves if the broker handle was dropped
/// without a shutdown (the broker then runs until its runtime ends).
pub async fn shutdown_signalled(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
