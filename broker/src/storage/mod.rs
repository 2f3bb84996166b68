//! The broker's log storage: topics, partitions, append-only segments of RecordBatch v2 bytes,
//! idempotent-producer state and crash recovery. Synchronous and internally synchronized; it
//! knows nothing of the network. `broker/docs/STORAGE.md` describes the on-disk format.
//!
//! Layers, top to bottom: [`Store`] (topic registry, flusher) -> [`Partition`] (offsets,
//! producer checks, fsync policy) -> [`segment`] / [`index`] / [`snapshot`] (file formats) ->
//! the [`backend`] seam ([`FileBackend`] on disk, [`MemBackend`] in memory and for fault
//! injection). Everything above the seam is the same code in both modes.

pub mod backend;
pub mod batch;
pub mod cleaner;
pub mod config;
pub mod error;
pub mod index;
pub mod log_config;
pub mod memory;
pub mod metrics;
pub mod partition;
pub mod producer_state;
mod recovery;
pub mod segment;
pub mod snapshot;
pub mod topics;
pub mod txn_index;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

pub use backend::{BackendFile, FileBackend, StorageBackend};
pub use config::{FsyncPolicy, ParseFsyncPolicyError, StorageConfig};
pub use error::{AppendError, ReadError, Result, StorageError};
pub use log_config::{CleanupPolicy, LogConfig};
pub use memory::MemBackend;
pub use partition::{AppendOutcome, CommittedRead, Partition, PendingAppend};
pub use txn_index::AbortedTxn;

use partition::PartitionContext;

/// Most partitions a topic may have.
pub const MAX_PARTITIONS: i32 = 100_000;
/// Root path of the in-memory backend's tree.
const MEMORY_ROOT: &str = "/onceflow-memory";

#[derive(Debug)]
struct Inner {
    config: StorageConfig,
    root: PathBuf,
    backend: Arc<dyn StorageBackend>,
    topics: RwLock<BTreeMap<String, Vec<Arc<Partition>>>>,
}

