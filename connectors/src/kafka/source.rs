//! KafkaSource: a read_committed rdkafka consumer without auto commit. Partition `p` of the
//! topic belongs to source subtask `p % parallelism`; the next offset of every partition is
//! the position stored at each barrier and restored from the checkpoint (a partition without
//! a position starts from the earliest offset). With an [`OffsetsLink`] (both exactly-once
//! modes) the source starts from the consumer group's committed offsets and hands its
//! positions at each barrier to whoever commits them: the transactional-offsets sink (inside
//! the output transaction) or the two-phase-commit checkpoint seal. [`KafkaSource::in_group`]
//! turns the source into the scaled-out one (`kafka::scale`), which reads the partitions the
//! consumer group gives the instance instead of `p % parallelism` of all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow_runtime::{async_trait, CheckpointId, Source, SourceFactory, SourcePoll, SubtaskInfo};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, Statistics, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::json::{Decoder, KafkaMessage};
use super::sink::OffsetsLink;
use super::{metrics as m, ClientProperties, KafkaError};

const META_TIMEOUT: Duration = Duration::from_secs(30);

/// librdkafka's `fetch.queue.backoff.ms` for the source (see [`KafkaSource`]'s consumer
/// settings): how soon a partition whose local queue was full is fetched again.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// The position of one source subtask: next offset per partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaPosition {
    /// Topic.
    pub topic: String,
    /// (partition, next offset to read).
    pub offsets: Vec<(i32, i64)>,
    /// (partition, highest event time read before its offset), for the partitions of
    /// `offsets` whose event time the source's watermark strategy tracks. Goes into the
    /// metadata of offsets committed in a transaction; not part of the checkpoint's copy of
    /// the position (the runtime keeps a source's event times there itself).
    #[serde(skip)]
    pub event_times: Vec<(i32, i64)>,
}

impl KafkaPosition {
    /// The position of `offsets` with those of `event_times` that belong to them.
    pub(crate) fn with_event_times(
        topic: String,
        offsets: Vec<(i32, i64)>,
        event_times: &BTreeMap<i32, i64>,
    ) -> Self {
        let event_times = offsets
            .iter()
            .filter_map(|(p, _)| event_times.get(p).map(|t| (*p, *t)))
            .collect();
        KafkaPosition {
            topic,
            offsets,
            event_times,
        }
    }
}

/// The event times kept in the metadata of a group's committed offsets, by partition.
pub(crate) fn event_times_of(committed: &TopicPartitionList) -> BTreeMap<i32, i64> {
    committed
        .elements()
        .iter()
        .filter(|e| matches!(e.offset(), Offset::Offset(_)))
        .filter_map(|e| {
            super::sink::event_time_of_metadata(e.metadata()).map(|t| (e.partition(), t))
        })
        .collect()
}

/// Builds Kafka source subtasks.
pub struct KafkaSource<T> {
    brokers: String,
    topic: String,
    group: String,
    decoder: Decoder<T>,
    properties: Vec<(String, String)>,
    client_properties: ClientProperties,
    link: Option<OffsetsLink>,
}

impl<T> KafkaSource<T> {
    /// A source of `topic` decoding every record with `decoder`.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>, decoder: Decoder<T>) -> Self {
        KafkaSource {
            brokers: brokers.into(),
            topic: topic.into(),
            group: "onceflow".into(),
            decoder,
            properties: Vec::new(),
            client_properties: ClientProperties::new(),
            link: None,
        }
    }

    /// Sets the consumer group id (used for committed offsets in transactional-offsets mode).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Sets the properties every client of the job uses (TLS, SASL, timeouts); consumer-only
    /// ones go through [`KafkaSource::property`].
    pub fn client_properties(mut self, properties: ClientProperties) -> Self {
        self.client_properties = properties;
        self
    }

    /// Adds a librdkafka consumer property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Exactly-once modes: start from the group's committed offsets and hand the positions at
    /// each barrier to whoever shares `link`: the transactional-offsets sink, which commits
    /// them with its output, or the two-phase-commit [`crate::kafka::CheckpointSeal`], which
    /// commits them when it seals the checkpoint.
    pub fn offsets_link(mut self, link: OffsetsLink) -> Self {
        self.link = Some(link);
        self
    }

    /// Transactional-offsets mode: the same as [`Self::offsets_link`].
    pub fn transactional_offsets(mut self, link: OffsetsLink) -> Self {
        self.link = Some(link);
        self
    }

    /// Scaled-out mode (`docs/SCALE-OUT.md`): the instance's group member owns the
    /// subscription and each source subtask reads the partition queues of the partitions of
    /// this source's topic the group assigned to the instance. A topic the member does not
    /// subscribe to is read as the member's input topic (with a warning); brokers, group and
    /// consumer properties are the member's. With an [`OffsetsLink`] the positions and the
    /// member's group metadata go to the transactional-offsets sink.
    pub fn in_group(self, member: super::scale::InstanceMember) -> super::scale::GroupSource<T>
    where
        T: 'static,
    {
        let topic = if member.partitions_of(&self.topic).is_some() {
            self.topic
        } else {
            tracing::warn!(
                source_topic = %self.topic,
                member_topic = member.topic(),
                "the scaled-out source reads the member's input topic"
            );
            member.topic().to_string()
        };
        super::scale::GroupSource::new(member, topic, self.decoder, self.link)
    }
}

