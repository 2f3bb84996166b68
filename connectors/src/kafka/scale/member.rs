//! Group membership of a scaled-out job instance: one consumer per instance, subscribed to
//! the job's topics with the cooperative-sticky assignor, so starting or stopping an instance
//! moves only the partitions that must move. The instance learns of every change through a
//! [`RebalanceListener`]: [`RebalanceListener::revoking`] runs inside the member's poll before
//! librdkafka releases the partitions, so whatever is open for them (the instance's
//! transaction) is committed or aborted before another instance can own them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{
    BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance,
};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientContext, TopicPartitionList};

use super::super::{ClientProperties, KafkaError};

/// Gauge: partitions (tasks) this instance owns.
pub const TASKS_OWNED: &str = "onceflow_scale_tasks_owned";
/// Counter: rebalance events seen by this instance, label `kind` (`assigned`, `revoked`,
/// `lost`).
pub const REBALANCES: &str = "onceflow_scale_rebalances_total";
/// Histogram: seconds the instance spent releasing revoked partitions (its revoke callback).
pub const REVOKE_SECONDS: &str = "onceflow_scale_revoke_seconds";

/// One partition of one topic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition {
            topic: e.topic().to_string(),
            partition: e.partition(),
        })
        .collect()
}

/// What an instance does when its assignment changes. Both calls run on the thread that
/// polls the [`GroupMember`], inside its poll.
pub trait RebalanceListener: Send + Sync + 'static {
    /// `partitions` are about to be released. Commit what is open for them (or abort it) and
    /// return when done: another instance may own them as soon as this returns. `lost` is
    /// true when the group already gave them away (this instance missed its session timeout):
    /// nothing may be committed for them any more, only aborted.
    fn revoking(&self, partitions: &[TopicPartition], lost: bool);

    /// `partitions` were added to this instance's assignment. Nothing is fetched for them
    /// before the next poll; pause them (see [`GroupMember::pause`]) until their state is
    /// restored.
    fn assigned(&self, partitions: &[TopicPartition]);
}

/// One owned partition.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// The number of the assignment that gave it to this instance (assignments are numbered
    /// from 1 in the order this instance received them).
    assignment: u64,
    /// Its revoke callback runs: the instance still owns it (what is open for it is being
    /// committed), but no dataflow built from now on may work on it.
    revoking: bool,
}

/// The consumer context of a [`GroupMember`]: keeps the owned set and calls the listener.
pub struct MemberContext {
    instance: String,
    /// Owned partitions.
    owned: Mutex<BTreeMap<TopicPartition, Held>>,
    assignments: AtomicU64,
    listener: Arc<dyn RebalanceListener>,
}

impl ClientContext for MemberContext {}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // owned before librdkafka starts fetching them, so a record is never read from a
            // partition the owned set does not name yet
            let seq = self.assignments.fetch_add(1, Ordering::SeqCst) + 1;
            let mut owned = self.owned.lock();
            owned.extend(partitions_of(tpl).into_iter().map(|p| {
                (
                    p,
                    Held {
                        assignment: seq,
                        revoking: false,
                    },
                )
            }));
            metrics::gauge!(TASKS_OWNED).set(owned.len() as f64);
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = partitions_of(tpl);
            let lost = consumer.assignment_lost();
            let kind = if lost { "lost" } else { "revoked" };
            tracing::info!(
                instance = %self.instance,
                lost,
                partitions = %list(&partitions),
                "releasing partitions"
            );
            // marked before the callback: the callback ends the dataflow that works on them,
            // and the instance may build its next dataflow before this callback returns and
            // the partitions leave the owned set; that dataflow must not take them
            {
                let mut owned = self.owned.lock();
                for p in &partitions {
                    if let Some(held) = owned.get_mut(p) {
                        held.revoking = true;
                    }
                }
            }
            let started = Instant::now();
            self.listener.revoking(&partitions, lost);
            metrics::histogram!(REVOKE_SECONDS).record(started.elapsed().as_secs_f64());
            metrics::counter!(REBALANCES, "kind" => kind).increment(1);
            let mut owned = self.owned.lock();
            for p in &partitions {
                owned.remove(p);
            }
            metrics::gauge!(TASKS_OWNED).set(owned.len() as f64);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = partitions_of(tpl);
                metrics::counter!(REBALANCES, "kind" => "assigned").increment(1);
                tracing::info!(
                    instance = %self.instance,
                    partitions = %list(&partitions),
                    "partitions assigned"
                );
                self.listener.assigned(&partitions);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(instance = %self.instance, error = %e, "rebalance error");
            }
        }
    }
}

