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
use std::sync::Arc;
use std::time::Duration;

use onceflow_runtime::keygroup::KeyGroupRange;
use onceflow_runtime::state::{changelog_key, ChangelogWriter, KeyGroupSnapshot, StateChange};
use onceflow_runtime::CheckpointId;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde::de::DeserializeOwned;

use super::key::{task_of, KafkaKey};
use super::queues::InstanceMember;
use crate::kafka::sink::OffsetsLink;
use crate::kafka::{ClientProperties, KafkaError};

/// Counter: changelog records written (tombstones included).
pub const CHANGELOG_RECORDS: &str = "onceflow_changelog_records_total";
/// Histogram: bytes of changelog records (keys and values) in one instance commit.
pub const CHANGELOG_BYTES_PER_COMMIT: &str = "onceflow_changelog_bytes_per_commit";

/// Counter: changelog records read back on restore, label `task` (`topic-partition`).
pub const RESTORE_RECORDS: &str = "onceflow_restore_records_total";
/// Histogram: seconds one operator subtask spent restoring from its changelog, label `topic`.
pub const RESTORE_SECONDS: &str = "onceflow_restore_seconds";

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
        }
    }

    /// Restores every keyed operator subtask from its changelog when the dataflow is set up:
    /// the partitions of the tasks `member` owns then (a task is a partition of the topic
    /// feeding the operator: [`ChangelogTopic::fed_by`], else the input topic), read
    /// read_committed from the beginning to their end and folded, last change per key
    /// winning. Build the dataflow after the member received its assignment.
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

/// Reads `partitions` of `topic` read_committed from the beginning to their end (the last
/// stable offset), returning the changes of operator `node_uid` in log order per partition.
fn read_changelog(
    from: &RestoreFrom,
    topic: &str,
    node_uid: &str,
    partitions: &[i32],
    max_parallelism: usize,
) -> crate::kafka::Result<Vec<StateChange>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};

    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let consumer: BaseConsumer = from
        .properties
        .client_config(&from.brokers)
        .set("group.id", format!("{topic}-restore"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| KafkaError::client("creating the changelog restore consumer", e))?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(|e| KafkaError::client("building the restore assignment", e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client(format!("assigning {topic} for restore"), e))?;
    let mut at_end = std::collections::BTreeSet::new();
    let mut changes = Vec::new();
    let mut per_task: BTreeMap<i32, u64> = BTreeMap::new();
    let mut last_progress = std::time::Instant::now();
    while at_end.len() < partitions.len() {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_progress.elapsed() > RESTORE_SILENCE {
                    return Err(KafkaError::Protocol(format!(
                        "restoring from {topic}: nothing arrived for {RESTORE_SILENCE:?} before \
                         the end of partitions {:?}",
                        partitions
                            .iter()
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
                let Some(key) = m.key() else { continue };
                let (uid, change) =
                    onceflow_runtime::state::change_from_record(key, m.payload(), max_parallelism)
                        .map_err(|e| {
                            KafkaError::Protocol(format!(
                                "changelog {topic}-{} offset {}: {e}",
                                m.partition(),
                                m.offset()
                            ))
                        })?;
                if uid == node_uid {
                    *per_task.entry(m.partition()).or_default() += 1;
                    changes.push(change);
                }
            }
        }
    }
    for (task, n) in per_task {
        metrics::counter!(RESTORE_RECORDS, "task" => format!("{topic}-{task}")).increment(n);
    }
    Ok(changes)
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
        let started = std::time::Instant::now();
        let task_topic = topic.task_topic().unwrap_or(from.member.topic());
        let tasks: Vec<i32> = from.member.owned_as_built(task_topic).into_keys().collect();
        let changes = read_changelog(from, &topic.topic, node_uid, &tasks, max_parallelism)?;
        let records = changes.len();
        let groups: Vec<KeyGroupSnapshot> = onceflow_runtime::state::snapshots_from_changes(
            changes.into_iter().filter(|c| range.contains(c.key_group)),
        )?;
        metrics::histogram!(RESTORE_SECONDS, "topic" => topic.topic.clone())
            .record(started.elapsed().as_secs_f64());
        tracing::info!(
            operator = node_uid,
            topic = %topic.topic,
            task_topic,
            tasks = ?tasks,
            records,
            key_groups = groups.len(),
            "keyed state restored from the changelog"
        );
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
                    "cannot create {what} topic {t}: {e}"
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
