//! Keyed state in Kafka: each keyed operator's changes go to its compacted changelog topic
//! `{prefix}-{operator}-changelog` in the instance's transaction (`docs/SCALE-OUT.md`, "State
//! in Kafka"). [`StateChangelog`] is the runtime's [`ChangelogWriter`]: at barrier `n` it turns
//! an operator subtask's changes into records (key `bincode((operator, table, key))`, value
//! `bincode(value)` or a tombstone, partition = the key's task, murmur2 of the key's Kafka
//! bytes) and hands them to the [`OffsetsLink`] for checkpoint `n`, which commits them with
//! that checkpoint's output and offsets. [`ensure_changelog_topics`] creates the topics at
//! start, or refuses existing ones of the wrong shape. A changelog's tasks are the partitions
//! of the topic that feeds its operator ([`ChangelogTopic::fed_by`]): the job's repartition
//! topic when the operator reads one, else the input topic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use onceflow_runtime::keygroup::KeyGroupRange;
use onceflow_runtime::state::{changelog_key, ChangelogWriter, KeyGroupSnapshot, StateChange};
use onceflow_runtime::CheckpointId;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde::de::DeserializeOwned;

use super::cache::{CachedTask, ChangelogCache, RESTORE_CACHED_RECORDS};
use super::key::{task_of, KafkaKey};
use super::queues::InstanceMember;
use crate::kafka::sink::OffsetsLink;
use crate::kafka::{ClientProperties, KafkaError};

/// Counter: changelog records written (tombstones included).
pub const CHANGELOG_RECORDS: &str = "onceflow_scale_changelog_records_total";
/// Histogram: bytes of changelog records (keys and values) in one instance commit.
pub const CHANGELOG_BYTES_PER_COMMIT: &str = "onceflow_scale_changelog_bytes_per_commit";

/// Counter: changelog records read back on restore, label `task` (`topic-partition`).
pub const RESTORE_RECORDS: &str = "onceflow_scale_restore_records_total";
/// Histogram: seconds one operator subtask spent restoring from its changelog, label `topic`.
pub const RESTORE_SECONDS: &str = "onceflow_scale_restore_seconds";

const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a restore waits without any record or partition end before it gives up.
const RESTORE_SILENCE: Duration = Duration::from_secs(60);

/// A record bound for one partition of one of the job's internal topics (a changelog or a
/// repartition topic), written in the instance transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedRecord {
    /// The topic.
    pub topic: String,
    /// The key's task.
    pub partition: i32,
    /// Changelog: `bincode((operator, table, key))`; repartition: the key's Kafka bytes.
    pub key: Vec<u8>,
    /// Changelog: `bincode(value)`, `None` for a removed key (a tombstone); repartition:
    /// `bincode(record)`.
    pub value: Option<Vec<u8>>,
}

/// One changelog record, bound for the transaction of the checkpoint that released it.
pub type ChangelogRecord = RoutedRecord;

impl RoutedRecord {
    /// Bytes of key and value.
    pub fn size(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Vec::len)
    }
}

type Route = onceflow_runtime::KeyRoute;

/// The changelog of one keyed operator: its topic, partition count and how a key's Kafka
/// bytes are found from its state encoding.
#[derive(Clone)]
pub struct ChangelogTopic {
    node_uid: String,
    topic: String,
    partitions: i32,
    route: Route,
    /// The topic whose partitions are the operator's tasks; `None`: the member's input topic.
    task_topic: Option<String>,
}

