//! Repartition topics: a keyed exchange through Kafka (`docs/SCALE-OUT.md`, "Topics a job
//! owns"). When a scaled-out job's input is not partitioned by the key of its keyed operator,
//! [`key_by_through`] splits the pipeline in two sub-topologies: the stream before the key
//! change ends in a repartition writer that puts each record on partition `task_of(key)` of the
//! job's `{prefix}-{name}-repartition` topic (record key = the key's Kafka bytes, value =
//! `bincode(record)` with the runtime's state encoding), inside the instance transaction; a
//! repartition reader reads that topic read_committed through the instance's group member, so
//! each key's records reach the instance that owns the key's task, and its positions commit
//! in the instance transaction with the input's. [`ensure_repartition_topics`] creates the
//! topics at start (`cleanup.policy=delete`) or refuses existing ones of another shape;
//! [`RepartitionPurger`] deletes what the job has consumed from them (the records below the
//! group's committed offsets), so they do not grow with the job's history.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use onceflow_operators::{KeyBy, KeyedStream};
use onceflow_runtime::{async_trait, CheckpointId, Data, DataStream, Key, Sink, SinkFactory};
use onceflow_runtime::{Result as RuntimeResult, SubtaskInfo};

use super::changelog::{ensure_internal_topics, InternalTopic, RoutedRecord, TopicKind};
use super::key::{task_of, KafkaKey};
use super::queues::InstanceMember;
use super::source::{Decode, GroupSource};
use crate::kafka::config::{DeliveryMode, KafkaSinkConfig};
use crate::kafka::json::KafkaMessage;
use crate::kafka::sink::{KafkaPending, OffsetsLink, OffsetsWriter};
use crate::kafka::{ClientProperties, KafkaError};

/// Counter: records through repartition topics, label `direction` (`written`: handed to the
/// instance transaction by a repartition writer; `read`: read back by a repartition reader).
pub const REPARTITION_RECORDS: &str = "onceflow_scale_repartition_records_total";

/// Counter: repartition partitions whose consumed records a [`RepartitionPurger`] deleted
/// (one per partition per DeleteRecords that moved its start).
pub const REPARTITION_PURGES: &str = "onceflow_scale_repartition_purged_partitions_total";

const REPARTITION_KIND: TopicKind = TopicKind {
    name: "repartition",
    policy: "delete",
    partitions_why: "one per task of the keyed operator it feeds",
    policy_why: "a repartition topic must be cleanup.policy=delete: compaction could drop a \
                 key's records before they are read",
};

/// The name of a job's repartition topic: `{prefix}-{name}-repartition`.
pub fn repartition_topic_name(prefix: &str, name: &str) -> String {
    format!("{prefix}-{name}-repartition")
}

/// One repartition topic of a job: its name and partition count (the number of tasks of the
/// keyed operator it feeds, usually the input's partition count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepartitionTopic {
    /// Topic name.
    pub name: String,
    /// Partition count.
    pub partitions: i32,
}

impl RepartitionTopic {
    /// The repartition topic `{prefix}-{name}-repartition` with `partitions` partitions.
    pub fn new(prefix: &str, name: &str, partitions: i32) -> Self {
        RepartitionTopic {
            name: repartition_topic_name(prefix, name),
            partitions,
        }
    }
}

/// Creates each repartition topic that does not exist (`cleanup.policy=delete`, its partition
/// count, `replication` replicas, -1 for the broker's default) and checks each one that does:
/// a topic with another partition count or a `cleanup.policy` without `delete` is refused with
/// a message saying which topic and what differs.
pub async fn ensure_repartition_topics(
    brokers: &str,
    properties: &ClientProperties,
    topics: &[RepartitionTopic],
    replication: i32,
) -> crate::kafka::Result<()> {
    let specs: Vec<InternalTopic<'_>> = topics
        .iter()
        .map(|t| InternalTopic {
            name: &t.name,
            partitions: t.partitions,
        })
        .collect();
    ensure_internal_topics(brokers, properties, &specs, replication, &REPARTITION_KIND).await
}

