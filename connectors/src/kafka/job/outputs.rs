//! The sinks of a Kafka job ([`KafkaOutputs`]) and the counters behind its stdout lines:
//! `job started` once every sink subtask recovered, `checkpoint N committed` once every sink
//! subtask committed N.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use onceflow_operators::{KeyBy, KeyedStream};
use onceflow_runtime::{CheckpointId, CompletionHook, Data, DataStream, Key, KeyRoute, StopHandle};

use super::args::{mode_name, Settings};
use super::health::Health;
use super::{failpoint, say};
use crate::kafka::{
    CheckpointSeal, DeliveryMode, KafkaError, KafkaSink, KafkaSinkConfig, OffsetsLink, SinkRecord,
};

/// Counters shared by the source, the sinks and the watcher.
#[derive(Default)]
pub(crate) struct Progress {
    /// Records read from the input.
    pub(crate) processed: AtomicU64,
    /// Sink subtasks of the job (known once the pipeline is built).
    sink_subtasks: AtomicUsize,
    /// Sink subtasks that recovered (`job started` once all did).
    recovered: AtomicUsize,
    /// Sink subtasks that committed each checkpoint (`checkpoint N committed` once all did).
    committed: Mutex<HashMap<CheckpointId, usize>>,
    /// Scaled-out instances: when the assignment change that led to this dataflow happened;
    /// its pause is recorded when the dataflow starts (`job started`).
    pub(crate) paused_since: Mutex<Option<std::time::Instant>>,
    /// What `/readyz` answers from: told when the dataflow runs (`job started`).
    pub(crate) health: Option<Arc<Health>>,
}

impl Progress {
    /// Counters that tell `health` when the dataflow runs.
    pub(crate) fn with_health(health: Arc<Health>) -> Self {
        Progress {
            health: Some(health),
            ..Progress::default()
        }
    }

    /// Whether every sink subtask has recovered (the job printed `job started`).
    pub(crate) fn started(&self) -> bool {
        let sinks = self.sink_subtasks.load(Ordering::SeqCst);
        sinks > 0 && self.recovered.load(Ordering::SeqCst) >= sinks
    }
}

/// How [`KafkaOutputs::key_by`] exchanges records by key in a scaled-out instance.
pub(crate) enum Exchange {
    /// A dry build of the pipeline that counts the keyed exchanges (each needs its
    /// repartition topic before the instance joins the group).
    Plan { count: usize },
    /// Each keyed exchange goes through its repartition topic, in the order of the calls.
    Through {
        repartitions: Vec<crate::kafka::scale::Repartition>,
        next: usize,
        /// The key route of each exchange's keyed stream and the topic feeding it.
        fed: Vec<(KeyRoute, String)>,
    },
}

/// The sinks of a job: every sink writes in the job's delivery mode with the job's
/// transactional id prefix, transaction timeout and checkpoint interval.
pub struct KafkaOutputs {
    cfg: KafkaSinkConfig,
    link: Option<OffsetsLink>,
    seal: Option<Arc<CheckpointSeal>>,
    settings: Settings,
    sinks: usize,
    progress: Arc<Progress>,
    error: Option<KafkaError>,
    stop: StopHandle,
    exchange: Option<Exchange>,
}

impl KafkaOutputs {
    /// Sinks writing with `cfg` (the output topic, mode, prefix and timeouts of the job).
    pub(crate) fn new(
        cfg: KafkaSinkConfig,
        link: Option<OffsetsLink>,
        seal: Option<Arc<CheckpointSeal>>,
        settings: Settings,
        progress: Arc<Progress>,
        stop: StopHandle,
    ) -> Self {
        KafkaOutputs {
            cfg,
            seal,
            link,
            settings,
            sinks: 0,
            progress,
            error: None,
            stop,
            exchange: None,
        }
    }

    /// Exchanges keyed records as `exchange` says (scaled-out instances).
    pub(crate) fn with_exchange(mut self, exchange: Exchange) -> Self {
        self.exchange = Some(exchange);
        self
    }

    /// The keyed exchanges counted by a dry build.
    pub(crate) fn planned_exchanges(&self) -> usize {
        match &self.exchange {
            Some(Exchange::Plan { count }) => *count,
            _ => 0,
        }
    }

    /// The topic feeding each keyed stream whose exchange went through Kafka, by key route.
    pub(crate) fn task_topic_of(&self, route: &KeyRoute) -> Option<String> {
        match &self.exchange {
            Some(Exchange::Through { fed, .. }) => fed
                .iter()
                .find(|(r, _)| Arc::ptr_eq(r, route))
                .map(|(_, t)| t.clone()),
            _ => None,
        }
    }

