//! Transactional offsets (Kafka Streams' EOS v2 model, Kafka -> Kafka): one transactional
//! producer (`{prefix}-offsets`) per job instance, shared by its sink subtasks. Sink subtasks
//! write live into the open transaction until their barrier n; after it they buffer. When
//! checkpoint n is complete (its operator state durable), the first sink subtask to hear of it
//! sends the source positions at barrier n with send_offsets_to_transaction (group metadata
//! included, each partition's metadata `onceflow-chk=n`) and commits: output and input
//! progress commit together. Then buffered records go into the next transaction.
//! A scaled-out instance (`docs/SCALE-OUT.md`) also hands the link its keyed state changelog
//! records per checkpoint ([`OffsetsLink::write_for_checkpoint`]); the commit of checkpoint n
//! sends those of every checkpoint up to n just before the offsets, and the group metadata
//! comes live from the instance's group member (its generation changes with each rebalance).
//! Several sources (the input and the job's repartition topics) and several sinks (the output
//! and the repartition writers) share one link: positions and barriers are kept per (node,
//! subtask), so the commit of checkpoint n waits for every subtask of every source and sends
//! the offsets of all their partitions together, and a repartition writer's records after its
//! barrier n go to the next transaction exactly like output records.
//! On recovery [`committed_checkpoint`] names the checkpoint whose positions the group
//! committed (restore exactly that one); init_transactions fences the previous instance and
//! aborts its open transaction.

use crate::kafka::ClientProperties;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_runtime::{CheckpointId, SubtaskInfo};
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::super::config::KafkaSinkConfig;
use super::super::scale::{
    ChangelogCache, ChangelogRecord, GroupMember, RoutedRecord, CHANGELOG_BYTES_PER_COMMIT,
    CHANGELOG_RECORDS,
};
use super::super::source::KafkaPosition;
use super::super::{metrics as m, KafkaError};
use super::producer::{self, blocking, Ctx, Prod};
use super::{KafkaPending, KafkaSink, SinkRecord};

const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CHK_META_PREFIX: &str = "onceflow-chk=";
const EVENT_TIME_META: &str = ";event-time=";

/// The metadata of a source offset this sink commits: `onceflow-chk=<checkpoint>`, and
/// `;event-time=<ms>` when the source tracks the partition's event time (the highest event
/// time read before the offset, from which the partition's watermark resumes, as Kafka
/// Streams keeps its partition time in the commit's metadata).
pub(crate) fn offset_metadata(checkpoint: CheckpointId, event_time: Option<i64>) -> String {
    match event_time {
        Some(t) => format!("{CHK_META_PREFIX}{checkpoint}{EVENT_TIME_META}{t}"),
        None => format!("{CHK_META_PREFIX}{checkpoint}"),
    }
}

