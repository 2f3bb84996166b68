//! `key_by`: partitions a stream by key (key groups), enabling keyed state.

use std::sync::Arc;

use onceflow_runtime::keygroup::{key_group_for, KeyGroupRange};
use onceflow_runtime::state::KeyedStateStore;
use onceflow_runtime::{Data, DataStream, Key, KeyRoute, Operator, Partitioning, SubtaskInfo};

/// Extracts the key of a record.
pub type KeyFn<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

/// A stream partitioned by key: records with the same key reach the same subtask.
pub struct KeyedStream<K, T> {
    pub(crate) stream: DataStream<T>,
    pub(crate) key_fn: KeyFn<T, K>,
    /// How the keyed operators of this stream route a key to a task outside the process.
    route: Option<KeyRoute>,
}

impl<K, T> Clone for KeyedStream<K, T> {
    fn clone(&self) -> Self {
        KeyedStream {
            stream: self.stream.clone(),
            key_fn: self.key_fn.clone(),
            route: self.route.clone(),
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
            route: None,
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

    /// Declares the bytes that route a key to its task when the job's keyed state is spread
    /// over many processes (`route(key)`, e.g. the key's Kafka key bytes): every keyed
    /// operator built on this stream carries it as its [`KeyRoute`].
    pub fn routed_by(
        mut self,
        route: impl Fn(&K) -> Vec<u8> + Send + Sync + 'static,
    ) -> KeyedStream<K, T> {
        self.route = Some(Arc::new(move |encoded: &[u8]| {
            let key: K = onceflow_runtime::state::format::decode(encoded)?;
            Ok(route(&key))
        }));
        self
    }

    /// The key route declared with [`KeyedStream::routed_by`], if any.
    pub fn route(&self) -> Option<KeyRoute> {
        self.route.clone()
    }

    /// Adds a keyed operator reading this stream by key group, with the stream's key route.
    pub(crate) fn add_keyed_operator<Out: Data, Op: Operator<T, Out>>(
        &self,
        name: &str,
        factory: impl Fn(&SubtaskInfo) -> onceflow_runtime::Result<Op> + Send + Sync + 'static,
    ) -> DataStream<Out> {
        let out = self.stream.add_operator(name, self.partitioning(), factory);
        if let Some(route) = &self.route {
            out.set_key_route(route.clone());
        }
        out
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