impl ChangelogTopic {
    /// The changelog of the keyed operator `node_uid` (the runtime's node uid, e.g.
    /// `n02-reduce`) with keys of type `K`, named `{prefix}-{node_uid}-changelog`, with
    /// `partitions` partitions: as many as the stream feeding the operator, one per task.
    pub fn new<K: KafkaKey + DeserializeOwned + 'static>(
        prefix: &str,
        node_uid: &str,
        partitions: i32,
    ) -> Self {
        ChangelogTopic {
            node_uid: node_uid.to_string(),
            topic: changelog_topic_name(prefix, node_uid),
            partitions,
            route: Arc::new(|encoded: &[u8]| {
                let key: K = onceflow_runtime::state::format::decode(encoded)?;
                Ok(key.key_bytes())
            }),
            task_topic: None,
        }
    }

    /// The changelog of the keyed operator `node_uid` whose key stream declared `route`
    /// (the runtime's [`onceflow_runtime::KeyRoute`]: a key's state encoding to its Kafka
    /// bytes), as [`ChangelogTopic::new`] otherwise.
    pub fn routed(
        prefix: &str,
        node_uid: &str,
        partitions: i32,
        route: onceflow_runtime::KeyRoute,
    ) -> Self {
        ChangelogTopic {
            node_uid: node_uid.to_string(),
            topic: changelog_topic_name(prefix, node_uid),
            partitions,
            route,
            task_topic: None,
        }
    }

    /// The operator reads `topic` (a repartition topic): a restore reads the changelog
    /// partitions of the partitions of `topic` the instance owns. Without it they are those
    /// of the member's input topic.
    pub fn fed_by(mut self, topic: impl Into<String>) -> Self {
        self.task_topic = Some(topic.into());
        self
    }

    /// The topic whose partitions are the operator's tasks, if not the input topic.
    pub fn task_topic(&self) -> Option<&str> {
        self.task_topic.as_deref()
    }

    /// The topic name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition count.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    fn record(&self, change: &StateChange) -> onceflow_runtime::Result<ChangelogRecord> {
        let kafka_key = (self.route)(&change.key)?;
        Ok(ChangelogRecord {
            topic: self.topic.clone(),
            partition: task_of(&kafka_key, self.partitions as u32) as i32,
            key: changelog_key(&self.node_uid, change)?,
            value: change.value.clone(),
        })
    }
}

/// The name of a keyed operator's changelog topic.
pub fn changelog_topic_name(prefix: &str, node_uid: &str) -> String {
    format!("{prefix}-{node_uid}-changelog")
}

/// The runtime's changelog writer of a scaled-out instance (`JobConfig::state_changelog`).
pub struct StateChangelog {
    link: OffsetsLink,
    topics: BTreeMap<String, ChangelogTopic>,
    restore: Option<RestoreFrom>,
    cache: Option<Arc<ChangelogCache>>,
    /// Each keyed operator's restored state, read once for all its subtasks and dropped when
    /// every key group took its part.
    restored: Mutex<BTreeMap<String, RestoreSlot>>,
    from_changelog: AtomicU64,
    from_cache: AtomicU64,
}

/// Where the first subtask of an operator leaves its restored state for the others.
type RestoreSlot = Arc<Mutex<Option<Arc<OperatorRestore>>>>;

/// One keyed operator's restored state, as changes (one per live key), shared by its
/// subtasks.
struct OperatorRestore {
    changes: Vec<StateChange>,
    /// Key groups whose subtask has not taken its part yet.
    groups_left: AtomicUsize,
}

/// Where a [`StateChangelog`] restores from: the changelog partitions of the tasks the
/// instance's member owns when the dataflow is set up.
struct RestoreFrom {
    brokers: String,
    properties: ClientProperties,
    member: InstanceMember,
}

impl StateChangelog {
    /// Writes the changes of the operators of `topics` through `link` (the link shared with
    /// the transactional-offsets sink, whose commit carries them).
    pub fn new(link: OffsetsLink, topics: Vec<ChangelogTopic>) -> Self {
        StateChangelog {
            link,
            topics: topics
                .into_iter()
                .map(|t| (t.node_uid.clone(), t))
                .collect(),
            restore: None,
            cache: None,
            restored: Mutex::new(BTreeMap::new()),
            from_changelog: AtomicU64::new(0),
            from_cache: AtomicU64::new(0),
        }
    }

    /// Keeps each restored task's state in `cache` (the instance's local cache) and appends
    /// every committed transaction's changelog records to it, so that a later restore of the
    /// task on this machine reads only the changelog's tail. A task whose cache file is
    /// missing, damaged or out of the partition's offsets is read from the beginning.
    pub fn with_cache(mut self, cache: Arc<ChangelogCache>) -> Self {
        self.link.cache_changelog(cache.clone());
        self.cache = Some(cache);
        self
    }

