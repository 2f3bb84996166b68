//! The instance's member thread and its partition queues: one [`GroupMember`] per instance
//! owns the subscription, a thread polls it (rebalance callbacks run there), and every
//! partition of every subscribed topic (the input and the job's repartition topics) has its
//! own librdkafka queue, split off before the first poll, so the source subtask that owns a
//! partition reads it straight from the one consumer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::message::Message;

use super::member::{GroupMember, MemberConfig, MemberContext, RebalanceListener};
use crate::kafka::KafkaError;

const META_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the member thread waits in one poll: the longest a rebalance callback waits to run.
const MEMBER_POLL: Duration = Duration::from_millis(50);

/// One partition's queue of records, read by the source subtask that owns the partition.
pub type RecordQueue = PartitionQueue<MemberContext>;

struct Inner {
    member: Arc<GroupMember>,
    /// The input topic.
    topic: String,
    /// Every partition's queue, by topic and partition.
    queues: BTreeMap<String, BTreeMap<i32, Arc<RecordQueue>>>,
    /// Set when the member thread saw something that makes this instance's reads untrustworthy
    /// (a record delivered outside its partition queue); the source fails with it.
    broken: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The assignment the current dataflow was built for ([`InstanceMember::pin_assignment`]);
    /// `u64::MAX` until pinned: every owned partition counts.
    pinned: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        self.member.close();
    }
}

/// The group membership of one instance, shared by its source subtasks (cheap to clone). The
/// member thread stops and the member closes when the last clone is dropped.
#[derive(Clone)]
pub struct InstanceMember(Arc<Inner>);

impl InstanceMember {
    /// Joins the group of `config`, splits one queue per partition of every topic of
    /// `config.topics` (`input`, which must be among them, and the job's repartition topics,
    /// which must exist) and starts the member thread.
    pub fn start(
        config: &MemberConfig,
        listener: Arc<dyn RebalanceListener>,
        input: &str,
    ) -> Result<InstanceMember, KafkaError> {
        if !config.topics.iter().any(|t| t == input) {
            return Err(KafkaError::Config(format!(
                "the input topic {input} is not among the member's topics {:?}",
                config.topics
            )));
        }
        let member = Arc::new(GroupMember::join(config, listener)?);
        let mut queues = BTreeMap::new();
        for topic in &config.topics {
            let n = member.partition_count(topic, META_TIMEOUT)?;
            let mut split = BTreeMap::new();
            for p in 0..n as i32 {
                let q = member.split_partition_queue(topic, p).ok_or_else(|| {
                    KafkaError::Config(format!("cannot split the queue of {topic}-{p}"))
                })?;
                split.insert(p, Arc::new(q));
            }
            tracing::info!(
                instance = %config.instance_id,
                topic = %topic,
                partitions = n,
                "partition queues split"
            );
            queues.insert(topic.clone(), split);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(Mutex::new(None));
        let thread = {
            let member = member.clone();
            let stop = stop.clone();
            let broken = broken.clone();
            let instance = config.instance_id.clone();
            std::thread::Builder::new()
                .name(format!("onceflow-member-{instance}"))
                .spawn(move || member_thread(&member, &stop, &broken, &instance))
                .map_err(|e| KafkaError::Config(format!("cannot start the member thread: {e}")))?
        };
        Ok(InstanceMember(Arc::new(Inner {
            member,
            topic: input.to_string(),
            queues,
            broken,
            stop,
            thread: Mutex::new(Some(thread)),
            pinned: AtomicU64::new(u64::MAX),
        })))
    }

    /// The group member.
    pub fn member(&self) -> &Arc<GroupMember> {
        &self.0.member
    }

    /// The input topic.
    pub fn topic(&self) -> &str {
        &self.0.topic
    }

    /// The topics the member subscribed to, each with its partition queues.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.0.queues.keys().map(String::as_str)
    }

    /// The number of partitions of the input topic.
    pub fn partitions(&self) -> usize {
        self.partitions_of(&self.0.topic).unwrap_or(0)
    }

    /// The number of partitions of `topic`, `None` if the member did not subscribe to it.
    pub fn partitions_of(&self, topic: &str) -> Option<usize> {
        self.0.queues.get(topic).map(BTreeMap::len)
    }

    /// The queue of `topic`'s partition `partition`.
    pub fn queue(&self, topic: &str, partition: i32) -> Option<Arc<RecordQueue>> {
        self.0.queues.get(topic)?.get(&partition).cloned()
    }

    /// Pins the partitions the next dataflow works on: the ones owned now, but for those
    /// being revoked. Its source subtasks and its state restore both take
    /// [`InstanceMember::owned_as_built`], so a partition assigned while the dataflow is
    /// being built is neither read nor restored by it (the instance builds the next dataflow
    /// for it). Returns the pinned assignment.
    pub fn pin_assignment(&self) -> u64 {
        let latest = self.0.member.latest_assignment();
        self.0.pinned.store(latest, Ordering::SeqCst);
        latest
    }

    /// The partitions of `topic` owned under the pinned assignment or an earlier one, each
    /// with the number of the assignment that gave it (every owned one before any pin),
    /// without those being revoked ([`GroupMember::kept`]): a dataflow built while a revoke
    /// callback ends the previous one runs before the revoked partitions leave the owned
    /// set, and must not take them.
    pub fn owned_as_built(&self, topic: &str) -> BTreeMap<i32, u64> {
        let pinned = self.0.pinned.load(Ordering::SeqCst);
        self.0
            .member
            .kept()
            .into_iter()
            .filter(|(tp, a)| tp.topic == topic && *a <= pinned)
            .map(|(tp, a)| (tp.partition, a))
            .collect()
    }

    /// Why the instance's reads can no longer be trusted, if they cannot.
    pub fn broken(&self) -> Option<String> {
        self.0.broken.lock().clone()
    }
}

fn member_thread(
    member: &GroupMember,
    stop: &AtomicBool,
    broken: &Mutex<Option<String>>,
    instance: &str,
) {
    let mut last_error_log: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        match member.poll(MEMBER_POLL) {
            None => {}
            Some(Ok(msg)) => {
                // every partition of every subscribed topic has its own queue from before the
                // first poll, so this record escaped them: reading it here would lose it
                let why = format!(
                    "a record of {}-{} at offset {} arrived outside the partition queues",
                    msg.topic(),
                    msg.partition(),
                    msg.offset()
                );
                tracing::error!(instance, "{why}");
                broken.lock().get_or_insert(why);
            }
            Some(Err(e)) if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) => {
                tracing::warn!(instance, error = %e, "group member poll");
                last_error_log = Some(Instant::now());
            }
            Some(Err(_)) => {}
        }
    }
}