/// The checkpoint named by an offset's metadata ([`offset_metadata`]), if it is onceflow's.
pub(crate) fn checkpoint_of_metadata(metadata: &str) -> Option<CheckpointId> {
    let rest = metadata.strip_prefix(CHK_META_PREFIX)?;
    let end = rest.find(';').unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The event time kept in an offset's metadata ([`offset_metadata`]), if any.
pub(crate) fn event_time_of_metadata(metadata: &str) -> Option<i64> {
    checkpoint_of_metadata(metadata)?;
    let at = metadata.find(EVENT_TIME_META)? + EVENT_TIME_META.len();
    let rest = &metadata[at..];
    let end = rest.find(';').unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A source or sink subtask: its node uid and subtask index.
type SubtaskKey = (String, usize);

#[derive(Default)]
struct LinkState {
    /// Parallelism of every source node that records positions, by node uid.
    sources: BTreeMap<String, usize>,
    group_metadata: Option<Arc<ConsumerGroupMetadata>>,
    /// Scaled-out mode: the instance's group member, asked for its metadata at every commit
    /// (the generation changes with each rebalance).
    group_member: Option<Arc<GroupMember>>,
    /// Changelog records per checkpoint whose barrier released them, until that checkpoint
    /// (or a later one) commits.
    changelog: BTreeMap<CheckpointId, Vec<ChangelogRecord>>,
    /// The instance's local changelog cache: told each commit's changelog records.
    changelog_cache: Option<Arc<ChangelogCache>>,
    positions: BTreeMap<CheckpointId, BTreeMap<SubtaskKey, KafkaPosition>>,
    /// When the first source subtask reached each barrier.
    barrier_at: BTreeMap<CheckpointId, Instant>,
    /// When the first source subtask first polled (no transaction of this run is older).
    started_at: Option<Instant>,
}

/// A record a sink subtask hands to the instance transaction.
enum Outgoing {
    /// An output record (default topic unless it names one; partition by its key).
    Output(SinkRecord),
    /// A record for one partition of an internal topic (a repartition record).
    Routed(RoutedRecord),
}

struct Instance {
    producer: Arc<Prod>,
    ctx: Ctx,
    committed: CheckpointId,
    /// The last barrier each sink subtask passed (until that checkpoint commits): its later
    /// records wait in `segments` for the next transaction.
    sealed: BTreeMap<SubtaskKey, CheckpointId>,
    segments: BTreeMap<CheckpointId, Vec<Outgoing>>,
    records_in_txn: u64,
    since: Instant,
}

struct LinkInner {
    state: Mutex<LinkState>,
    instance: tokio::sync::Mutex<Option<Instance>>,
}

/// Shared by the source and the sink of one job instance in transactional-offsets mode.
#[derive(Clone)]
pub struct OffsetsLink(Arc<LinkInner>);

impl Default for OffsetsLink {
    fn default() -> Self {
        OffsetsLink(Arc::new(LinkInner {
            state: Mutex::new(LinkState::default()),
            instance: tokio::sync::Mutex::new(None),
        }))
    }
}

impl OffsetsLink {
    /// A new link.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the instance's transactional producer now (init_transactions fences the
    /// previous instance and waits for its commit in progress). Call it before
    /// [`committed_checkpoint`], so no other instance can commit offsets afterwards. Blocking:
    /// call it outside async code. `_sink_parallelism` is not needed: sink subtasks are
    /// known by node and index as they write.
    pub fn fence_previous(
        &self,
        cfg: &KafkaSinkConfig,
        _sink_parallelism: usize,
    ) -> super::super::Result<()> {
        let mut inst = self.0.instance.blocking_lock();
        if inst.is_some() {
            return Ok(());
        }
        *inst = Some(new_instance(cfg)?);
        Ok(())
    }

    /// A source node of `parallelism` subtasks records its positions here; `gm` is its
    /// consumer's group metadata.
    pub(crate) fn register_source(
        &self,
        node_uid: &str,
        parallelism: usize,
        gm: Option<ConsumerGroupMetadata>,
    ) {
        let mut s = self.0.state.lock();
        s.sources.insert(node_uid.to_string(), parallelism);
        if s.group_metadata.is_none() {
            s.group_metadata = gm.map(Arc::new);
        }
    }

    /// A scaled-out source node of `parallelism` subtasks records its positions here; the
    /// group metadata comes live from `member` at each commit.
    pub(crate) fn register_group_member(
        &self,
        node_uid: &str,
        parallelism: usize,
        member: Arc<GroupMember>,
    ) {
        let mut s = self.0.state.lock();
        s.sources.insert(node_uid.to_string(), parallelism);
        s.group_member = Some(member);
    }

    /// Records released by barrier `checkpoint` (the keyed state changes of an operator
    /// subtask): they go into the transaction that commits `checkpoint`, with its output and
    /// offsets. Records of a checkpoint that never completes go with the next one that does.
    pub fn write_for_checkpoint(&self, checkpoint: CheckpointId, records: Vec<ChangelogRecord>) {
        if records.is_empty() {
            return;
        }
        self.0
            .state
            .lock()
            .changelog
            .entry(checkpoint)
            .or_default()
            .extend(records);
    }

    /// Hands the changelog records of every commit, once it committed, to `cache` (before
    /// the next transaction writes changelog records).
    pub fn cache_changelog(&self, cache: Arc<ChangelogCache>) {
        self.0.state.lock().changelog_cache = Some(cache);
    }

    /// Takes the changelog records of every checkpoint up to `checkpoint`, oldest first.
    fn take_changelog_up_to(&self, checkpoint: CheckpointId) -> Vec<ChangelogRecord> {
        let mut st = self.0.state.lock();
        let later = st.changelog.split_off(&(checkpoint + 1));
        let upto = std::mem::replace(&mut st.changelog, later);
        upto.into_values().flatten().collect()
    }

    pub(crate) fn record_positions(
        &self,
        checkpoint: CheckpointId,
        node_uid: &str,
        subtask: usize,
        pos: &KafkaPosition,
    ) {
        let mut st = self.0.state.lock();
        st.positions
            .entry(checkpoint)
            .or_default()
            .insert((node_uid.to_string(), subtask), pos.clone());
        st.barrier_at.entry(checkpoint).or_insert_with(Instant::now);
    }

    /// Notes that a source subtask polls for the first time.
    pub(crate) fn source_started(&self) {
        self.0
            .state
            .lock()
            .started_at
            .get_or_insert_with(Instant::now);
    }

    /// When the first source subtask first polled.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        self.0.state.lock().started_at
    }

    /// When the first source subtask reached barrier `checkpoint` (if still remembered).
    pub(crate) fn barrier_at(&self, checkpoint: CheckpointId) -> Option<Instant> {
        self.0.state.lock().barrier_at.get(&checkpoint).copied()
    }
}

impl OffsetsLink {
    /// The source positions at barrier `checkpoint` of every subtask of every source node,
    /// each partition's metadata naming the checkpoint, and the group metadata for
    /// send_offsets_to_transaction.
    pub(crate) fn source_offsets(
        &self,
        checkpoint: CheckpointId,
    ) -> super::super::Result<(TopicPartitionList, Arc<ConsumerGroupMetadata>)> {
        let (offsets, gm) = {
            let st = self.0.state.lock();
            let Some(by_subtask) = st.positions.get(&checkpoint) else {
                return Err(KafkaError::Protocol(format!("no source positions recorded for checkpoint {checkpoint} (is the KafkaSource given the same OffsetsLink?)")));
            };
            for (node, parallelism) in &st.sources {
                let recorded = (0..*parallelism)
                    .filter(|i| by_subtask.contains_key(&(node.clone(), *i)))
                    .count();
                if recorded < *parallelism {
                    return Err(KafkaError::Protocol(format!(
                        "source positions of checkpoint {checkpoint} are incomplete (source {node}: {recorded} of {parallelism} subtasks)"
                    )));
                }
            }
            let live = st
                .group_member
                .as_ref()
                .and_then(|m| m.group_metadata())
                .map(Arc::new);
            let Some(gm) = live.or_else(|| st.group_metadata.clone()) else {
                return Err(KafkaError::Config(
                    "the source has no consumer group metadata".into(),
                ));
            };
            (by_subtask.values().cloned().collect::<Vec<_>>(), gm)
        };
        let mut tpl = TopicPartitionList::new();
        for pos in &offsets {
            for (p, o) in &pos.offsets {
                tpl.add_partition_offset(&pos.topic, *p, Offset::Offset(*o))
                    .map_err(|e| KafkaError::client("building offsets", e))?;
                if let Some(mut el) = tpl.find_partition(&pos.topic, *p) {
                    let event_time = pos
                        .event_times
                        .iter()
                        .find(|(q, _)| q == p)
                        .map(|(_, t)| *t);
                    el.set_metadata(offset_metadata(checkpoint, event_time));
                }
            }
        }
        Ok((tpl, gm))
    }

    /// Drops the positions of checkpoints up to `checkpoint` (committed).
    pub(crate) fn forget_up_to(&self, checkpoint: CheckpointId) {
        let mut st = self.0.state.lock();
        st.positions.retain(|c, _| *c > checkpoint);
        st.barrier_at.retain(|c, _| *c > checkpoint);
    }
}

fn new_instance(cfg: &KafkaSinkConfig) -> super::super::Result<Instance> {
    let id = format!("{}-offsets", cfg.transactional_id_prefix);
    let (p, ctx) = producer::init_transactional(cfg, &id, TXN_CALL_TIMEOUT)?;
    p.begin_transaction()
        .map_err(|e| KafkaError::client("begin_transaction", e))?;
    metrics::counter!(m::FENCING_EVENTS, "kind" => "recovery").increment(1);
    Ok(Instance {
        producer: p,
        ctx,
        committed: 0,
        sealed: BTreeMap::new(),
        segments: BTreeMap::new(),
        records_in_txn: 0,
        since: Instant::now(),
    })
}

/// One transactional-offsets sink subtask: of the output sink, or of a repartition writer.
pub struct OffsetsWriter {
    cfg: KafkaSinkConfig,
    link: OffsetsLink,
    /// (node uid, subtask index): which sink subtask this is among all of the instance's.
    key: SubtaskKey,
}

impl OffsetsWriter {
    pub(crate) fn new(sink: &KafkaSink, info: &SubtaskInfo, link: OffsetsLink) -> Self {
        Self::for_config(sink.cfg.clone(), info, link)
    }

    /// A sink subtask writing into the instance transaction of `link` with the instance
    /// producer's configuration `cfg`.
    pub(crate) fn for_config(cfg: KafkaSinkConfig, info: &SubtaskInfo, link: OffsetsLink) -> Self {
        metrics::gauge!(m::TXN_TIMEOUT_SECONDS).set(cfg.transaction_timeout.as_secs_f64());
        OffsetsWriter {
            cfg,
            link,
            key: (info.node_uid.clone(), info.index),
        }
    }

    /// The first subtask creates the instance's producer (fencing the previous instance).
    pub(crate) async fn recover(&mut self) -> onceflow_runtime::Result<()> {
        let mut inst = self.link.0.instance.lock().await;
        if inst.is_some() {
            return Ok(());
        }
        let cfg = self.cfg.clone();
        *inst = Some(blocking(move || new_instance(&cfg)).await??);
        Ok(())
    }

    pub(crate) async fn write_batch(
        &mut self,
        records: Vec<SinkRecord>,
    ) -> onceflow_runtime::Result<()> {
        self.write(records.into_iter().map(Outgoing::Output).collect())
            .await
    }

    /// Writes records bound for given partitions of internal topics (repartition records)
    /// into the instance transaction, after this subtask's barrier n into the next one.
    pub(crate) async fn write_routed(
        &mut self,
        records: Vec<RoutedRecord>,
    ) -> onceflow_runtime::Result<()> {
        self.write(records.into_iter().map(Outgoing::Routed).collect())
            .await
    }

    async fn write(&mut self, records: Vec<Outgoing>) -> onceflow_runtime::Result<()> {
        let mut guard = self.link.0.instance.lock().await;
        let inst = guard.as_mut().ok_or_else(|| {
            onceflow_runtime::Error::Internal("offsets sink not recovered".into())
        })?;
        match inst.sealed.get(&self.key).copied() {
            Some(c) if c > inst.committed => {
                inst.segments.entry(c).or_default().extend(records);
            }
            _ => {
                for r in &records {
                    send(&inst.producer, &self.cfg.default_topic, r)?;
                }
                inst.records_in_txn += records.len() as u64;
                inst.producer.poll(Duration::ZERO);
                metrics::counter!(m::RECORDS_PRODUCED, "mode" => "transactional-offsets")
                    .increment(records.len() as u64);
                metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => "instance")
                    .set(inst.since.elapsed().as_secs_f64());
            }
        }
        if let Some(e) = producer::take_delivery_error(&inst.ctx) {
            return Err(KafkaError::Protocol(format!("delivery failed: {e}")).into());
        }
        Ok(())
    }

    pub(crate) async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPending> {
        let mut guard = self.link.0.instance.lock().await;
        let inst = guard.as_mut().ok_or_else(|| {
            onceflow_runtime::Error::Internal("offsets sink not recovered".into())
        })?;
        inst.sealed.insert(self.key.clone(), checkpoint);
        Ok(KafkaPending::Offsets { checkpoint })
    }

    pub(crate) async fn commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<()> {
        let mut guard = self.link.0.instance.lock().await;
        let inst = guard.as_mut().ok_or_else(|| {
            onceflow_runtime::Error::Internal("offsets sink not recovered".into())
        })?;
        if inst.committed >= checkpoint {
            return Ok(());
        }
        let (tpl, gm) = self.link.source_offsets(checkpoint)?;
        // records after earlier (failed) barriers belong before this commit
        let earlier: Vec<CheckpointId> =
            inst.segments.range(..checkpoint).map(|(c, _)| *c).collect();
        for c in earlier {
            if let Some(recs) = inst.segments.remove(&c) {
                for r in &recs {
                    send(&inst.producer, &self.cfg.default_topic, r)?;
                }
                inst.records_in_txn += recs.len() as u64;
            }
        }
        let changelog = self.link.take_changelog_up_to(checkpoint);
        let mut changelog_bytes = 0usize;
        for r in &changelog {
            producer::send_to_partition(
                &inst.producer,
                &r.topic,
                r.partition,
                &r.key,
                r.value.as_deref(),
            )?;
            changelog_bytes += r.size();
        }
        let p = inst.producer.clone();
        let t0 = Instant::now();
        let r = blocking(move || -> std::result::Result<(), (bool, String)> {
            producer::drain(&p, TXN_CALL_TIMEOUT).map_err(|e| (false, e.to_string()))?;
            p.send_offsets_to_transaction(&tpl, &gm, TXN_CALL_TIMEOUT)
                .map_err(|e| {
                    (
                        producer::is_fenced(&e),
                        format!("send_offsets_to_transaction: {e}"),
                    )
                })?;
            p.commit_transaction(TXN_CALL_TIMEOUT)
                .map_err(|e| (producer::is_fenced(&e), format!("commit_transaction: {e}")))?;
            p.begin_transaction()
                .map_err(|e| (producer::is_fenced(&e), format!("begin_transaction: {e}")))
        })
        .await?;
        if let Err((fenced, msg)) = r {
            if fenced {
                metrics::counter!(m::FENCING_EVENTS, "kind" => "fenced").increment(1);
                return Err(KafkaError::Fenced(format!("checkpoint {checkpoint}: {msg}: its epoch was bumped: another instance with the same transactional id prefix took over, or the transaction outlived transaction.timeout.ms")).into());
            }
            // the transaction cannot be trusted any more: fail the job, recovery replays. Its
            // output and the offsets that name the checkpoint commit or abort together, so
            // nothing is lost (e.g. messages that timed out during a stall)
            return Err(KafkaError::Aborted(format!(
                "transactional-offsets commit of checkpoint {checkpoint} failed: {msg}; the job restarts from the group's committed offsets"
            ))
            .into());
        }
        metrics::histogram!(m::TXN_COMMIT_SECONDS, "mode" => "transactional-offsets")
            .record(t0.elapsed().as_secs_f64());
        metrics::histogram!(m::RECORDS_PER_TXN).record(inst.records_in_txn as f64);
        metrics::histogram!(m::OUTPUT_LATENCY_SECONDS, "mode" => "transactional-offsets")
            .record(inst.since.elapsed().as_secs_f64());
        if !changelog.is_empty() {
            metrics::counter!(CHANGELOG_RECORDS).increment(changelog.len() as u64);
            metrics::histogram!(CHANGELOG_BYTES_PER_COMMIT).record(changelog_bytes as f64);
            let cache = self.link.0.state.lock().changelog_cache.clone();
            if let Some(cache) = cache {
                // under the instance lock: no changelog record of the next transaction is
                // sent before the cache read the partitions' high watermarks
                let p = inst.producer.clone();
                blocking(move || {
                    cache.committed(&changelog, &|topic: &str, partition: i32| {
                        p.client()
                            .fetch_watermarks(topic, partition, Duration::from_secs(5))
                            .map(|(_, high)| high)
                            .map_err(|e| e.to_string())
                    })
                })
                .await?;
            }
        }
        inst.committed = checkpoint;
        inst.records_in_txn = 0;
        inst.since = Instant::now();
        inst.sealed.retain(|_, c| *c > checkpoint);
        let later: Vec<CheckpointId> = inst.segments.keys().copied().collect();
        for c in later {
            if let Some(recs) = inst.segments.remove(&c) {
                for r in &recs {
                    send(&inst.producer, &self.cfg.default_topic, r)?;
                }
                inst.records_in_txn += recs.len() as u64;
                if c > checkpoint {
                    // a subtask already past a later barrier keeps buffering what comes next
                    tracing::debug!(checkpoint = c, "records of a later barrier sent early");
                }
            }
        }
        self.link.forget_up_to(checkpoint);
        tracing::debug!(checkpoint, "transactional-offsets commit");
        Ok(())
    }
}