/// Consumer context that learns each partition's end (last stable offset under
/// read_committed) from librdkafka's statistics. librdkafka's own `consumer_lag` needs offsets
/// stored or committed through the consumer, which this source never does (positions live in
/// the checkpoint), so the reader computes the lag from these ends and its positions.
#[derive(Default)]
pub struct LagContext {
    ends: parking_lot::Mutex<BTreeMap<i32, i64>>,
}

impl ClientContext for LagContext {
    fn stats(&self, stats: Statistics) {
        let mut ends = self.ends.lock();
        for t in stats.topics.values() {
            for (p, part) in &t.partitions {
                let end = if part.ls_offset >= 0 {
                    part.ls_offset
                } else {
                    part.hi_offset
                };
                if *p >= 0 && end >= 0 {
                    ends.insert(*p, end);
                }
            }
        }
    }
}

impl ConsumerContext for LagContext {}

/// One source subtask.
pub struct KafkaSourceReader<T> {
    consumer: BaseConsumer<LagContext>,
    topic: String,
    decoder: Decoder<T>,
    partitions: Vec<i32>,
    positions: BTreeMap<i32, i64>,
    assigned: bool,
    link: Option<OffsetsLink>,
    /// The source node's uid: the link keeps positions per (node, subtask).
    node_uid: String,
    subtask: usize,
    parallelism: usize,
    last_transient_log: std::time::Instant,
    last_lag_report: std::time::Instant,
    /// With a link: the event times kept with the group's committed offsets it starts from.
    committed_event_times: Option<BTreeMap<i32, i64>>,
    /// The event times the watermark strategy handed over for the next position.
    event_times: BTreeMap<i32, i64>,
}

/// Errors librdkafka recovers from by itself (broker down or restarting).
fn is_transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::RequestTimedOut
                | C::OperationTimedOut
        )
    )
}

/// The number of partitions of `topic`, read from the cluster's metadata through `consumer`.
pub(crate) fn partition_count<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
) -> Result<usize, KafkaError> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| KafkaError::client(format!("reading metadata of topic {topic}"), e))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| KafkaError::Config(format!("topic {topic} not found")))?;
    if let Some(e) = t.error() {
        return Err(KafkaError::Config(format!("topic {topic}: {e:?}")));
    }
    if t.partitions().is_empty() {
        return Err(KafkaError::Config(format!(
            "topic {topic} has no partitions"
        )));
    }
    Ok(t.partitions().len())
}

