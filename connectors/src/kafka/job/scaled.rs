//! One instance of a scaled-out job (`--instance-id`, `docs/SCALE-OUT.md`): the instance joins
//! the job's consumer group and runs a dataflow over the partitions the group gave it. Each
//! assignment change ends that dataflow and builds the next one:
//!
//! - partitions being revoked: the member's revoke callback stops the dataflow with a final
//!   checkpoint and waits until it ended, so its output, changelog and input offsets are
//!   committed (or, for partitions already lost to the group, refused by the group
//!   generation) before another instance may own them;
//! - partitions gained: they are not read by the running dataflow (its source reads only the
//!   partitions of the assignment it was built for), which stops; the next dataflow restores
//!   the keyed state of every owned task from its changelog before it reads a record.
//!
//! Every dataflow starts with a new instance producer (`init_transactions` of
//! `{prefix}-{instance}-offsets` aborts whatever the previous one left open) and keyed state
//! from the changelog: the runtime's checkpoints in the local directory are not restored
//! from, but its `changelog-cache` keeps each task's state and changelog position
//! ([`ChangelogCache`]), so that a restore on this machine reads only the changelog's tail.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use onceflow_runtime::{RestoreMode, SourceWatermarks, StopHandle, StreamEnvironment};

use super::args::Settings;
use super::health::Health;
use super::outputs::{Exchange, KafkaOutputs, Progress};
use super::watcher::spawn_watcher;
use super::{instance, permissions, say, startup, JobSummary, KafkaJob};
use crate::kafka::scale::{
    ensure_changelog_topics, ensure_repartition_topics, read_committed, read_committed_offsets,
    ChangelogCache, ChangelogTopic, InstanceMember, MemberConfig, RebalanceListener, Repartition,
    RepartitionPurger, RepartitionTopic, StateChangelog, TopicPartition,
};
use crate::kafka::{
    Decoder, KafkaError, KafkaSinkConfig, KafkaSource, OffsetsLink, PrefixClaim, Result,
};

/// Histogram: seconds from an assignment change to the next dataflow's start (every sink
/// recovered, every owned task restored).
pub const REBALANCE_PAUSE_SECONDS: &str = "onceflow_scale_rebalance_pause_seconds";
/// Counter: dataflows an instance built, label `reason` (`start`, `rebalance`, `failure`).
pub const DATAFLOWS: &str = "onceflow_scale_dataflows_total";

/// The local changelog cache's directory in the instance's checkpoint directory.
const CACHE_DIR: &str = "changelog-cache";

/// Consecutive failed dataflows after which the instance gives up (50 refused by the group
/// count as 5 others).
const MAX_FAILURES: u32 = 5;

/// The running dataflow as the member's rebalance callbacks see it.
#[derive(Default)]
struct Slot {
    /// Stops the running dataflow (with a final checkpoint).
    stop: Option<StopHandle>,
    /// A dataflow is running (from its registration until `execute` returned).
    running: bool,
    /// The assignment changed: the running (or next) dataflow is for an old one.
    changed: Option<Instant>,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    ended: Condvar,
    /// SIGTERM or Ctrl-C: stop the instance, not only the dataflow.
    signalled: AtomicBool,
    /// How long a revoke waits for the dataflow's final commit.
    stop_limit: Duration,
}

impl Shared {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the assignment changed and stops the running dataflow.
    fn changed(&self) -> MutexGuard<'_, Slot> {
        let mut slot = self.slot();
        slot.changed.get_or_insert_with(Instant::now);
        if let Some(stop) = &slot.stop {
            stop.stop();
        }
        slot
    }
}

struct Listener(Arc<Shared>);