    /// Changelog records the restores of this writer read from Kafka, and records they took
    /// from the local cache.
    pub fn restored_records(&self) -> (u64, u64) {
        (
            self.from_changelog.load(Ordering::Relaxed),
            self.from_cache.load(Ordering::Relaxed),
        )
    }

    /// Operator `node_uid`'s restored state: read by the first of its subtasks to ask,
    /// shared with the others.
    fn operator_restore(
        &self,
        from: &RestoreFrom,
        topic: &ChangelogTopic,
        node_uid: &str,
        max_parallelism: usize,
    ) -> crate::kafka::Result<Arc<OperatorRestore>> {
        let slot = self
            .restored
            .lock()
            .entry(node_uid.to_string())
            .or_default()
            .clone();
        let mut slot = slot.lock();
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let r = Arc::new(self.read_operator(from, topic, node_uid, max_parallelism)?);
        *slot = Some(r.clone());
        Ok(r)
    }

    /// Reads operator `node_uid`'s owned tasks from the cache and the changelog, and writes
    /// their folds back to the cache.
    fn read_operator(
        &self,
        from: &RestoreFrom,
        topic: &ChangelogTopic,
        node_uid: &str,
        max_parallelism: usize,
    ) -> crate::kafka::Result<OperatorRestore> {
        use rdkafka::consumer::{BaseConsumer, Consumer};

        let started = std::time::Instant::now();
        let task_topic = topic.task_topic().unwrap_or(from.member.topic());
        let tasks: Vec<i32> = from.member.owned_as_built(task_topic).into_keys().collect();
        let consumer: BaseConsumer = from
            .properties
            .client_config(&from.brokers)
            .set("group.id", format!("{}-restore", topic.topic))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(|e| KafkaError::client("creating the changelog restore consumer", e))?;
        let mut starts = Vec::with_capacity(tasks.len());
        for &partition in &tasks {
            let cached = self
                .cache
                .as_ref()
                .and_then(|c| c.load(&topic.topic, partition))
                .and_then(|c| {
                    // a position outside the partition: the topic is not the one the cache
                    // was written from (deleted and created again), or it lost its start
                    match consumer.fetch_watermarks(&topic.topic, partition, ADMIN_TIMEOUT) {
                        Ok((low, high)) if low <= c.position && c.position <= high => Some(c),
                        Ok((low, high)) => {
                            tracing::warn!(topic = %topic.topic, partition, position = c.position, low, high, "changelog cache position outside the partition; restoring from the beginning");
                            None
                        }
                        Err(e) => {
                            tracing::warn!(topic = %topic.topic, partition, error = %e, "changelog offsets unknown; restoring from the beginning");
                            None
                        }
                    }
                });
            starts.push(TaskStart { partition, cached });
        }
        let folds = read_changelog(&consumer, &topic.topic, node_uid, starts)?;
        let (mut read, mut cached) = (0u64, 0u64);
        let mut changes = Vec::new();
        for (partition, fold) in &folds {
            read += fold.from_changelog;
            cached += fold.from_cache;
            if let Some(cache) = &self.cache {
                let entries = fold
                    .entries
                    .iter()
                    .map(|(k, v)| (k.as_slice(), v.as_slice()));
                if let Err(e) = cache.rewrite(&topic.topic, *partition, entries, fold.end) {
                    tracing::warn!(topic = %topic.topic, partition, error = %e, "cannot write the changelog cache; the next restore reads the whole partition");
                }
            }
            for (k, v) in &fold.entries {
                let (_, change) =
                    onceflow_runtime::state::change_from_record(k, Some(v), max_parallelism)
                        .map_err(|e| {
                            KafkaError::Protocol(format!(
                                "changelog {}-{partition}: {e}",
                                topic.topic
                            ))
                        })?;
                changes.push(change);
            }
        }
        self.from_changelog.fetch_add(read, Ordering::Relaxed);
        self.from_cache.fetch_add(cached, Ordering::Relaxed);
        metrics::histogram!(RESTORE_SECONDS, "topic" => topic.topic.clone())
            .record(started.elapsed().as_secs_f64());
        tracing::info!(
            operator = node_uid,
            topic = %topic.topic,
            task_topic,
            tasks = ?tasks,
            from_changelog = read,
            from_cache = cached,
            keys = changes.len(),
            seconds = started.elapsed().as_secs_f64(),
            "keyed state restored"
        );
        Ok(OperatorRestore {
            changes,
            groups_left: AtomicUsize::new(max_parallelism),
        })
    }