impl<T: Send + 'static> SourceFactory<T> for KafkaSource<T> {
    type Source = KafkaSourceReader<T>;

    fn create(&self, info: &SubtaskInfo) -> onceflow_runtime::Result<KafkaSourceReader<T>> {
        let mut cfg = self.client_properties.client_config(&self.brokers);
        cfg.set("group.id", &self.group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // every partition is assigned at an explicit position (a checkpoint's, the group's
            // or the beginning), so a reset only happens when that position no longer exists:
            // records were deleted (retention, DeleteRecords) before the job read them.
            // librdkafka would jump to the new log start without telling the application;
            // "error" reports it instead, and the source stops rather than skip records
            .set("auto.offset.reset", "error")
            .set("statistics.interval.ms", "1000")
            .set("fetch.wait.max.ms", "50")
            // once a partition's local queue holds queued.min.messages (100k) librdkafka
            // postpones its next fetch by fetch.queue.backoff.ms, 1 s by default: a source
            // that drains 100k records in well under a second then sat idle for the rest of
            // it (the job ran in ~0.5 s bursts with ~0.6 s gaps). Look again soon instead.
            .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
        for (k, v) in &self.properties {
            cfg.set(k, v);
        }
        let consumer: BaseConsumer<LagContext> = cfg
            .create_with_context(LagContext::default())
            .map_err(|e| KafkaError::client("creating the consumer", e))?;
        let n = partition_count(&consumer, &self.topic, META_TIMEOUT)?;
        let partitions: Vec<i32> = (0..n as i32)
            .filter(|p| (*p as usize) % info.parallelism == info.index)
            .collect();
        let mut positions = BTreeMap::new();
        let mut committed_event_times = None;
        if let Some(link) = &self.link {
            // transactional offsets: the group's committed offsets are the truth
            let mut tpl = TopicPartitionList::new();
            for p in &partitions {
                tpl.add_partition(&self.topic, *p);
            }
            let committed = consumer
                .committed_offsets(tpl, META_TIMEOUT)
                .map_err(|e| KafkaError::client("reading the group's committed offsets", e))?;
            for e in committed.elements() {
                if let Offset::Offset(o) = e.offset() {
                    positions.insert(e.partition(), o);
                }
            }
            committed_event_times = Some(event_times_of(&committed));
            link.register_source(&info.node_uid, info.parallelism, consumer.group_metadata());
            tracing::info!(subtask = info.index, ?positions, group = %self.group, "kafka source starts from the group's committed offsets");
        }
        Ok(KafkaSourceReader {
            consumer,
            topic: self.topic.clone(),
            decoder: self.decoder.clone(),
            partitions,
            positions,
            assigned: false,
            link: self.link.clone(),
            node_uid: info.node_uid.clone(),
            subtask: info.index,
            parallelism: info.parallelism,
            last_transient_log: std::time::Instant::now()
                .checked_sub(Duration::from_secs(60))
                .unwrap_or_else(std::time::Instant::now),
            last_lag_report: std::time::Instant::now(),
            committed_event_times,
            event_times: BTreeMap::new(),
        })
    }
}

impl<T> KafkaSourceReader<T> {
    /// Sets `onceflow_kafka_consumer_lag` (partition end minus this subtask's position) at
    /// most once a second.
    fn report_lag(&mut self) {
        if self.last_lag_report.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last_lag_report = std::time::Instant::now();
        let ends = self.consumer.context().ends.lock().clone();
        for p in &self.partitions {
            let (Some(end), Some(pos)) = (ends.get(p), self.positions.get(p)) else {
                continue;
            };
            metrics::gauge!(m::CONSUMER_LAG, "topic" => self.topic.clone(), "partition" => p.to_string())
                .set((end - pos).max(0) as f64);
        }
    }

    /// The error for input deleted before it was read: names each partition whose position
    /// lies below the partition's log start, and what the operator can do.
    fn deleted_input_error(&self, e: &rdkafka::error::KafkaError) -> KafkaError {
        let mut gone = Vec::new();
        for p in &self.partitions {
            // a partition without a position was assigned at its beginning: nothing skipped
            let Some(pos) = self.positions.get(p).copied() else {
                continue;
            };
            if let Ok((low, high)) = self
                .consumer
                .fetch_watermarks(&self.topic, *p, META_TIMEOUT)
            {
                if pos < low {
                    gone.push(format!(
                        "partition {p}: offsets {pos}..{low} ({} records)",
                        low - pos
                    ));
                } else if pos > high {
                    gone.push(format!(
                        "partition {p}: the job had read up to offset {pos}, the partition now \
                         ends at {high} (the broker lost records it had acknowledged)"
                    ));
                }
            }
        }
        let which = if gone.is_empty() {
            format!("({e})")
        } else {
            gone.join(", ")
        };
        metrics::counter!(m::INPUT_DELETED_BEFORE_READ, "topic" => self.topic.clone()).increment(1);
        KafkaError::DataLoss(format!(
            "input topic {} lost records before this job read them: {which}. They were \
             deleted by the topic's retention (retention.ms / retention.bytes) or by \
             DeleteRecords while the job was behind or stopped; onceflow stops instead of \
             skipping them. Raise the input topic's retention, or accept the loss by \
             starting over with a new --group and a new output topic",
            self.topic
        ))
    }