impl RebalanceListener for Listener {
    fn revoking(&self, partitions: &[TopicPartition], lost: bool) {
        let mut slot = self.0.changed();
        let t0 = Instant::now();
        while slot.running {
            let (s, timeout) = self
                .0
                .ended
                .wait_timeout(slot, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner());
            slot = s;
            if timeout.timed_out() && t0.elapsed() > self.0.stop_limit {
                tracing::error!(
                    partitions = partitions.len(),
                    "the dataflow did not stop within the transaction timeout; releasing the partitions (its commit will be refused by the group generation)"
                );
                break;
            }
        }
        tracing::info!(
            partitions = partitions.len(),
            lost,
            waited_ms = t0.elapsed().as_millis() as u64,
            "dataflow over the revoked partitions ended"
        );
    }

    fn assigned(&self, partitions: &[TopicPartition]) {
        if !partitions.is_empty() {
            drop(self.0.changed());
        }
    }
}

/// Stops the instance on SIGTERM and Ctrl-C, whether a dataflow runs or the next one is
/// being built (the runtime's own handler lives only while a dataflow runs).
fn watch_signals(helper: &tokio::runtime::Runtime, shared: Arc<Shared>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let _guard = helper.enter();
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let mut sig =
            signal(kind).map_err(|e| KafkaError::Config(format!("cannot watch signals: {e}")))?;
        let shared = shared.clone();
        helper.spawn(async move {
            while sig.recv().await.is_some() {
                shared.signalled.store(true, Ordering::SeqCst);
                if let Some(stop) = &shared.slot().stop {
                    stop.stop();
                }
            }
        });
    }
    Ok(())
}

/// Purges the job's repartition topics every `every` on a thread of its own until dropped
/// ([`RepartitionPurger`]); a failed round is logged and retried at the next.
struct PurgeThread {
    stop: Arc<AtomicBool>,
}

impl PurgeThread {
    fn start(mut purger: RepartitionPurger, every: Duration) -> Result<PurgeThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("repartition-purge".into())
            .spawn(move || loop {
                let next = Instant::now() + every;
                while Instant::now() < next {
                    if stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100).min(every));
                }
                if let Err(e) = purger.purge() {
                    tracing::warn!(error = %e, "purging the repartition topics failed; retrying at the next round");
                }
            })
            .map_err(|e| KafkaError::Protocol(format!("cannot start the purge thread: {e}")))?;
        Ok(PurgeThread { stop })
    }
}

impl Drop for PurgeThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The number of partitions of the job's input topic.
fn input_partition_count(brokers: &str, s: &Settings) -> Result<i32> {
    use rdkafka::consumer::BaseConsumer;
    let consumer: BaseConsumer = s
        .properties
        .client_config(brokers)
        .create()
        .map_err(|e| KafkaError::client("creating a metadata client", e))?;
    let n = crate::kafka::source::partition_count(&consumer, &s.input, Duration::from_secs(30))?;
    Ok(n as i32)
}