    /// Restores every keyed operator subtask from its changelog when the dataflow is set up:
    /// the partitions of the tasks `member` owns then (a task is a partition of the topic
    /// feeding the operator: [`ChangelogTopic::fed_by`], else the input topic), read
    /// read_committed to their end and folded, last change per key winning: from the
    /// beginning, or over the task's state in the local cache from its position
    /// ([`StateChangelog::with_cache`]). The first subtask of an operator to be set up reads
    /// its tasks for all of them. Build the dataflow after the member received its
    /// assignment.
    pub fn restoring_from(
        mut self,
        brokers: impl Into<String>,
        properties: ClientProperties,
        member: InstanceMember,
    ) -> Self {
        self.restore = Some(RestoreFrom {
            brokers: brokers.into(),
            properties,
            member,
        });
        self
    }
}

/// Where the restore of one task starts: its cached state and the offset to read from, or
/// the partition's beginning.
struct TaskStart {
    partition: i32,
    cached: Option<CachedTask>,
}

/// The tasks' state after a restore: the fold of each partition (record key to value) and
/// the offset its read ended at.
struct TaskFold {
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    end: i64,
    from_cache: u64,
    from_changelog: u64,
}

/// Reads each task's partition of `topic` read_committed from its start (the cached
/// position, or the beginning) to its end (the last stable offset) and folds it over the
/// cached state, last change per key winning; records of operators other than `node_uid`
/// are skipped.
fn read_changelog(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    node_uid: &str,
    starts: Vec<TaskStart>,
) -> crate::kafka::Result<BTreeMap<i32, TaskFold>> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};

    let mut folds: BTreeMap<i32, TaskFold> = BTreeMap::new();
    if starts.is_empty() {
        return Ok(folds);
    }
    let mut tpl = TopicPartitionList::new();
    for s in starts {
        let (offset, fold) = match s.cached {
            Some(c) => (
                Offset::Offset(c.position),
                TaskFold {
                    from_cache: c.entries.len() as u64,
                    entries: c.entries,
                    end: c.position,
                    from_changelog: 0,
                },
            ),
            None => (
                Offset::Beginning,
                TaskFold {
                    entries: BTreeMap::new(),
                    end: 0,
                    from_cache: 0,
                    from_changelog: 0,
                },
            ),
        };
        tpl.add_partition_offset(topic, s.partition, offset)
            .map_err(|e| KafkaError::client("building the restore assignment", e))?;
        folds.insert(s.partition, fold);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client(format!("assigning {topic} for restore"), e))?;
    let mut at_end = std::collections::BTreeSet::new();
    let mut last_progress = std::time::Instant::now();
    let prefix = onceflow_runtime::state::format::encode(&node_uid)
        .map_err(|e| KafkaError::Protocol(format!("encoding the operator uid: {e}")))?;
    while at_end.len() < folds.len() {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_progress.elapsed() > RESTORE_SILENCE {
                    return Err(KafkaError::Protocol(format!(
                        "restoring from {topic}: nothing arrived for {RESTORE_SILENCE:?} before \
                         the end of partitions {:?}",
                        folds
                            .keys()
                            .filter(|p| !at_end.contains(*p))
                            .collect::<Vec<_>>()
                    )));
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                last_progress = std::time::Instant::now();
                at_end.insert(p);
            }
            Some(Err(e)) => {
                return Err(KafkaError::client(format!("restoring from {topic}"), e));
            }
            Some(Ok(m)) => {
                last_progress = std::time::Instant::now();
                at_end.remove(&m.partition());
                let Some(fold) = folds.get_mut(&m.partition()) else {
                    continue;
                };
                fold.end = fold.end.max(m.offset() + 1);
                let Some(key) = m.key() else { continue };
                // a record key is `bincode((uid, table, key))`: this operator's start with the
                // encoded uid (its length first, so no other uid is a prefix of it); others
                // are decoded, so that a malformed one is an error
                if !key.starts_with(&prefix) {
                    let (uid, _) = onceflow_runtime::state::change_from_record(key, None, 1)
                        .map_err(|e| {
                            KafkaError::Protocol(format!(
                                "changelog {topic}-{} offset {}: {e}",
                                m.partition(),
                                m.offset()
                            ))
                        })?;
                    if uid != node_uid {
                        continue;
                    }
                }
                fold.from_changelog += 1;
                match m.payload() {
                    Some(v) => {
                        fold.entries.insert(key.to_vec(), v.to_vec());
                    }
                    None => {
                        fold.entries.remove(key);
                    }
                }
            }
        }
    }
    // where each read ended: the consumer's position at the partition's end (past control
    // records and aborted transactions the read skipped)
    if let Ok(positions) = consumer.position() {
        for e in positions.elements_for_topic(topic) {
            if let (Some(fold), Offset::Offset(o)) = (folds.get_mut(&e.partition()), e.offset()) {
                fold.end = fold.end.max(o);
            }
        }
    }
    for (task, fold) in &folds {
        let task = format!("{topic}-{task}");
        metrics::counter!(RESTORE_RECORDS, "task" => task.clone()).increment(fold.from_changelog);
        metrics::counter!(RESTORE_CACHED_RECORDS, "task" => task).increment(fold.from_cache);
    }
    Ok(folds)
}