    /// After the pipeline was built: the first misuse of a sink, or none at all.
    pub(crate) fn check(&mut self, job: &str) -> crate::kafka::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.sinks == 0 {
            return Err(KafkaError::Config(format!(
                "job {job}: the pipeline adds no Kafka sink (call KafkaOutputs::sink)"
            )));
        }
        Ok(())
    }

    /// The output topic (`--output`).
    pub fn output_topic(&self) -> &str {
        &self.settings.output
    }

    /// The dead-letter topic, `<output>.dlq`: send a record there with
    /// `SinkRecord::to_topic`; it is written in the same transactions as the output.
    pub fn dead_letter_topic(&self) -> String {
        format!("{}.dlq", self.settings.output)
    }

    /// Stops the job with a final checkpoint (like SIGTERM) when called.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Keys `stream` by `key` for keyed state (reduce, aggregate, process, windows), like the
    /// operators' `key_by`, and routes each key to its task by its Kafka bytes
    /// ([`KafkaKey`](crate::kafka::scale::KafkaKey): strings as UTF-8, integers big-endian).
    ///
    /// In a scaled-out job (`--instance-id`) the instance owning task `t` owns the state of
    /// the keys whose task is `t`, and their changelog partition follows it. The records then
    /// go through the job's repartition topic `{prefix}-key-by-{n}-repartition` (the `n`-th
    /// call), written in the instance transaction to partition `murmur2(key) % partitions`
    /// and read by the instance owning that partition. With `--input-partitioned-by-key` the
    /// input is already partitioned that way (a producer keying records by the key) and the
    /// records stay in the instance that read them.
    pub fn key_by<K, T, F>(&mut self, stream: &DataStream<T>, key: F) -> KeyedStream<K, T>
    where
        K: Key + crate::kafka::scale::KafkaKey,
        T: Data,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        let route = |k: &K| k.key_bytes();
        match &mut self.exchange {
            None => stream.key_by(key).routed_by(route),
            Some(Exchange::Plan { count }) => {
                *count += 1;
                stream.key_by(key).routed_by(route)
            }
            Some(Exchange::Through {
                repartitions,
                next,
                fed,
            }) => {
                let Some(through) = repartitions.get(*next) else {
                    self.error.get_or_insert(KafkaError::Config(format!(
                        "the pipeline keyed {} streams when it was first built and more now: build the same pipeline every time",
                        repartitions.len()
                    )));
                    return stream.key_by(key).routed_by(route);
                };
                *next += 1;
                let keyed =
                    crate::kafka::scale::key_by_through(stream, key, through).routed_by(route);
                if let Some(r) = keyed.route() {
                    fed.push((r, through.topic().name.clone()));
                }
                keyed
            }
        }
    }

    /// Writes `records` to the output topic (a record with a topic goes to that topic).
    pub fn sink(&mut self, name: &str, records: &DataStream<SinkRecord>) {
        let topic = self.settings.output.clone();
        self.sink_to(name, records, &topic);
    }

    /// Writes `records` to `topic` (a record with a topic goes to that topic). In
    /// transactional-offsets mode a job has one sink (the input offsets commit with its
    /// transactions); write further topics through `SinkRecord::to_topic`.
    pub fn sink_to(&mut self, name: &str, records: &DataStream<SinkRecord>, topic: &str) {
        if self.sinks > 0 && self.settings.mode == DeliveryMode::TransactionalOffsets {
            self.error.get_or_insert(KafkaError::Config(format!(
                "sink `{name}`: --mode {} commits the input offsets with the transactions of one sink; write further topics from that sink with SinkRecord::to_topic",
                mode_name(self.settings.mode)
            )));
            return;
        }
        let mut cfg = self.cfg.clone();
        cfg.default_topic = topic.to_string();
        if self.sinks > 0 {
            // every two-phase-commit sink has its own ring of transactional ids
            cfg.transactional_id_prefix = format!("{}-{name}", self.settings.prefix);
        }
        let p = self.settings.parallelism;
        self.sinks += 1;
        self.progress.sink_subtasks.fetch_add(p, Ordering::SeqCst);
        let (on_commit, on_recovered) = (self.progress.clone(), self.progress.clone());
        let mut sink = KafkaSink::new(cfg)
            .on_commit(move |n, _subtask| {
                let total = on_commit.sink_subtasks.load(Ordering::SeqCst);
                let mut m = on_commit
                    .committed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let c = m.entry(n).or_insert(0);
                *c += 1;
                if *c == total {
                    m.remove(&n);
                    say(format!("checkpoint {n} committed"));
                }
            })
            .on_recovered(move |_subtask, _parallelism| {
                let total = on_recovered.sink_subtasks.load(Ordering::SeqCst);
                if on_recovered.recovered.fetch_add(1, Ordering::SeqCst) + 1 == total {
                    say("job started".to_string());
                    if let Some(h) = &on_recovered.health {
                        h.running(Arc::downgrade(&on_recovered));
                    }
                    let paused = on_recovered
                        .paused_since
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                    if let Some(t) = paused {
                        metrics::histogram!(super::REBALANCE_PAUSE_SECONDS)
                            .record(t.elapsed().as_secs_f64());
                    }
                }
            });
        if let Some(seal) = &self.seal {
            sink = sink.sealed_by(seal);
        }
        if self.settings.mode == DeliveryMode::TransactionalOffsets {
            if let Some(link) = &self.link {
                sink = sink.offsets_link(link.clone());
            }
        }
        records.sink_with_parallelism(name, p, sink);
    }
}

/// The seal of two-phase commit, with the `before-seal` failpoint.
pub(crate) struct Sealing(pub(crate) Arc<CheckpointSeal>);

#[onceflow_runtime::async_trait]
impl CompletionHook for Sealing {
    async fn seal(&self, checkpoint: CheckpointId) -> onceflow_runtime::Result<()> {
        failpoint::hit("before-seal", checkpoint);
        self.0.seal(checkpoint).await
    }
}