/// The broker's store of topics. Cheap to clone (an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    /// Opens the store, recovering every topic found in `config.data_dir` (or starting empty
    /// in memory when it is `None`). With [`FsyncPolicy::Interval`] a background thread calls
    /// [`Store::sync_data`] at that interval until the last clone of the store is dropped.
    pub fn open(config: StorageConfig) -> Result<Store> {
        match config.data_dir.clone() {
            Some(dir) => Self::open_with_backend(config, Arc::new(FileBackend), &dir),
            None => {
                Self::open_with_backend(config, Arc::new(MemBackend::new()), Path::new(MEMORY_ROOT))
            }
        }
    }

    /// Opens the store on any backend, rooted at `root` (tests inject a [`MemBackend`] to
    /// fail or freeze fsyncs and reopen on its crash image). `config.data_dir` is ignored.
    pub fn open_with_backend(
        config: StorageConfig,
        backend: Arc<dyn StorageBackend>,
        root: &Path,
    ) -> Result<Store> {
        metrics::describe();
        cleaner::describe();
        let segment_bytes = config.segment_bytes.max(batch::HEADER_LEN as u64);
        let config = StorageConfig {
            segment_bytes,
            ..config
        };
        backend
            .create_dir_all(root)
            .map_err(|e| StorageError::io(root, e))?;
        let inner = Arc::new(Inner {
            config,
            root: root.to_path_buf(),
            backend,
            topics: RwLock::new(BTreeMap::new()),
        });
        inner.load_topics()?;
        if let FsyncPolicy::Interval(every) = inner.config.fsync {
            spawn_flusher(Arc::downgrade(&inner), every)?;
        }
        if let Some(every) = inner.config.cleaner_interval {
            cleaner::spawn(Arc::downgrade(&inner), every)?;
        }
        Ok(Store { inner })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StorageConfig {
        &self.inner.config
    }

    /// Creates a topic with `partitions` partitions and the broker's default log settings;
    /// the topic is durable when this returns.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        self.create_topic_with_config(name, partitions, self.default_log_config())
    }

    /// The log settings of a topic created without configs.
    pub fn default_log_config(&self) -> LogConfig {
        self.inner.context().log_config
    }

    /// Creates a topic whose partitions start with `log_config` (not persisted: after a
    /// restart the partitions start with the broker's defaults).
    pub fn create_topic_with_config(
        &self,
        name: &str,
        partitions: i32,
        log_config: LogConfig,
    ) -> Result<()> {
        topics::validate_topic_name(name)?;
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(StorageError::InvalidTopic(format!(
                "{name}: partition count {partitions} outside 1..={MAX_PARTITIONS}"
            )));
        }
        let inner = &self.inner;
        let mut t = inner.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(name) {
            return Err(StorageError::TopicExists(name.to_string()));
        }
        let created = (|| {
            let mut parts = Vec::with_capacity(partitions as usize);
            for i in 0..partitions {
                let dir = inner.partition_dir(name, i);
                // A directory left by an interrupted delete must not leak old data.
                inner
                    .backend
                    .remove_dir_all(&dir)
                    .map_err(|e| StorageError::io(&dir, e))?;
                let ctx = PartitionContext {
                    log_config: log_config.clone(),
                    ..inner.context()
                };
                parts.push(Arc::new(Partition::open(ctx, name, i, dir)?));
            }
            inner
                .backend
                .sync_dir(&inner.root)
                .map_err(|e| StorageError::io(&inner.root, e))?;
            let mut listed: Vec<(&str, i32)> = t
                .iter()
                .map(|(n, p)| (n.as_str(), p.len() as i32))
                .collect();
            listed.push((name, partitions));
            inner.write_registry(listed)?;
            Ok(parts)
        })();
        match created {
            Ok(parts) => {
                tracing::info!(topic = name, partitions, "created topic");
                t.insert(name.to_string(), parts);
                Ok(())
            }
            Err(e) => {
                for i in 0..partitions {
                    let _ = inner.backend.remove_dir_all(&inner.partition_dir(name, i));
                }
                Err(e)
            }
        }
    }

    /// Deletes a topic and removes its files.
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        let inner = &self.inner;
        let mut t = inner.topics.write().unwrap_or_else(|p| p.into_inner());
        if !t.contains_key(name) {
            return Err(StorageError::UnknownTopic(name.to_string()));
        }
        inner.write_registry(
            t.iter()
                .filter(|(n, _)| n.as_str() != name)
                .map(|(n, p)| (n.as_str(), p.len() as i32)),
        )?;
        let parts = t.remove(name).unwrap_or_default();
        for p in parts {
            p.mark_deleted();
            if let Err(e) = inner.backend.remove_dir_all(p.dir()) {
                tracing::warn!(dir = %p.dir().display(), error = %e, "could not remove partition directory; it is removed at next open");
            }
        }
        tracing::info!(topic = name, "deleted topic");
        Ok(())
    }

    /// Applies `config` to every partition of `topic` (not persisted).
    pub fn set_topic_log_config(&self, topic: &str, config: LogConfig) -> Result<()> {
        let t = self.inner.topics.read().unwrap_or_else(|p| p.into_inner());
        let parts = t
            .get(topic)
            .ok_or_else(|| StorageError::UnknownTopic(topic.to_string()))?;
        for p in parts {
            p.set_log_config(config.clone());
        }
        Ok(())
    }

    /// Runs one log-cleaner pass over a partition now, whatever its dirty ratio and cleanup
    /// policy (tests and benchmarks; the background cleaner schedules passes itself). `None`
    /// if the partition has no cleanable segment.
    pub fn clean_now(&self, topic: &str, partition: i32) -> Result<Option<cleaner::CleanReport>> {
        let p = self
            .partition(topic, partition)
            .ok_or_else(|| StorageError::UnknownTopic(topic.to_string()))?;
        cleaner::clean_partition(&p, cleaner::pass::now_ms())
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

    /// Forces everything to stable storage and writes producer-state snapshots: call it at
    /// shutdown (and whenever a full checkpoint is wanted).
    pub fn flush_all(&self) -> Result<()> {
        self.inner.flush(true)
    }

    /// fsyncs unsynced log data and index entries of every partition, without snapshots.
    /// The interval flusher calls this; a server timer may call it instead.
    pub fn sync_data(&self) -> Result<()> {
        self.inner.flush(false)
    }
}