/// Sends one record into the open transaction.
fn send(p: &Prod, default_topic: &str, r: &Outgoing) -> super::super::Result<()> {
    match r {
        Outgoing::Output(r) => producer::send(p, default_topic, r),
        Outgoing::Routed(r) => {
            producer::send_to_partition(p, &r.topic, r.partition, &r.key, r.value.as_deref())
        }
    }
}

/// The checkpoint whose source positions the consumer group `group` committed for `topic`
/// (from the offsets' metadata), `None` if the group has no committed offsets.
pub fn committed_checkpoint(
    brokers: &str,
    properties: &ClientProperties,
    group: &str,
    topic: &str,
) -> super::super::Result<Option<CheckpointId>> {
    let consumer: BaseConsumer = properties
        .client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| KafkaError::client("creating a consumer", e))?;
    // a cluster that just restarted may answer late (coordinators loading, transaction
    // markers of an aborted predecessor still on their way to the offsets): both calls are
    // retried within the coordinator budget like every other coordinator request
    let md = crate::kafka::retry::blocking(
        &format!("metadata of {topic}"),
        "cluster",
        crate::kafka::retry::COORDINATOR_BUDGET,
        || consumer.fetch_metadata(Some(topic), Duration::from_secs(30)),
    )?;
    let mut tpl = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            tpl.add_partition(topic, p.id());
        }
    }
    let committed = crate::kafka::retry::blocking(
        &format!("reading the committed offsets of group {group}"),
        &format!("group coordinator of {group}"),
        crate::kafka::retry::COORDINATOR_BUDGET,
        || consumer.committed_offsets(tpl.clone(), Duration::from_secs(30)),
    )?;
    let mut found: Option<CheckpointId> = None;
    for e in committed.elements() {
        if !matches!(e.offset(), Offset::Offset(_)) {
            continue;
        }
        let Some(c) = checkpoint_of_metadata(e.metadata()) else {
            return Err(KafkaError::Config(format!(
                "group {group} has an offset for {topic}/{} without onceflow checkpoint metadata (`{}`): it was committed by another application; use another group",
                e.partition(),
                e.metadata()
            )));
        };
        found = Some(found.map_or(c, |f| f.max(c)));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u8) -> ChangelogRecord {
        ChangelogRecord {
            topic: "t".into(),
            partition: 0,
            key: vec![n],
            value: Some(vec![n]),
        }
    }

    #[test]
    fn offset_metadata_names_the_checkpoint_and_the_event_time() {
        let m = offset_metadata(12, Some(1_700_000_899_950));
        assert_eq!(m, "onceflow-chk=12;event-time=1700000899950");
        assert_eq!(checkpoint_of_metadata(&m), Some(12));
        assert_eq!(event_time_of_metadata(&m), Some(1_700_000_899_950));
        assert_eq!(
            event_time_of_metadata(&offset_metadata(3, Some(-7))),
            Some(-7)
        );
        // what earlier builds committed: a checkpoint, no event time
        assert_eq!(checkpoint_of_metadata("onceflow-chk=9"), Some(9));
        assert_eq!(event_time_of_metadata("onceflow-chk=9"), None);
        // another application's metadata is neither
        assert_eq!(checkpoint_of_metadata("event-time=5"), None);
        assert_eq!(event_time_of_metadata("x;event-time=5"), None);
        assert_eq!(
            event_time_of_metadata("onceflow-chk=1;event-time=five"),
            None
        );
    }

    #[test]
    fn a_commit_waits_for_every_subtask_of_every_source() {
        let link = OffsetsLink::new();
        link.register_source("n00-input", 2, None);
        link.register_source("n03-repartition_reader", 2, None);
        let pos = |topic: &str, p: i32| KafkaPosition {
            topic: topic.into(),
            offsets: vec![(p, 10)],
            event_times: Vec::new(),
        };
        link.record_positions(4, "n00-input", 0, &pos("in", 0));
        link.record_positions(4, "n00-input", 1, &pos("in", 1));
        // the same subtask indices of the other source do not count for it
        link.record_positions(4, "n03-repartition_reader", 1, &pos("rp", 1));
        let Err(err) = link.source_offsets(4) else {
            panic!("one subtask of the repartition reader is missing")
        };
        let err = err.to_string();
        assert!(
            err.contains("source n03-repartition_reader: 1 of 2 subtasks"),
            "{err}"
        );
        link.record_positions(4, "n03-repartition_reader", 0, &pos("rp", 0));
        // complete: only the group metadata is missing here
        let Err(err) = link.source_offsets(4) else {
            panic!("no group metadata was registered")
        };
        let err = err.to_string();
        assert!(err.contains("no consumer group metadata"), "{err}");
    }

    #[test]
    fn changelog_records_of_a_checkpoint_that_never_committed_go_with_the_next_commit() {
        let link = OffsetsLink::new();
        link.write_for_checkpoint(3, vec![record(3)]);
        link.write_for_checkpoint(1, vec![record(1)]);
        link.write_for_checkpoint(2, vec![record(2), record(20)]);
        link.write_for_checkpoint(2, Vec::new());
        // checkpoint 1 failed: the commit of 2 carries 1's records first, then 2's; 3 waits
        assert_eq!(
            link.take_changelog_up_to(2),
            vec![record(1), record(2), record(20)]
        );
        assert!(link.take_changelog_up_to(2).is_empty());
        assert_eq!(link.take_changelog_up_to(3), vec![record(3)]);
    }
}
