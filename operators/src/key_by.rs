//! `key_by`: partitions a stream by key (key groups), enabling keyed state.

use std::sync::Arc;

use onceflow_runtime::keygroup::{key_group_for, KeyGroupRange};
use onceflow_runtime::state::KeyedStateStore;
use onceflow_runtime::{Data, DataStream, Key, Partitioning, SubtaskInfo};

/// Extracts the key of a record.
pub type KeyFn<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

/// A stream partitioned by key: records with the same key reach the same subtask.
pub struct KeyedStream<K, T> {
    pub(crate) stream: DataStream<T>,
    pub(crate) key_fn: KeyFn<T, K>,
}

impl<K, T> Clone for KeyedStream<K, T> {
    fn clone(&self) -> Self {
        KeyedStream {
            stream: self.stream.clone(),
            key_fn: self.key_fn.clone(),
        }
    }
}

/// Keys a stream.
pub trait KeyBy<T> {
    /// Partitions by `key(record)`.
    fn key_by<K: Key, F: Fn(&T) -> K + Send + Sync + 'static>(&self, key: F) -> KeyedStream<K, T>;
}

impl<T: Data> KeyBy<T> for DataStream<T> {
    fn key_by<K: Key, F: Fn(&T) -> K + Send + Sync + 'static>(&self, key: F) -> KeyedStream<K, T> {
        KeyedStream {
            stream: self.clone(),
            key_fn: Arc::new(key),
        }
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// The underlying (not yet partitioned) stream.
    pub fn stream(&self) -> &DataStream<T> {
        &self.stream
    }

    /// The key extractor.
    pub fn key_fn(&self) -> KeyFn<T, K> {
        self.key_fn.clone()
    }

    /// Partitioning by key group.
    pub fn partitioning(&self) -> Partitioning<T> {
        key_partitioning(self.key_fn.clone(), self.stream.max_parallelism())
    }
}

pub(crate) fn key_partitioning<K: Key, T: Data>(
    key_fn: KeyFn<T, K>,
    max: usize,
) -> Partitioning<T> {
    Partitioning::KeyGroups(Arc::new(move |t: &T| key_group_for(&key_fn(t), max)))
}

/// An empty keyed state store for the subtask's key-group range.
pub(crate) fn store_for<K: Key>(info: &SubtaskInfo) -> KeyedStateStore<K> {
    KeyedStateStore::new(
        info.max_parallelism,
        KeyGroupRange::for_subtask(info.max_parallelism, info.parallelism, info.index),
    )
    .owned_by(&info.operator, info.index)
}
