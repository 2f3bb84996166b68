//! The broker's log storage: topics, partitions, append-only segments of RecordBatch v2 bytes,
//! idempotent-producer state and crash recovery. Synchronous and internally synchronized; it
//! knows nothing of the network. `broker/docs/STORAGE.md` describes the on-disk format.
//!
//! Layers, top to bottom: [`Store`] (topic registry, flusher) -> [`Partition`] (offsets,
//! producer checks, fsync policy) -> [`segment`] / [`index`] / [`snapshot`] (file formats) ->
//! the [`backend`] seam ([`FileBackend`] on disk, [`MemBackend`] in memory and for fault
//! injection). Everything above the seam is the same code in both modes.

mod add_partitions;
pub mod backend;
pub mod batch;
pub mod cleaner;
pub mod config;
pub mod error;
pub mod index;
pub mod log_config;
pub mod log_start;
pub mod memory;
pub mod metrics;
pub mod partition;
pub mod producer_state;
mod recovery;
pub mod segment;
pub mod snapshot;
pub mod topic_config_file;
pub mod topics;
pub mod txn_index;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use backend::{BackendFile, FileBackend, StorageBackend};
pub use config::{FsyncPolicy, ParseFsyncPolicyError, StorageConfig};
pub use error::{AppendError, ReadError, Result, StorageError};
pub use log_config::{CleanupPolicy, LogConfig};
pub use memory::MemBackend;
pub use partition::{
    AppendOutcome, CommittedRead, DeleteRecordsError, Partition, PendingAppend, RetentionOutcome,
};
pub use topic_config_file::TopicConfigs;
pub use txn_index::AbortedTxn;