/// Deletes the records of a job's repartition topics below the group's committed offsets:
/// every instance resumes a repartition partition from its committed offset, so nothing
/// below it is read again (Kafka Streams purges its repartition topics the same way). Any
/// instance may purge any partition: a committed offset only moves forward.
pub struct RepartitionPurger {
    consumer: BaseConsumer,
    admin: AdminClient<DefaultClientContext>,
    group: String,
    topics: Vec<RepartitionTopic>,
    /// The offset each partition was last purged up to.
    purged: HashMap<(String, i32), i64>,
}

impl RepartitionPurger {
    /// A purger of `topics` for the job's consumer group `group`.
    pub fn new(
        brokers: &str,
        properties: &ClientProperties,
        group: &str,
        topics: Vec<RepartitionTopic>,
    ) -> crate::kafka::Result<Self> {
        let consumer: BaseConsumer = properties
            .client_config(brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| KafkaError::client("creating the repartition purger's client", e))?;
        let admin: AdminClient<DefaultClientContext> =
            properties
                .client_config(brokers)
                .create()
                .map_err(|e| KafkaError::client("creating the repartition purger's admin", e))?;
        Ok(RepartitionPurger {
            consumer,
            admin,
            group: group.to_string(),
            topics,
            purged: HashMap::new(),
        })
    }

    /// One round: reads the group's committed offset of every partition of the topics and
    /// deletes the records below each one that moved since the last round. Returns how many
    /// partitions it purged. Blocking.
    pub fn purge(&mut self) -> crate::kafka::Result<usize> {
        let mut all = TopicPartitionList::new();
        for t in &self.topics {
            for p in 0..t.partitions {
                all.add_partition(&t.name, p);
            }
        }
        let committed = self
            .consumer
            .committed_offsets(all, Duration::from_secs(10))
            .map_err(|e| {
                KafkaError::client(
                    format!("reading the committed offsets of {}", self.group),
                    e,
                )
            })?;
        let mut delete = TopicPartitionList::new();
        let mut asked = HashMap::new();
        for e in committed.elements() {
            let Offset::Offset(at) = e.offset() else {
                continue;
            };
            let key = (e.topic().to_string(), e.partition());
            if at > 0 && self.purged.get(&key).is_none_or(|&done| done < at) {
                delete
                    .add_partition_offset(e.topic(), e.partition(), Offset::Offset(at))
                    .map_err(|e| KafkaError::client("listing the partitions to purge", e))?;
                asked.insert(key, at);
            }
        }
        if delete.count() == 0 {
            return Ok(0);
        }
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let result = futures::executor::block_on(self.admin.delete_records(&delete, &opts))
            .map_err(|e| KafkaError::client("deleting consumed repartition records", e))?;
        let mut purged = 0;
        for got in result.elements() {
            if let Err(e) = got.error() {
                tracing::warn!(topic = got.topic(), partition = got.partition(), error = %e,
                    "deleting consumed repartition records failed; the next round retries");
                continue;
            }
            let key = (got.topic().to_string(), got.partition());
            if let Some(at) = asked.remove(&key) {
                self.purged.insert(key, at);
                purged += 1;
            }
        }
        metrics::counter!(REPARTITION_PURGES).increment(purged as u64);
        tracing::debug!(partitions = purged, "purged consumed repartition records");
        Ok(purged)
    }
}

/// What a keyed exchange through Kafka needs: the repartition topic, the instance's group
/// member (subscribed to the topic), the link of the instance transaction and the instance
/// producer's configuration (the transactional-offsets sink's: brokers, client properties,
/// transactional id prefix).
#[derive(Clone)]
pub struct Repartition {
    topic: RepartitionTopic,
    member: InstanceMember,
    link: OffsetsLink,
    sink: KafkaSinkConfig,
}