impl ChangelogWriter for StateChangelog {
    fn write_for_checkpoint(
        &self,
        checkpoint: CheckpointId,
        node_uid: &str,
        subtask: usize,
        changes: Vec<StateChange>,
    ) -> onceflow_runtime::Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let Some(topic) = self.topics.get(node_uid) else {
            return Err(KafkaError::Config(format!(
                "keyed operator {node_uid} has no changelog topic (known: {:?}); declare a \
                 ChangelogTopic for every keyed operator of a scaled-out job",
                self.topics.keys().collect::<Vec<_>>()
            ))
            .into());
        };
        let records = changes
            .iter()
            .map(|c| topic.record(c))
            .collect::<onceflow_runtime::Result<Vec<_>>>()?;
        tracing::debug!(
            checkpoint,
            operator = node_uid,
            subtask,
            records = records.len(),
            "changelog records for the checkpoint's transaction"
        );
        self.link.write_for_checkpoint(checkpoint, records);
        Ok(())
    }

    fn restore(
        &self,
        node_uid: &str,
        range: KeyGroupRange,
        max_parallelism: usize,
    ) -> onceflow_runtime::Result<Option<Vec<KeyGroupSnapshot>>> {
        let (Some(from), Some(topic)) = (&self.restore, self.topics.get(node_uid)) else {
            return Ok(None);
        };
        let restored = self.operator_restore(from, topic, node_uid, max_parallelism)?;
        let groups: Vec<KeyGroupSnapshot> = onceflow_runtime::state::snapshots_from_changes(
            restored
                .changes
                .iter()
                .filter(|c| range.contains(c.key_group))
                .cloned(),
        )?;
        // the last subtask to take its part frees the operator's restored state
        let taken = range.len().min(max_parallelism);
        if restored.groups_left.fetch_sub(taken, Ordering::AcqRel) <= taken {
            self.restored.lock().remove(node_uid);
        }
        Ok(Some(groups))
    }
}

/// Creates each changelog topic that does not exist (compacted, its partition count,
/// `replication` replicas, -1 for the broker's default) and checks each one that does: a
/// topic with another partition count or a `cleanup.policy` without `compact` is refused with
/// a message saying which topic and what differs.
pub async fn ensure_changelog_topics(
    brokers: &str,
    properties: &ClientProperties,
    topics: &[ChangelogTopic],
    replication: i32,
) -> crate::kafka::Result<()> {
    let specs: Vec<InternalTopic<'_>> = topics
        .iter()
        .map(|t| InternalTopic {
            name: &t.topic,
            partitions: t.partitions,
        })
        .collect();
    ensure_internal_topics(brokers, properties, &specs, replication, &CHANGELOG_KIND).await
}