use partition::{PartitionContext, RetentionDue};

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
    /// The configs each topic was created with or given later, as set (persisted in
    /// `topics.configs`; changed only while holding the `topics` write lock).
    configs: Mutex<TopicConfigs>,
    /// Appends only touch memory: the broker's own in-memory store (`Store::open` without a
    /// data directory), whose backend neither waits on a device nor has faults injected.
    appends_in_memory: bool,
    /// Partitions a roll took past `retention.bytes`, for the retention thread (present when
    /// the store runs one).
    retention_due: Option<Arc<RetentionDue>>,
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
            None => Self::open_inner(
                config,
                Arc::new(MemBackend::new()),
                Path::new(MEMORY_ROOT),
                true,
            ),
        }
    }

    /// Whether an append to this store only touches memory and never waits on a device or
    /// an injected fault, so a produce request may append on the connection's own task
    /// instead of the blocking pool (one thread hop less per request).
    pub fn appends_in_memory(&self) -> bool {
        self.inner.appends_in_memory
    }

    /// Opens the store on any backend, rooted at `root` (tests inject a [`MemBackend`] to
    /// fail or freeze fsyncs and reopen on its crash image). `config.data_dir` is ignored.
    pub fn open_with_backend(
        config: StorageConfig,
        backend: Arc<dyn StorageBackend>,
        root: &Path,
    ) -> Result<Store> {
        Self::open_inner(config, backend, root, false)
    }

    fn open_inner(
        config: StorageConfig,
        backend: Arc<dyn StorageBackend>,
        root: &Path,
        appends_in_memory: bool,
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
        let retention_due = config
            .retention_check_interval
            .map(|_| Arc::new(RetentionDue::default()));
        let inner = Arc::new(Inner {
            config,
            root: root.to_path_buf(),
            backend,
            topics: RwLock::new(BTreeMap::new()),
            configs: Mutex::new(TopicConfigs::new()),
            appends_in_memory,
            retention_due,
        });
        inner.load_topics()?;
        if let FsyncPolicy::Interval(every) = inner.config.fsync {
            spawn_flusher(Arc::downgrade(&inner), every)?;
        }
        if let (Some(every), Some(due)) = (
            inner.config.retention_check_interval,
            inner.retention_due.clone(),
        ) {
            spawn_retention(Arc::downgrade(&inner), due, every)?;
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

    /// The log settings of a topic created without configs (the broker-wide defaults).
    pub fn default_log_config(&self) -> LogConfig {
        self.inner.context().log_config
    }

    /// The log settings of a topic with the configs `configs` (name -> value, already
    /// validated): the broker's defaults with each config that changes the log applied.
    pub fn resolve_log_config(&self, configs: &BTreeMap<String, String>) -> LogConfig {
        self.inner.resolve(configs)
    }

    /// Creates a topic whose partitions start with `log_config`. Only the resolved settings
    /// are kept, not persisted: after a restart the partitions start with the broker's
    /// defaults. [`Store::create_topic_with_configs`] persists the configs.
    pub fn create_topic_with_config(
        &self,
        name: &str,
        partitions: i32,
        log_config: LogConfig,
    ) -> Result<()> {
        self.create(name, partitions, log_config, None)
    }

    /// Creates a topic with the topic configs `configs` (name -> value, already validated by
    /// the caller). They are persisted with the topic (before it is registered, so a
    /// registered topic never lacks them), reported by [`Store::topic_configs`] and resolved
    /// against the broker's defaults into the partitions' [`LogConfig`].
    pub fn create_topic_with_configs(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<()> {
        let log_config = self.inner.resolve(&configs);
        self.create(name, partitions, log_config, Some(configs))
    }

    fn create(
        &self,
        name: &str,
        partitions: i32,
        log_config: LogConfig,
        configs: Option<BTreeMap<String, String>>,
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
            let parts = inner.open_new_partitions(name, 0..partitions, &log_config)?;
            // A config entry left by an earlier topic of the same name is replaced too.
            inner.replace_configs(name, configs.clone().unwrap_or_default())?;
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
        if let Err(e) = inner.replace_configs(name, BTreeMap::new()) {
            // The topic is unregistered already; the next open drops the stale entry.
            tracing::warn!(topic = name, error = %e, "could not remove the deleted topic's configs");
        }
        for p in parts {
            p.mark_deleted();
            if let Err(e) = inner.backend.remove_dir_all(p.dir()) {
                tracing::warn!(dir = %p.dir().display(), error = %e, "could not remove partition directory; it is removed at next open");
            }
        }
        tracing::info!(topic = name, "deleted topic");
        Ok(())
    }

    /// The configs `topic` was created with or given later (name -> value, as set), or
    /// `None` if the topic does not exist.
    pub fn topic_configs(&self, topic: &str) -> Option<BTreeMap<String, String>> {
        let t = self.inner.topics.read().unwrap_or_else(|p| p.into_inner());
        t.contains_key(topic).then_some(())?;
        let configs = self.inner.configs.lock().unwrap_or_else(|p| p.into_inner());
        Some(configs.get(topic).cloned().unwrap_or_default())
    }

    /// Replaces the configs of `topic` (name -> value, already validated): persists them,
    /// then applies the resolved settings to every partition at once.
    pub fn alter_topic_configs(
        &self,
        topic: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<()> {
        let t = self.inner.topics.write().unwrap_or_else(|p| p.into_inner());
        let parts = t
            .get(topic)
            .ok_or_else(|| StorageError::UnknownTopic(topic.to_string()))?;
        let log_config = self.inner.resolve(&configs);
        self.inner.replace_configs(topic, configs)?;
        for p in parts {
            p.set_log_config(log_config.clone());
        }
        tracing::info!(topic, ?log_config, "topic configs changed");
        Ok(())
    }

    /// One retention pass over every partition (see [`Partition::enforce_retention`]); the
    /// background task started by [`Store::open`] calls it every
    /// `StorageConfig::retention_check_interval`. Returns the segments and bytes deleted.
    pub fn enforce_retention(&self) -> (usize, u64) {
        self.inner.enforce_retention()
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
            log_config: LogConfig {
                retention_ms: self.config.retention_ms,
                retention_bytes: self.config.retention_bytes,
                ..LogConfig::with_segment_bytes(self.config.segment_bytes)
            },
            retention_due: self.retention_due.clone(),
        }
    }

    fn resolve(&self, configs: &BTreeMap<String, String>) -> LogConfig {
        let mut log_config = self.context().log_config;
        for (name, value) in configs {
            log_config.apply(name, value);
        }
        log_config
    }

    /// Sets (or, with an empty map, removes) the configs of `topic` and rewrites
    /// `topics.configs` if that changed anything.
    fn replace_configs(&self, topic: &str, entries: BTreeMap<String, String>) -> Result<()> {
        let mut configs = self.configs.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = configs.clone();
        if entries.is_empty() {
            next.remove(topic);
        } else {
            next.insert(topic.to_string(), entries);
        }
        if next != *configs {
            self.write_configs(&next)?;
            *configs = next;
        }
        Ok(())
    }

    fn write_configs(&self, configs: &TopicConfigs) -> Result<()> {
        let path = self.root.join(topic_config_file::CONFIG_FILE);
        self.backend
            .write_file_atomic(&path, &topic_config_file::encode(configs))
            .map_err(|e| StorageError::io(&path, e))
    }

    /// Reads `topics.configs`: a missing file means no topic has configs; a file that fails
    /// to verify refuses the open (it is replaced atomically, so damage is not a crash, and
    /// nothing else records the configs).
    fn read_configs(&self) -> Result<TopicConfigs> {
        let path = self.root.join(topic_config_file::CONFIG_FILE);
        let Some(bytes) = self
            .backend
            .read_file(&path)
            .map_err(|e| StorageError::io(&path, e))?
        else {
            return Ok(TopicConfigs::new());
        };
        topic_config_file::decode(&bytes).map_err(|reason| StorageError::Corrupt {
            path: path.clone(),
            reason: format!(
                "the topic configs file is damaged ({reason}); it is only ever replaced \
                 atomically, so this is not a crash, and the broker will not guess the topics' \
                 retention and cleanup settings. The file was left unchanged: restore it from \
                 a backup, or remove it to reset every topic to the broker's defaults"
            ),
        })
    }

    fn enforce_retention(&self) -> (usize, u64) {
        let parts: Vec<Arc<Partition>> = {
            let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
            t.values().flatten().cloned().collect()
        };
        self.enforce_retention_of(parts)
    }

    /// A retention pass over the partitions `due` names (those still in the store).
    fn enforce_retention_due(&self, due: &[(String, i32)]) -> (usize, u64) {
        let parts: Vec<Arc<Partition>> = {
            let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
            due.iter()
                .filter_map(|(topic, i)| t.get(topic)?.get(usize::try_from(*i).ok()?).cloned())
                .collect()
        };
        self.enforce_retention_of(parts)
    }

    fn enforce_retention_of(&self, parts: Vec<Arc<Partition>>) -> (usize, u64) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let (mut segments, mut bytes) = (0, 0);
        for p in parts {
            match p.enforce_retention(now_ms) {
                Ok(o) => {
                    segments += o.segments_deleted;
                    bytes += o.bytes_deleted;
                }
                Err(e) => {
                    tracing::warn!(topic = p.topic(), partition = p.index(), error = %e, "retention pass failed")
                }
            }
        }
        (segments, bytes)
    }

    /// Opens partitions `range` of `topic` empty with `log_config` (removing any directory an
    /// interrupted create, grow or delete left, so no old data leaks in) and fsyncs the data
    /// directory so they exist before the registry names them.
    fn open_new_partitions(
        &self,
        topic: &str,
        range: std::ops::Range<i32>,
        log_config: &LogConfig,
    ) -> Result<Vec<Arc<Partition>>> {
        let mut parts = Vec::with_capacity(range.len());
        for i in range {
            let dir = self.partition_dir(topic, i);
            self.backend
                .remove_dir_all(&dir)
                .map_err(|e| StorageError::io(&dir, e))?;
            let ctx = PartitionContext {
                log_config: log_config.clone(),
                ..self.context()
            };
            parts.push(Arc::new(Partition::open(ctx, topic, i, dir)?));
        }
        self.backend
            .sync_dir(&self.root)
            .map_err(|e| StorageError::io(&self.root, e))?;
        Ok(parts)
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
        let stored_configs = self.read_configs()?;
        let mut configs = TopicConfigs::new();
        let mut expected = BTreeSet::new();
        let mut map = BTreeMap::new();
        for (name, n) in &registered {
            let entries = stored_configs.get(name).cloned().unwrap_or_default();
            let ctx = PartitionContext {
                log_config: self.resolve(&entries),
                ..self.context()
            };
            if !entries.is_empty() {
                configs.insert(name.clone(), entries);
            }
            let mut parts = Vec::with_capacity(*n as usize);
            for i in 0..*n {
                let dir = self.partition_dir(name, i);
                expected.insert(topics::partition_dir_name(name, i));
                parts.push(Arc::new(Partition::open(ctx.clone(), name, i, dir)?));
            }
            map.insert(name.clone(), parts);
        }
        if configs != stored_configs {
            // Entries of topics that are not registered (a crash inside a create or delete).
            self.write_configs(&configs)?;
        }
        *self.configs.lock().unwrap_or_else(|p| p.into_inner()) = configs;
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

fn spawn_retention(inner: Weak<Inner>, due: Arc<RetentionDue>, every: Duration) -> Result<()> {
    // Waits in short steps so the thread ends soon after the store is dropped.
    let step = every.min(Duration::from_millis(500));
    std::thread::Builder::new()
        .name("onceflow-log-retention".into())
        .spawn(move || {
            // `None`: an interval longer than an `Instant` can reach, so no periodic pass
            let mut next_pass = Instant::now().checked_add(every);
            loop {
                let wait = next_pass.map_or(step, |at| {
                    at.saturating_duration_since(Instant::now()).min(step)
                });
                let marked = due.take(wait);
                let Some(inner) = inner.upgrade() else {
                    break;
                };
                if next_pass.is_some_and(|at| Instant::now() >= at) {
                    // the whole pass covers the marked partitions too
                    inner.enforce_retention();
                    next_pass = Instant::now().checked_add(every);
                } else if !marked.is_empty() {
                    ::metrics::counter!(metrics::RETENTION_ROLL_PASSES).increment(1);
                    inner.enforce_retention_due(&marked);
                }
            }
        })
        .map(|_| ())
        .map_err(|e| StorageError::io("onceflow-log-retention thread", e))
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

#[cfg(test)]
#[path = "store_tests.rs"]
mod store_tests;