impl Repartition {
    /// Checks that `member` subscribes to `topic` with its partition count and that `sink` is
    /// in transactional-offsets mode (the repartition records commit in its transaction).
    pub fn new(
        topic: RepartitionTopic,
        member: InstanceMember,
        link: OffsetsLink,
        sink: KafkaSinkConfig,
    ) -> crate::kafka::Result<Self> {
        if sink.mode != DeliveryMode::TransactionalOffsets {
            return Err(KafkaError::Config(format!(
                "repartition topic {}: records go through Kafka only in transactional-offsets \
                 mode (the sink is in {:?})",
                topic.name, sink.mode
            )));
        }
        match member.partitions_of(&topic.name) {
            Some(n) if n == topic.partitions as usize => {}
            Some(n) => {
                return Err(KafkaError::Config(format!(
                    "repartition topic {} has {n} partitions, the job declares {}",
                    topic.name, topic.partitions
                )))
            }
            None => {
                return Err(KafkaError::Config(format!(
                    "the instance's group member does not subscribe to the repartition topic {} \
                     (it subscribes to {:?}): add it to MemberConfig::topics",
                    topic.name,
                    member.topics().collect::<Vec<_>>()
                )))
            }
        }
        Ok(Repartition {
            topic,
            member,
            link,
            sink,
        })
    }

    /// The topic.
    pub fn topic(&self) -> &RepartitionTopic {
        &self.topic
    }

    /// The repartition writer alone (what [`key_by_through`] adds as a sink): a sink whose
    /// subtasks write each record to `task_of(key)` of the topic in the instance transaction.
    pub fn writer<T: Data, K: Key + KafkaKey>(
        &self,
        key: impl Fn(&T) -> K + Send + Sync + 'static,
    ) -> RepartitionSink<T, K> {
        RepartitionSink {
            cfg: self.sink.clone(),
            link: self.link.clone(),
            topic: self.topic.clone(),
            key: Arc::new(key),
        }
    }
}

/// Keys `stream` by `key` through the repartition topic of `through`: adds a repartition
/// writer (a sink writing each record to `task_of(key)` in the instance transaction) and a
/// repartition reader (a source of the topic's partitions the instance owns, read_committed),
/// and returns the reader's stream keyed by `key`. A record the reader cannot decode fails
/// the job.
pub fn key_by_through<K: Key + KafkaKey, T: Data>(
    stream: &DataStream<T>,
    key: impl Fn(&T) -> K + Send + Sync + 'static,
    through: &Repartition,
) -> KeyedStream<K, T> {
    let key: KeyOf<T, K> = Arc::new(key);
    let topic = through.topic.clone();
    let route = key.clone();
    tracing::info!(
        topic = %topic.name,
        partitions = topic.partitions,
        record = std::any::type_name::<T>(),
        key = std::any::type_name::<K>(),
        "keyed exchange through a repartition topic"
    );
    stream.sink("repartition-writer", through.writer(move |t: &T| route(t)));
    let name = topic.name.clone();
    let decode: Decode<T> = Arc::new(move |m: KafkaMessage| decode_record(&name, m));
    let reader = GroupSource::decoding(
        through.member.clone(),
        topic.name.clone(),
        decode,
        Some(through.link.clone()),
    )
    .counting(REPARTITION_RECORDS, "read");
    stream
        .env()
        .source("repartition-reader", reader)
        .key_by(move |t: &T| key(t))
}

/// Decodes a repartition record's value; a record of another writer or another version of
/// the record type is refused with its position.
fn decode_record<T: Data>(topic: &str, m: KafkaMessage) -> crate::kafka::Result<T> {
    let at = || format!("{topic}-{} at offset {}", m.partition, m.offset);
    let Some(value) = m.payload.as_deref() else {
        return Err(KafkaError::Protocol(format!(
            "repartition record {} has no value; only the job's repartition writer may write \
             to its repartition topic",
            at()
        )));
    };
    onceflow_runtime::state::format::decode::<T>(value).map_err(|e| {
        KafkaError::Protocol(format!(
            "repartition record {} does not decode as {}: {e}; it was written by another \
             writer or another version of the job (a changed record type needs a new \
             --transactional-id-prefix, or the topic emptied)",
            at(),
            std::any::type_name::<T>()
        ))
    })
}