/// One internal topic of a job: its name and partition count.
pub(crate) struct InternalTopic<'a> {
    pub(crate) name: &'a str,
    pub(crate) partitions: i32,
}

/// What kind of internal topic [`ensure_internal_topics`] creates and checks.
pub(crate) struct TopicKind {
    /// `changelog`, `repartition`: names the topics in messages.
    pub(crate) name: &'static str,
    /// The `cleanup.policy` the topics are created with and must include.
    pub(crate) policy: &'static str,
    /// Why the partition count must match.
    pub(crate) partitions_why: &'static str,
    /// Why another cleanup policy is refused.
    pub(crate) policy_why: &'static str,
}

const CHANGELOG_KIND: TopicKind = TopicKind {
    name: "changelog",
    policy: "compact",
    partitions_why: "one per task of the stream feeding the operator",
    policy_why: "a changelog must be compacted (cleanup.policy=compact), or deleting old \
                 segments would lose keys' state",
};

/// Creates each topic of `topics` that does not exist (`kind`'s cleanup policy, its partition
/// count, `replication` replicas, -1 for the broker's default) and checks each one that does:
/// a topic with another partition count or a `cleanup.policy` without `kind`'s is refused
/// with a message saying which topic and what differs.
pub(crate) async fn ensure_internal_topics(
    brokers: &str,
    properties: &ClientProperties,
    topics: &[InternalTopic<'_>],
    replication: i32,
    kind: &TopicKind,
) -> crate::kafka::Result<()> {
    let what = kind.name;
    let admin: AdminClient<DefaultClientContext> = properties
        .client_config(brokers)
        .create()
        .map_err(|e| KafkaError::client("creating the admin client", e))?;
    let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            NewTopic::new(t.name, t.partitions, TopicReplication::Fixed(replication))
                .set("cleanup.policy", kind.policy)
        })
        .collect();
    let created = admin
        .create_topics(&new, &opts)
        .await
        .map_err(|e| KafkaError::client(format!("creating {what} topics"), e))?;
    for r in created {
        match r {
            Ok(t) => tracing::info!(topic = %t, kind = what, "internal topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => {
                return Err(KafkaError::Config(format!(
                    "cannot create {what} topic {t} with replication factor {replication}: {e} (--internal-replication-factor: at most the number of brokers, or -1 for the cluster's default.replication.factor)"
                )))
            }
        }
    }
    let md = admin
        .inner()
        .fetch_metadata(None, ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("reading metadata of {what} topics"), e))?;
    for t in topics {
        let found = md
            .topics()
            .iter()
            .find(|m| m.name() == t.name)
            .map(|m| m.partitions().len());
        match found {
            Some(n) if n == t.partitions as usize => {}
            Some(n) => {
                return Err(KafkaError::Config(format!(
                    "{what} topic {} has {n} partitions, the job needs {} ({}); delete it or \
                     give the job another --transactional-id-prefix",
                    t.name, t.partitions, kind.partitions_why
                )))
            }
            None => {
                return Err(KafkaError::Config(format!(
                    "{what} topic {} does not exist after it was created",
                    t.name
                )))
            }
        }
    }
    let resources: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.name))
        .collect();
    let described = admin
        .describe_configs(&resources, &opts)
        .await
        .map_err(|e| KafkaError::client(format!("describing {what} topics"), e))?;
    for (t, r) in topics.iter().zip(described) {
        let config = r.map_err(|e| {
            KafkaError::Config(format!("cannot describe {what} topic {}: {e}", t.name))
        })?;
        let policy = config
            .get("cleanup.policy")
            .and_then(|e| e.value.clone())
            .unwrap_or_else(|| "delete".to_string());
        if !policy.split(',').any(|p| p.trim() == kind.policy) {
            return Err(KafkaError::Config(format!(
                "{what} topic {} has cleanup.policy={policy}; {}",
                t.name, kind.policy_why
            )));
        }
        tracing::debug!(
            topic = t.name,
            kind = what,
            partitions = t.partitions,
            "internal topic checked"
        );
    }
    Ok(())
}