fn list(partitions: &[TopicPartition]) -> String {
    partitions
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Settings of a [`GroupMember`].
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// Bootstrap servers.
    pub brokers: String,
    /// The job's consumer group.
    pub group: String,
    /// Topics every instance subscribes to (the input and the job's repartition topics).
    pub topics: Vec<String>,
    /// The instance's stable name (`group.instance.id`, static membership).
    pub instance_id: String,
    /// Session timeout: an instance silent for longer loses its partitions.
    pub session_timeout: Duration,
    /// Client properties shared by every client of the job (TLS, SASL).
    pub client_properties: ClientProperties,
}

impl MemberConfig {
    /// Settings with a 10 s session timeout and no client properties.
    pub fn new(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topics: Vec<String>,
        instance_id: impl Into<String>,
    ) -> Self {
        MemberConfig {
            brokers: brokers.into(),
            group: group.into(),
            topics,
            instance_id: instance_id.into(),
            session_timeout: Duration::from_secs(10),
            client_properties: ClientProperties::new(),
        }
    }
}

/// The `client.id` of instance `instance`'s group member: how a process running under the
/// same `--instance-id` is recognised in the group's member list.
pub fn member_client_id(instance: &str) -> String {
    format!("onceflow-instance-{instance}")
}

/// Waits until no member of `config.group` carries `config.instance_id`, for at most
/// `patience`. A killed incarnation of the instance stays a member until the group notices:
/// its session expires, or, if it died with a JoinGroup parked at the coordinator, once the
/// other members have rejoined (after their revoke callbacks) and it fails to sync; a restart
/// waits for that. A member still there after `patience` is alive: another process started
/// with the same `--instance-id`, which is refused (the two would write under one
/// transactional id and fence each other's transactions). Blocking.
pub fn wait_until_instance_is_free(
    config: &MemberConfig,
    patience: Duration,
) -> Result<(), KafkaError> {
    let me = member_client_id(&config.instance_id);
    let consumer: BaseConsumer = config
        .client_properties
        .client_config(&config.brokers)
        .set("group.id", &config.group)
        .create()
        .map_err(|e| KafkaError::client("creating the group inspection client", e))?;
    let t0 = Instant::now();
    let mut said = false;
    loop {
        let groups = crate::kafka::retry::blocking(
            &format!("describing group {}", config.group),
            &format!("group coordinator of {}", config.group),
            crate::kafka::retry::COORDINATOR_BUDGET,
            || consumer.fetch_group_list(Some(&config.group), Duration::from_secs(10)),
        )?;
        let holder = groups
            .groups()
            .iter()
            .filter(|g| g.name() == config.group)
            .flat_map(|g| g.members())
            .find(|m| m.client_id() == me)
            .map(|m| format!("member {} at {}", m.id(), m.client_host()));
        let Some(holder) = holder else {
            return Ok(());
        };
        if t0.elapsed() >= patience {
            return Err(KafkaError::Config(format!(
                "instance `{}` is already running in group {} ({holder}, still a member after \
                 {} s, past the {} ms session timeout): every instance of a job needs its own \
                 --instance-id",
                config.instance_id,
                config.group,
                patience.as_secs(),
                config.session_timeout.as_millis()
            )));
        }
        if !said {
            tracing::info!(
                instance = %config.instance_id,
                group = %config.group,
                %holder,
                "a member of this instance's name is in the group: waiting for its session to \
                 expire (a previous incarnation) or refusing to start (another live process)"
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The group's committed offsets of `partitions`, read by `reader` (a client of the group
/// that is not a member, so the read does not wait for the member's rebalances): `None` for a
/// partition the group committed nothing for. An offset still pending in an aborting
/// transaction is asked again until `timeout`. Blocking.
pub fn read_committed_offsets(
    reader: &BaseConsumer,
    partitions: &[TopicPartition],
    timeout: Duration,
) -> Result<BTreeMap<TopicPartition, Option<i64>>, KafkaError> {
    Ok(read_committed(reader, partitions, timeout)?
        .into_iter()
        .map(|(tp, (at, _))| (tp, at))
        .collect())
}

/// [`read_committed_offsets`], with each offset's metadata (empty when none was committed).
pub fn read_committed(
    reader: &BaseConsumer,
    partitions: &[TopicPartition],
    timeout: Duration,
) -> Result<BTreeMap<TopicPartition, (Option<i64>, String)>, KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = reader
            .committed_offsets(tpl(partitions), timeout)
            .map_err(|e| KafkaError::client("reading the group's committed offsets", e))?;
        let mut out = BTreeMap::new();
        let mut failed = None;
        for e in got.elements() {
            if let Err(err) = e.error() {
                failed = Some(format!("{}-{}: {err}", e.topic(), e.partition()));
                break;
            }
            let at = match e.offset() {
                rdkafka::Offset::Offset(o) => Some(o),
                _ => None,
            };
            out.insert(
                TopicPartition {
                    topic: e.topic().to_string(),
                    partition: e.partition(),
                },
                (at, e.metadata().to_string()),
            );
        }
        match failed {
            None => return Ok(out),
            Some(why) if Instant::now() >= deadline => {
                return Err(KafkaError::Protocol(format!(
                    "the group's committed offset of {why} could not be read within {} s",
                    timeout.as_secs()
                )))
            }
            Some(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// One instance's membership of the job's consumer group, and its read_committed consumer.
pub struct GroupMember {
    consumer: Arc<BaseConsumer<MemberContext>>,
}

impl GroupMember {
    /// Subscribes to the job's topics in its group. Partitions arrive through the listener
    /// once [`GroupMember::poll`] runs.
    pub fn join(
        config: &MemberConfig,
        listener: Arc<dyn RebalanceListener>,
    ) -> Result<GroupMember, KafkaError> {
        if config.topics.is_empty() {
            return Err(KafkaError::Config(
                "a group member subscribes to at least one topic".into(),
            ));
        }
        let mut cfg = config.client_properties.client_config(&config.brokers);
        cfg.set("group.id", &config.group)
            .set("group.instance.id", &config.instance_id)
            .set("client.id", member_client_id(&config.instance_id))
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set(
                "session.timeout.ms",
                config.session_timeout.as_millis().to_string(),
            )
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        let context = MemberContext {
            instance: config.instance_id.clone(),
            owned: Mutex::new(BTreeMap::new()),
            assignments: AtomicU64::new(0),
            listener,
        };
        let consumer: BaseConsumer<MemberContext> = cfg
            .create_with_context(context)
            .map_err(|e| KafkaError::client("creating the group member's consumer", e))?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| KafkaError::client(format!("subscribing to {topics:?}"), e))?;
        tracing::info!(
            instance = %config.instance_id,
            group = %config.group,
            topics = ?config.topics,
            "joined the job's group"
        );
        Ok(GroupMember {
            consumer: Arc::new(consumer),
        })
    }

    /// Polls for a record; rebalance callbacks run inside this call.
    pub fn poll(
        &self,
        timeout: Duration,
    ) -> Option<rdkafka::error::KafkaResult<BorrowedMessage<'_>>> {
        self.consumer.poll(timeout)
    }

    /// The partitions this instance owns now, those whose revoke callback runs included.
    pub fn owned(&self) -> BTreeSet<TopicPartition> {
        self.consumer
            .context()
            .owned
            .lock()
            .keys()
            .cloned()
            .collect()
    }

    /// The partitions this instance owns now and keeps: [`GroupMember::owned`] without those
    /// whose revoke callback runs. What a dataflow built now may work on, each with the
    /// number of the assignment that gave it.
    pub fn kept(&self) -> BTreeMap<TopicPartition, u64> {
        self.consumer
            .context()
            .owned
            .lock()
            .iter()
            .filter(|(_, held)| !held.revoking)
            .map(|(p, held)| (p.clone(), held.assignment))
            .collect()
    }

    /// The number of the assignment that gave `partition` to this instance, `None` if the
    /// instance does not own it (it still does while its revoke callback runs). A position
    /// read before the partition's current assignment is stale: another instance may have
    /// moved the partition on in between.
    pub fn assignment_of(&self, partition: &TopicPartition) -> Option<u64> {
        self.consumer
            .context()
            .owned
            .lock()
            .get(partition)
            .map(|held| held.assignment)
    }

    /// The number of the latest assignment this instance received (0 before the first).
    pub fn latest_assignment(&self) -> u64 {
        self.consumer.context().assignments.load(Ordering::SeqCst)
    }

    /// Routes the records of `topic`/`partition` to a queue of their own, polled by whoever
    /// holds it (a source subtask) instead of [`GroupMember::poll`]. Call it before the first
    /// poll: records fetched earlier still arrive through the main poll. The split stays in
    /// force across later assignments of the partition (librdkafka does not forward a queue
    /// the application has redirected). `None` if the topic name is not a C string or the
    /// client refuses.
    pub fn split_partition_queue(
        &self,
        topic: &str,
        partition: i32,
    ) -> Option<PartitionQueue<MemberContext>> {
        self.consumer.split_partition_queue(topic, partition)
    }

    /// The number of partitions of `topic`, read from the cluster's metadata.
    pub fn partition_count(&self, topic: &str, timeout: Duration) -> Result<usize, KafkaError> {
        crate::kafka::source::partition_count(&self.consumer, topic, timeout)
    }

    /// The group metadata (member id, generation) to send with the instance's offsets in its
    /// transaction (KIP-447: a zombie's stale generation is refused).
    pub fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.consumer.group_metadata()
    }

    /// Moves each of `partitions` (owned by this member) back to `committed`, the group's
    /// committed offsets of them as [`read_committed_offsets`] returns them (`None`: the
    /// group committed none, start from the log start): records a dataflow read past them
    /// and whose transaction did not commit are read again by the next dataflow. Without
    /// this, a partition the instance keeps across a failed dataflow would continue from
    /// where the failed dataflow stopped reading, and the records of its aborted transaction
    /// would never be processed.
    pub fn rewind(
        &self,
        committed: &BTreeMap<TopicPartition, Option<i64>>,
        timeout: Duration,
    ) -> Result<(), KafkaError> {
        for (tp, at) in committed {
            let to = at.map_or(rdkafka::Offset::Beginning, rdkafka::Offset::Offset);
            self.consumer
                .seek(&tp.topic, tp.partition, to, timeout)
                .map_err(|e| KafkaError::client(format!("rewinding {tp} to {to:?}"), e))?;
        }
        tracing::info!(
            partitions = committed.len(),
            "rewound partitions to the group's committed offsets"
        );
        Ok(())
    }

    /// Stops fetching `partitions` (e.g. until their state is restored).
    pub fn pause(&self, partitions: &[TopicPartition]) -> Result<(), KafkaError> {
        self.consumer
            .pause(&tpl(partitions))
            .map_err(|e| KafkaError::client("pausing partitions", e))
    }

    /// Fetches `partitions` again.
    pub fn resume(&self, partitions: &[TopicPartition]) -> Result<(), KafkaError> {
        self.consumer
            .resume(&tpl(partitions))
            .map_err(|e| KafkaError::client("resuming partitions", e))
    }

    /// Closes the member: its partitions are revoked through the listener first. A static
    /// member (one with a `group.instance.id`) does not leave the group on close: its
    /// partitions move to other instances after its session timeout, or come back to it when
    /// it rejoins under the same instance id before that.
    pub fn close(&self) {
        if let Err(e) = self.consumer.close_queue() {
            tracing::warn!(error = %e, "closing the group member");
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.consumer.closed() && Instant::now() < deadline {
            let _ = self.consumer.poll(Duration::from_millis(100));
        }
    }
}

fn tpl(partitions: &[TopicPartition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(&p.topic, p.partition);
    }
    tpl
}