/// A step of setting up the next dataflow failed: it counts as much as a failed dataflow
/// (the instance gives up with `e` once they add up to [`MAX_FAILURES`]); otherwise the
/// instance waits a little and starts the set-up again.
fn setup_failed(failures: &mut u32, e: KafkaError, what: &str) -> Result<()> {
    *failures += 10;
    if *failures >= MAX_FAILURES * 10 {
        return Err(e);
    }
    tracing::warn!(error = %e, "{what} failed; trying again");
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// The event time kept in the metadata of the group's committed offset of each of
/// `partitions` of `input` that has one. Blocking.
fn committed_event_times(
    reader: &rdkafka::consumer::BaseConsumer,
    input: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>> {
    let tps: Vec<TopicPartition> = partitions
        .iter()
        .map(|p| TopicPartition {
            topic: input.to_string(),
            partition: *p,
        })
        .collect();
    let committed = read_committed(reader, &tps, Duration::from_secs(30))?;
    Ok(committed
        .into_iter()
        .filter(|(_, (at, _))| at.is_some())
        .filter_map(|(tp, (_, metadata))| {
            crate::kafka::sink::event_time_of_metadata(&metadata).map(|t| (tp.partition, t))
        })
        .collect())
}

/// Whether a failed dataflow's error is the group refusing its commit: the stale generation
/// or member id of an instance whose assignment moved on (librdkafka's error texts).
fn refused_by_the_group(error: &str) -> bool {
    [
        "group generation id is not valid",
        "Unknown member",
        "rebalance in progress",
        "Fenced instance",
    ]
    .iter()
    .any(|m| error.contains(m))
}

/// The identity under which the instances of one job claim the transactional id prefix:
/// instances share it, a different job (another input, output or group) does not.
fn job_fingerprint(name: &str, s: &Settings) -> String {
    format!(
        "scaled-out job={name} input={} output={} group={}",
        s.input, s.output, s.group
    )
}

impl<T: onceflow_runtime::Data> KafkaJob<T> {
    /// Builds the pipeline once without running it: counts its keyed exchanges
    /// ([`KafkaOutputs::key_by`] calls) and refuses what a scaled-out job cannot run: keyed
    /// operators whose state has no place in the changelog, and event time behind a
    /// repartition topic.
    fn planned_exchanges(
        &self,
        s: &Settings,
        brokers: &str,
        sink_cfg: &KafkaSinkConfig,
        pipeline: &impl Fn(onceflow_runtime::DataStream<T>, &mut KafkaOutputs),
    ) -> Result<usize> {
        let env = StreamEnvironment::new(self.args.runtime.to_config(&self.name));
        let source = KafkaSource::new(brokers.to_string(), s.input.clone(), self.decoder.clone());
        let input = env.source("kafka-in", source);
        let mut outputs = KafkaOutputs::new(
            sink_cfg.clone(),
            None,
            None,
            s.clone(),
            Arc::new(Progress::default()),
            env.stop_handle(),
        )
        .with_exchange(Exchange::Plan { count: 0 });
        pipeline(input, &mut outputs);
        let unrouted = env.keyed_operators_without_route();
        if !unrouted.is_empty() {
            return Err(KafkaError::Config(format!(
                "job {}: keyed operator(s) {unrouted:?} are keyed with DataStream::key_by; in a \
                 scaled-out job (--instance-id) keyed state lives in Kafka, by the key's task: \
                 key the stream with KafkaOutputs::key_by",
                self.name
            )));
        }
        let exchanges = outputs.planned_exchanges();
        if exchanges > 0 && !s.input_partitioned_by_key && self.watermarks.is_some() {
            return Err(KafkaError::Config(format!(
                "job {}: it has event-time watermarks and keys its stream through a repartition \
                 topic, which does not carry watermarks: its windows and event-time timers would \
                 never fire. Partition the input by the key (Kafka's default partitioner, \
                 murmur2 of the key bytes) and pass --input-partitioned-by-key",
                self.name
            )));
        }
        Ok(exchanges)
    }

    /// Runs this process as instance `s.instance_id` of a scaled-out job until it is stopped.
    pub(crate) fn run_instance(
        self,
        s: &Settings,
        brokers: &str,
        checkpoint_dir: &Path,
        helper: &tokio::runtime::Runtime,
        health: &Arc<Health>,
        pipeline: impl Fn(onceflow_runtime::DataStream<T>, &mut KafkaOutputs),
    ) -> Result<JobSummary> {
        let sink_cfg = s.sink_config(brokers);
        let Some(instance) = s.instance_id.as_deref() else {
            return Err(KafkaError::Config(
                "a scaled-out instance needs --instance-id".into(),
            ));
        };
        let Some(lock) = instance::try_lock(checkpoint_dir)? else {
            return Err(KafkaError::Config(format!(
                "checkpoint directory {} is in use by another running instance; every instance needs its own --checkpoint-dir",
                checkpoint_dir.display()
            )));
        };
        permissions::verify(s, brokers, helper, &sink_cfg)?;
        startup::check_broker_max_timeout(s, brokers, helper, &sink_cfg)?;
        let claim = PrefixClaim::claim(
            brokers,
            &s.properties,
            &s.prefix,
            &job_fingerprint(&self.name, s),
            s.internal_replication,
        )?;
        // this instance's own transactional ids: instances never fence each other, a restart
        // of this instance fences its previous incarnation
        let mut instance_cfg = sink_cfg.clone();
        instance_cfg.transactional_id_prefix = format!("{}-{instance}", s.prefix);

        let shared = Arc::new(Shared {
            stop_limit: s.timeout,
            ..Shared::default()
        });
        watch_signals(helper, shared.clone())?;
        // the keyed exchanges of the pipeline: each goes through a repartition topic with as
        // many partitions as the input, which must exist before the member subscribes to it
        let input_partitions = input_partition_count(brokers, s)?;
        let exchanges = self.planned_exchanges(s, brokers, &instance_cfg, &pipeline)?;
        let repartition_topics: Vec<RepartitionTopic> = if s.input_partitioned_by_key {
            Vec::new()
        } else {
            (0..exchanges)
                .map(|i| RepartitionTopic::new(&s.prefix, &format!("key-by-{i}"), input_partitions))
                .collect()
        };
        if !repartition_topics.is_empty() {
            helper.block_on(ensure_repartition_topics(
                brokers,
                &s.properties,
                &repartition_topics,
                s.internal_replication,
            ))?;
        }
        let _purge = match s.repartition_purge_interval {
            Some(every) if !repartition_topics.is_empty() => Some(PurgeThread::start(
                RepartitionPurger::new(
                    brokers,
                    &s.properties,
                    &s.group,
                    repartition_topics.clone(),
                )?,
                every,
            )?),
            _ => None,
        };
        let mut topics = vec![s.input.clone()];
        topics.extend(repartition_topics.iter().map(|t| t.name.clone()));
        let mut member_cfg =
            MemberConfig::new(brokers, s.group.clone(), topics, instance.to_string());
        member_cfg.session_timeout = s.session_timeout;
        member_cfg.client_properties = s.properties.clone();
        // a dead incarnation leaves the group within three session timeouts and the others'
        // revoke callbacks (each bounded by the transaction timeout)
        let patience = s.session_timeout * 3 + s.timeout + Duration::from_secs(3);
        crate::kafka::scale::wait_until_instance_is_free(&member_cfg, patience)?;
        let member =
            InstanceMember::start(&member_cfg, Arc::new(Listener(shared.clone())), &s.input)?;
        let first_wait = (s.session_timeout * 3).max(Duration::from_secs(60));
        let t0 = Instant::now();
        while member.member().latest_assignment() == 0 {
            if shared.signalled.load(Ordering::SeqCst) {
                return Ok(JobSummary::default());
            }
            if t0.elapsed() > first_wait {
                return Err(KafkaError::Protocol(format!(
                    "instance {instance} got no assignment from group {} within {} s",
                    s.group,
                    first_wait.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }

        // reads the group's committed offsets when a failed dataflow's partitions are rewound
        let offsets_reader: rdkafka::consumer::BaseConsumer = s
            .properties
            .client_config(brokers)
            .set("group.id", &s.group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|e| KafkaError::client("creating the committed offsets reader", e))?;
        let mut rewind = false;
        let mut totals = JobSummary::default();
        let mut changelog_ready = false;
        let mut failures = 0u32;
        let mut reason = "start";
        let mut pause_from: Option<Instant> = None;
        loop {
            if shared.signalled.load(Ordering::SeqCst) {
                break;
            }
            {
                let mut slot = shared.slot();
                pause_from = pause_from.or(slot.changed.take());
            }
            let assignment = member.pin_assignment();
            if rewind {
                // a failed dataflow read records its aborted transaction did not commit: the
                // partitions this instance kept would go on after them, so the next dataflow
                // starts at the group's committed offsets
                let mut pinned: Vec<TopicPartition> = Vec::new();
                for topic in
                    std::iter::once(&s.input).chain(repartition_topics.iter().map(|t| &t.name))
                {
                    pinned.extend(member.owned_as_built(topic).into_keys().map(|partition| {
                        TopicPartition {
                            topic: topic.clone(),
                            partition,
                        }
                    }));
                }
                let rewound =
                    read_committed_offsets(&offsets_reader, &pinned, Duration::from_secs(30))
                        .and_then(|committed| {
                            member.member().rewind(&committed, Duration::from_secs(30))
                        });
                if let Err(e) = rewound {
                    setup_failed(&mut failures, e, "rewinding to the committed offsets")?;
                    continue;
                }
                rewind = false;
            }
            let owned: BTreeMap<i32, u64> = member.owned_as_built(&s.input);
            let tasks: Vec<i32> = owned.keys().copied().collect();
            // (event time) each owned partition's watermark resumes from the event time kept
            // with its committed offset: a partition read to its end by its previous owner has
            // no record left to advance it, and its windows moved here would never close
            let event_times = match &self.watermarks {
                None => BTreeMap::new(),
                Some(_) => match committed_event_times(&offsets_reader, &s.input, &tasks) {
                    Ok(t) => t,
                    Err(e) => {
                        setup_failed(
                            &mut failures,
                            e,
                            "reading the committed offsets' event times",
                        )?;
                        continue;
                    }
                },
            };
            let mut line = format!(
                "instance {instance}: dataflow for assignment {assignment}, partitions {tasks:?}"
            );
            for t in &repartition_topics {
                let owned: Vec<i32> = member.owned_as_built(&t.name).into_keys().collect();
                line.push_str(&format!(", {} {owned:?}", t.name));
            }
            say(line);
            metrics::counter!(DATAFLOWS, "reason" => reason).increment(1);

            let link = OffsetsLink::new();
            link.fence_previous(&instance_cfg, s.parallelism)?;
            let config = s
                .job_config(&self.args.runtime, &self.name)
                .checkpoint_dir(checkpoint_dir)
                .restore(RestoreMode::None)
                .checkpoint_listener(super::health::checkpoint_listener(health));
            let env = StreamEnvironment::new(config);
            let stop = env.stop_handle();
            let progress = Arc::new(Progress::with_health(health.clone()));
            progress
                .processed
                .store(totals.processed, Ordering::Relaxed);
            *progress
                .paused_since
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = pause_from.take();
            let counter = progress.clone();
            let inner = self.decoder.clone();
            let decoder = Decoder::from_owned(move |m| {
                counter.processed.fetch_add(1, Ordering::Relaxed);
                inner.decode_owned(m)
            });
            let source = KafkaSource::new(brokers.to_string(), s.input.clone(), decoder)
                .transactional_offsets(link.clone())
                .in_group(member.clone())
                .resuming_event_times(event_times);
            let input = match &self.watermarks {
                Some(w) => env.source("kafka-in", source.with_watermarks(w.clone())),
                None => env.source("kafka-in", source),
            };
            let repartitions = repartition_topics
                .iter()
                .map(|t| {
                    Repartition::new(
                        t.clone(),
                        member.clone(),
                        link.clone(),
                        instance_cfg.clone(),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let mut outputs = KafkaOutputs::new(
                instance_cfg.clone(),
                Some(link.clone()),
                None,
                s.clone(),
                progress.clone(),
                stop.clone(),
            );
            if !s.input_partitioned_by_key {
                outputs = outputs.with_exchange(Exchange::Through {
                    repartitions,
                    next: 0,
                    fed: Vec::new(),
                });
            }
            pipeline(input, &mut outputs);
            outputs.check(&self.name)?;

            // one changelog per keyed operator, its tasks those of the topic feeding it
            let topics: Vec<ChangelogTopic> = env
                .key_routes()
                .into_iter()
                .map(|(uid, route)| {
                    let fed = outputs.task_topic_of(&route);
                    let topic = ChangelogTopic::routed(&s.prefix, &uid, input_partitions, route);
                    match fed {
                        Some(t) => topic.fed_by(t),
                        None => topic,
                    }
                })
                .collect();
            if !changelog_ready {
                helper.block_on(ensure_changelog_topics(
                    brokers,
                    &s.properties,
                    &topics,
                    s.internal_replication,
                ))?;
                changelog_ready = true;
            }
            let mut changelog = StateChangelog::new(link.clone(), topics).restoring_from(
                brokers.to_string(),
                s.properties.clone(),
                member.clone(),
            );
            match ChangelogCache::open(checkpoint_dir.join(CACHE_DIR)) {
                Ok(cache) => changelog = changelog.with_cache(Arc::new(cache)),
                Err(e) => {
                    tracing::warn!(error = %e, "no local changelog cache: every restore reads whole changelog partitions")
                }
            }
            env.set_state_changelog(Arc::new(changelog));

            {
                let mut slot = shared.slot();
                if slot.changed.is_some() || shared.signalled.load(Ordering::SeqCst) {
                    // the assignment moved on while this dataflow was built: build the next
                    reason = "rebalance";
                    continue;
                }
                slot.stop = Some(stop.clone());
                slot.running = true;
            }
            let watcher_done = Arc::new(AtomicBool::new(false));
            spawn_watcher(
                progress.clone(),
                stop,
                watcher_done.clone(),
                self.args.max_records,
                self.args.exit_when_idle_ms.map(Duration::from_millis),
                false,
            );
            let result = env.execute_blocking();
            health.stopped("building the dataflow of a new assignment");
            watcher_done.store(true, Ordering::Relaxed);
            let rebalanced = {
                let mut slot = shared.slot();
                slot.stop = None;
                slot.running = false;
                shared.ended.notify_all();
                slot.changed.is_some()
            };
            totals.processed = progress.processed.load(Ordering::Relaxed);
            match result {
                Ok(r) => {
                    failures = 0;
                    totals.completed_checkpoints += r.completed_checkpoints;
                    totals.last_checkpoint = r.last_checkpoint.or(totals.last_checkpoint);
                    if !rebalanced || shared.signalled.load(Ordering::SeqCst) {
                        break;
                    }
                    reason = "rebalance";
                    say(format!(
                        "instance {instance}: assignment changed, rebuilding the dataflow"
                    ));
                }
                Err(e) => {
                    // a commit the group refused (stale generation or member id, a commit
                    // racing a rebalance) is what a rebalance costs, not a fault: only other
                    // failures count toward giving up (the group ones are bounded too)
                    failures += if refused_by_the_group(&e.to_string()) {
                        1
                    } else {
                        10
                    };
                    if failures >= MAX_FAILURES * 10 || shared.signalled.load(Ordering::SeqCst) {
                        return Err(KafkaError::from(e));
                    }
                    // a zombie's commit is refused by the group generation; a commit that
                    // fails aborts its transaction: the next dataflow starts from what the
                    // group committed
                    reason = "failure";
                    rewind = true;
                    tracing::warn!(error = %e, failures, "dataflow failed; rebuilding it from the group's committed offsets and the changelog");
                    say(format!(
                        "instance {instance}: dataflow failed ({e}); rebuilding it"
                    ));
                }
            }
        }
        drop(member);
        drop(claim);
        drop(lock);
        Ok(totals)
    }
}

#[cfg(test)]
mod tests {
    use super::refused_by_the_group;

    #[test]
    fn commits_refused_by_the_group_are_told_from_other_failures() {
        // as a zombie's commit fails (seen from librdkafka against the bundled broker)
        assert!(refused_by_the_group(
            "transaction aborted: transactional-offsets commit of checkpoint 38 failed: send_offsets_to_transaction: Transaction error: Failed to commit offsets to transaction on broker 127.0.0.1:37517/0: eos-input((null))[2](Broker: Specified group generation id is not valid)"
        ));
        assert!(refused_by_the_group(
            "send_offsets_to_transaction: ... (Broker: Unknown member)"
        ));
        assert!(!refused_by_the_group(
            "delivery failed: Broker: Topic authorization failed"
        ));
    }
}