impl Inner {
    fn context(&self) -> PartitionContext {
        PartitionContext {
            backend: Arc::clone(&self.backend),
            fsync: self.config.fsync,
            repair_corrupt_logs: self.config.repair_corrupt_logs,
            log_config: LogConfig::with_segment_bytes(self.config.segment_bytes),
        }
    }

    fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.root.join(topics::partition_dir_name(topic, partition))
    }

    fn write_registry<'a>(&self, topics: impl IntoIterator<Item = (&'a str, i32)>) -> Result<()> {
        let path = self.root.join(topics::REGISTRY_FILE);
        self.backend
            .write_file_atomic(&path, &topics::encode_registry(topics))
            .map_err(|e| StorageError::io(&path, e))
    }

    fn flush(&self, snapshot: bool) -> Result<()> {
        let parts: Vec<Arc<Partition>> = {
            let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
            t.values().flatten().cloned().collect()
        };
        let mut first_err = None;
        for p in parts {
            if let Err(e) = p.flush(snapshot) {
                tracing::warn!(topic = p.topic(), partition = p.index(), error = %e, "flush failed");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Reads the registry (rebuilding it from the directories if it is damaged), recovers
    /// every partition and removes directories of topics that are not registered.
    fn load_topics(&self) -> Result<()> {
        let path = self.root.join(topics::REGISTRY_FILE);
        let listing = self
            .backend
            .list(&self.root)
            .map_err(|e| StorageError::io(&self.root, e))?;
        let on_disk: Vec<(String, i32)> = listing
            .iter()
            .filter(|e| e.is_dir)
            .filter_map(|e| topics::parse_partition_dir(&e.name).map(|(t, p)| (t.to_string(), p)))
            .collect();
        let stored = self
            .backend
            .read_file(&path)
            .map_err(|e| StorageError::io(&path, e))?;
        let (registered, trusted) = match stored
            .map(|b| topics::decode_registry(&b, MAX_PARTITIONS))
        {
            Some(Ok(list)) => (list, true),
            None if on_disk.is_empty() => (Vec::new(), true),
            other => {
                let reason = match other {
                    Some(Err(reason)) => reason,
                    _ => "missing".to_string(),
                };
                tracing::warn!(file = %path.display(), %reason, "topic registry not trusted; rebuilding it from partition directories");
                let mut counts: BTreeMap<String, i32> = BTreeMap::new();
                for (t, p) in &on_disk {
                    if *p < MAX_PARTITIONS {
                        let c = counts.entry(t.clone()).or_insert(0);
                        *c = (*c).max(p + 1);
                    }
                }
                (counts.into_iter().collect(), false)
            }
        };
        let mut expected = BTreeSet::new();
        let mut map = BTreeMap::new();
        for (name, n) in &registered {
            let mut parts = Vec::with_capacity(*n as usize);
            for i in 0..*n {
                let dir = self.partition_dir(name, i);
                expected.insert(topics::partition_dir_name(name, i));
                parts.push(Arc::new(Partition::open(self.context(), name, i, dir)?));
            }
            map.insert(name.clone(), parts);
        }
        if trusted {
            for e in listing
                .iter()
                .filter(|e| e.is_dir && !expected.contains(&e.name))
            {
                if topics::parse_partition_dir(&e.name).is_some() {
                    let dir = self.root.join(&e.name);
                    tracing::warn!(dir = %dir.display(), "removing partition directory of an unregistered topic");
                    self.backend
                        .remove_dir_all(&dir)
                        .map_err(|e| StorageError::io(&dir, e))?;
                }
            }
        } else {
            self.write_registry(registered.iter().map(|(n, c)| (n.as_str(), *c)))?;
        }
        let count = map.len();
        *self.topics.write().unwrap_or_else(|p| p.into_inner()) = map;
        tracing::info!(root = %self.root.display(), topics = count, "storage opened");
        Ok(())
    }
}

fn spawn_flusher(inner: Weak<Inner>, every: Duration) -> Result<()> {
    std::thread::Builder::new()
        .name("onceflow-log-flush".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(inner) = inner.upgrade() else {
                break;
            };
            if let Err(e) = inner.flush(false) {
                tracing::warn!(error = %e, "interval flush failed");
            }
        })
        .map(|_| ())
        .map_err(|e| StorageError::io("onceflow-log-flush thread", e))
}