type KeyOf<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

/// The repartition writer's sink factory ([`Repartition::writer`]).
pub struct RepartitionSink<T, K> {
    cfg: KafkaSinkConfig,
    link: OffsetsLink,
    topic: RepartitionTopic,
    key: KeyOf<T, K>,
}

impl<T: Data, K: Key + KafkaKey> SinkFactory<T> for RepartitionSink<T, K> {
    type Sink = RepartitionWriter<T, K>;

    fn create(&self, info: &SubtaskInfo) -> RuntimeResult<RepartitionWriter<T, K>> {
        Ok(RepartitionWriter {
            writer: OffsetsWriter::for_config(self.cfg.clone(), info, self.link.clone()),
            topic: self.topic.clone(),
            key: self.key.clone(),
        })
    }
}

/// One repartition writer subtask: a transactional-offsets sink subtask whose records go to
/// their key's task of the repartition topic.
pub struct RepartitionWriter<T, K> {
    writer: OffsetsWriter,
    topic: RepartitionTopic,
    key: KeyOf<T, K>,
}

impl<T: Data, K: Key + KafkaKey> RepartitionWriter<T, K> {
    fn route(&self, record: &T) -> RuntimeResult<RoutedRecord> {
        let key = (self.key)(record).key_bytes();
        Ok(RoutedRecord {
            topic: self.topic.name.clone(),
            partition: task_of(&key, self.topic.partitions as u32) as i32,
            key,
            value: Some(onceflow_runtime::state::format::encode(record)?),
        })
    }
}

#[async_trait]
impl<T: Data, K: Key + KafkaKey> Sink<T> for RepartitionWriter<T, K> {
    type Pending = KafkaPending;

    async fn recover(&mut self, _pending: Vec<KafkaPending>) -> RuntimeResult<()> {
        self.writer.recover().await
    }

    async fn write_batch(&mut self, records: Vec<T>) -> RuntimeResult<()> {
        let routed = records
            .iter()
            .map(|r| self.route(r))
            .collect::<RuntimeResult<Vec<_>>>()?;
        let n = routed.len() as u64;
        self.writer.write_routed(routed).await?;
        metrics::counter!(REPARTITION_RECORDS, "direction" => "written").increment(n);
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> RuntimeResult<Option<KafkaPending>> {
        self.writer.pre_commit(checkpoint).await.map(Some)
    }

    async fn commit(
        &mut self,
        checkpoint: CheckpointId,
        _pending: KafkaPending,
    ) -> RuntimeResult<()> {
        self.writer.commit(checkpoint).await
    }

    async fn abort(&mut self, _pending: KafkaPending) -> RuntimeResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design() {
        assert_eq!(repartition_topic_name("etl", "sum"), "etl-sum-repartition");
        assert_eq!(
            RepartitionTopic::new("etl", "sum", 6),
            RepartitionTopic {
                name: "etl-sum-repartition".into(),
                partitions: 6
            }
        );
    }

    #[test]
    fn a_record_that_does_not_decode_is_a_clear_error() {
        let m = |payload: Option<Vec<u8>>| KafkaMessage {
            topic: "t".into(),
            partition: 3,
            offset: 7,
            key: None,
            payload,
            timestamp_ms: None,
        };
        let good = onceflow_runtime::state::format::encode(&("k".to_string(), 5u64)).unwrap();
        let back: (String, u64) = decode_record("t", m(Some(good))).unwrap();
        assert_eq!(back, ("k".to_string(), 5));
        let err = decode_record::<(String, u64)>("t", m(Some(vec![0xff; 3])))
            .unwrap_err()
            .to_string();
        assert!(err.contains("t-3 at offset 7 does not decode"), "{err}");
        let err = decode_record::<(String, u64)>("t", m(None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("has no value"), "{err}");
    }
}