    fn assign(&mut self) -> onceflow_runtime::Result<()> {
        let mut tpl = TopicPartitionList::new();
        for p in &self.partitions {
            let off = match self.positions.get(p) {
                Some(o) => Offset::Offset(*o),
                None => Offset::Beginning,
            };
            tpl.add_partition_offset(&self.topic, *p, off)
                .map_err(|e| KafkaError::client("building the assignment", e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| KafkaError::client("assigning partitions", e))?;
        tracing::info!(subtask = self.subtask, parallelism = self.parallelism, partitions = ?self.partitions, positions = ?self.positions, "kafka source assigned");
        self.assigned = true;
        Ok(())
    }
}

#[async_trait]
impl<T: Send + 'static> Source<T> for KafkaSourceReader<T> {
    type Position = KafkaPosition;

    fn restore(&mut self, positions: Vec<KafkaPosition>) -> onceflow_runtime::Result<()> {
        for pos in positions {
            if pos.topic != self.topic {
                continue;
            }
            for (p, o) in pos.offsets {
                if !self.partitions.contains(&p) {
                    continue;
                }
                if self.link.is_some() {
                    // committed offsets win; warn when the checkpoint disagrees
                    if let Some(c) = self.positions.get(&p) {
                        if *c != o {
                            tracing::warn!(partition = p, committed = c, checkpoint = o, "checkpoint position differs from the group's committed offset; using the committed offset");
                        }
                        continue;
                    }
                }
                self.positions.insert(p, o);
            }
        }
        Ok(())
    }

    fn splits(&self) -> Vec<u32> {
        self.partitions.iter().map(|p| *p as u32).collect()
    }

    fn keep_event_times(&mut self, times: &[(u32, i64)]) {
        self.event_times = times.iter().map(|(p, t)| (*p as i32, *t)).collect();
    }

    fn kept_event_times(&self) -> Option<Vec<(u32, i64)>> {
        self.committed_event_times
            .as_ref()
            .map(|m| m.iter().map(|(p, t)| (*p as u32, *t)).collect())
    }

    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> onceflow_runtime::Result<SourcePoll> {
        if !self.assigned {
            self.assign()?;
            if let Some(link) = &self.link {
                link.source_started();
            }
        }
        if self.partitions.is_empty() {
            return Ok(SourcePoll::Idle(Duration::from_millis(100)));
        }
        self.report_lag();
        let mut n = 0;
        while n < max {
            match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Err(e)) if is_transient(&e) => {
                    // librdkafka reconnects by itself (e.g. a broker restart): wait
                    if self.last_transient_log.elapsed() > Duration::from_secs(5) {
                        tracing::warn!(subtask = self.subtask, error = %e, "kafka source: broker unavailable, retrying");
                        self.last_transient_log = std::time::Instant::now();
                    }
                    return Ok(SourcePoll::Idle(Duration::from_millis(100)));
                }
                Some(Err(e))
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::AutoOffsetReset) =>
                {
                    return Err(self.deleted_input_error(&e).into());
                }
                Some(Err(e)) => {
                    return Err(KafkaError::client("consuming", e).into());
                }
                Some(Ok(msg)) => {
                    // only partitions of `self.topic` are assigned; the message is copied out
                    // of librdkafka's buffer once and then moved into the decoder
                    let km = KafkaMessage {
                        topic: self.topic.clone(),
                        partition: msg.partition(),
                        offset: msg.offset(),
                        key: msg.key().map(<[u8]>::to_vec),
                        payload: msg.payload().map(<[u8]>::to_vec),
                        timestamp_ms: msg.timestamp().to_millis(),
                    };
                    self.positions.insert(km.partition, km.offset + 1);
                    out.push(self.decoder.decode_owned(km));
                    n += 1;
                }
            }
        }
        if n > 0 {
            metrics::counter!(m::RECORDS_CONSUMED, "topic" => self.topic.clone())
                .increment(n as u64);
            Ok(SourcePoll::Ready)
        } else {
            Ok(SourcePoll::Idle(Duration::from_millis(5)))
        }
    }

    fn snapshot_position(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPosition> {
        let pos = KafkaPosition::with_event_times(
            self.topic.clone(),
            self.positions.iter().map(|(p, o)| (*p, *o)).collect(),
            &self.event_times,
        );
        if let Some(link) = &self.link {
            link.record_positions(checkpoint, &self.node_uid, self.subtask, &pos);
        }
        Ok(pos)
    }
}
