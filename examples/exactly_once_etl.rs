//! Exactly-once ETL, Kafka -> Kafka: reads JSON `{"id", "key", "amount"}` records, keeps a
//! running total per key (checkpointed keyed state) and writes `{"id", "key", "amount",
//! "total"}` keyed by key; records that do not parse go to `<output>.dlq` in the same
//! transactions.
//!
//! `cargo run --release --example exactly_once_etl` alone starts an embedded reference broker
//! and a demo input generator and prints live progress. With `--brokers HOST:PORT` it runs
//! against that cluster until stopped (SIGTERM: final checkpoint and commit, exit 0).
//! The CLI and the stdout lines (`job started`, `checkpoint N complete`, `checkpoint N
//! committed`, `job stopped`) are a stable contract that tests drive.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use onceflow::connectors::kafka::{
    committed_checkpoint, committer, validate_transaction_timeout, CheckpointSeal, Decoder,
    DeliveryMode, KafkaError, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource, OffsetsLink,
    PrefixClaim, SinkRecord,
};
use onceflow::prelude::*;
use onceflow::runtime::checkpoint::{CheckpointStorage, LocalDirStorage};
use serde::{Deserialize, Serialize};

/// Command line (stable: tests drive it).
#[derive(Parser, Debug)]
#[command(about = "Exactly-once Kafka -> Kafka ETL: running totals per key")]
struct Args {
    /// HOST:PORT of the cluster; without it an embedded broker and a demo generator start.
    #[arg(long)]
    brokers: Option<String>,
    /// Input topic.
    #[arg(long, default_value = "etl-input")]
    input: String,
    /// Output topic (dead letters go to `<output>.dlq`).
    #[arg(long, default_value = "etl-output")]
    output: String,
    /// Consumer group.
    #[arg(long, default_value = "onceflow-etl")]
    group: String,
    /// two-phase-commit | transactional-offsets | at-least-once | none.
    #[arg(long, default_value = "two-phase-commit")]
    mode: String,
    /// Checkpoint directory (default ./onceflow-checkpoints/etl; a fresh temporary one with the
    /// embedded in-memory broker).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Checkpoint interval.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// Prefix of the transactional ids.
    #[arg(long, default_value = "onceflow-etl")]
    transactional_id_prefix: String,
    /// transaction.timeout.ms; must exceed checkpoint interval + recovery allowance.
    #[arg(long, default_value_t = 60_000)]
    transaction_timeout_ms: u64,
    /// Time a restart may take before the recovery commit.
    #[arg(long, default_value_t = 30_000)]
    recovery_allowance_ms: u64,
    /// Prometheus endpoint, e.g. 127.0.0.1:9898.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Stop (final checkpoint + commit, exit 0) once this many records were processed.
    #[arg(long)]
    max_records: Option<u64>,
    /// Stop like SIGTERM once no input arrived for this many ms.
    #[arg(long)]
    exit_when_idle_ms: Option<u64>,
    /// Embedded mode: demo records generated per second.
    #[arg(long, default_value_t = 2000)]
    demo_rate: u64,
}

/// An input record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Input {
    id: u64,
    key: String,
    amount: i64,
}

/// An output record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Output {
    id: u64,
    key: String,
    amount: i64,
    total: i64,
}

/// An output record as written (borrows the key instead of copying it).
#[derive(Serialize)]
struct OutputRef<'a> {
    id: u64,
    key: &'a str,
    amount: i64,
    total: i64,
}

/// A parsed input, or a dead letter.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Parsed {
    Good(Input),
    Bad { key: Option<Vec<u8>>, raw: Vec<u8> },
}

const DLQ_KEY: &str = "\u{0}dead-letters";

fn fail_config(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2);
}

mod demo_support;
use demo_support::say;

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,onceflow_runtime=info,onceflow_connectors=info".into()),
        )
        .init();
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let mode: DeliveryMode = args.mode.parse().unwrap_or_else(|e| fail_config(e));
    if args.parallelism == 0 {
        fail_config("--parallelism must be at least 1");
    }
    if args.checkpoint_interval_ms == 0 {
        fail_config("--checkpoint-interval-ms must be positive");
    }
    let interval = Duration::from_millis(args.checkpoint_interval_ms);
    let timeout = Duration::from_millis(args.transaction_timeout_ms);
    let allowance = Duration::from_millis(args.recovery_allowance_ms);
    if mode.is_transactional() {
        if let Err(e) = validate_transaction_timeout(timeout, interval, allowance, None) {
            fail_config(e);
        }
    }
    if let Some(addr) = args.metrics_listen {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    }

    // embedded broker + demo generator when no cluster is given
    let helper_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let stop_demo = Arc::new(AtomicBool::new(false));
    let demo_support::Placement {
        brokers,
        embedded,
        checkpoint_dir,
    } = demo_support::place(
        &helper_rt,
        "etl",
        args.brokers.as_ref(),
        args.checkpoint_dir.clone(),
    )?;
    if embedded.is_some() {
        say(format!(
            "embedded broker at {brokers}; demo generator writes {} records/s to {}; checkpoints in {}",
            args.demo_rate,
            args.input,
            checkpoint_dir.display()
        ));
        demo::spawn_generator(
            brokers.clone(),
            args.input.clone(),
            args.demo_rate,
            stop_demo.clone(),
        );
    }

    // one live instance per checkpoint directory; a newer one takes over (docs/KAFKA.md)
    let mut instance_lock = lock_checkpoint_dir(&checkpoint_dir)?;
    if instance_lock.is_none() && !mode.is_transactional() {
        fail_config(format!(
            "checkpoint directory {} is in use by another running instance of this job; stop it first (in --mode two-phase-commit and transactional-offsets a second instance fences the first and takes over)",
            checkpoint_dir.display()
        ));
    }
    if mode.is_transactional() {
        match helper_rt.block_on(committer::broker_max_transaction_timeout(&brokers)) {
            Ok(Some(max)) => {
                if let Err(e) = validate_transaction_timeout(timeout, interval, allowance, Some(max)) {
                    fail_config(e);
                }
            }
            Ok(None) => tracing::info!(
                "the broker does not report transaction.max.timeout.ms; skipping the broker-maximum check"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot read the broker's transaction.max.timeout.ms; skipping that check"),
        }
    }

    // a different job using this prefix would fence our transactions (and we its): refuse
    let _prefix_claim = if mode.is_transactional() {
        let identity = std::fs::canonicalize(&checkpoint_dir)?
            .display()
            .to_string();
        match PrefixClaim::claim(&brokers, &args.transactional_id_prefix, &identity) {
            Ok(c) => Some(c),
            Err(e @ KafkaError::Config(_)) => fail_config(e),
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };

    let p = args.parallelism;
    let link = OffsetsLink::new();
    let sink_cfg = KafkaSinkConfig::new(brokers.clone(), args.output.clone())
        .mode(mode)
        .transactional_id_prefix(args.transactional_id_prefix.clone())
        .transaction_timeout(timeout)
        .checkpoint_interval(interval)
        .recovery_allowance(allowance);
    let mut seal = None;
    let restore = if mode.is_transactional() {
        // 1. fence every older instance: from now on none of them can complete a checkpoint
        //    (two-phase commit: the seal; transactional offsets: the instance producer)
        if mode == DeliveryMode::TwoPhaseCommit {
            seal = Some(Arc::new(CheckpointSeal::fence_previous(
                &sink_cfg,
                link.clone(),
            )?));
        } else {
            link.fence_previous(&sink_cfg, p)?;
        }
        // 2. an older instance on this directory fails at its next seal or commit: wait for it
        if instance_lock.is_none() {
            say(format!(
                "another instance of this job holds {}: it is fenced now; waiting for it to stop",
                checkpoint_dir.join(".instance-lock").display()
            ));
            instance_lock = Some(wait_for_checkpoint_dir(&checkpoint_dir, timeout)?);
        }
        // 3. the group's committed offsets name the newest complete checkpoint, for good now
        match committed_checkpoint(&brokers, &args.group, &args.input)? {
            Some(c) => {
                let complete =
                    LocalDirStorage::new(&checkpoint_dir).and_then(|st| st.list_complete())?;
                if !complete.contains(&c) {
                    fail_config(format!(
                        "group {} has committed offsets of checkpoint {c}, but {} holds no complete checkpoint {c} (it has {complete:?}): the checkpoint directory was deleted or belongs to another job. Restore the directory, or start over with a new --group and a new output topic",
                        args.group,
                        checkpoint_dir.display()
                    ));
                }
                say(format!(
                    "restoring checkpoint {c} (named by group {})",
                    args.group
                ));
                RestoreMode::Checkpoint(c)
            }
            None => RestoreMode::None,
        }
    } else {
        RestoreMode::Latest
    };
    let _instance_lock = instance_lock;

    let failpoint: Option<u64> = std::env::var("ONCEFLOW_FAILPOINT").ok().and_then(|v| {
        v.strip_prefix("after-checkpoint-complete:")
            .and_then(|n| n.trim().parse().ok())
    });
    let config = JobConfig::new("exactly-once-etl")
        .parallelism(p)
        .checkpoint_interval(interval)
        .checkpoint_dir(&checkpoint_dir)
        .retained_checkpoints(3)
        .restore(restore)
        .stop_on_sigterm(true)
        .checkpoint_listener(move |ev| {
            if let CheckpointEvent::Completed(n) = ev {
                say(format!("checkpoint {n} complete"));
                if failpoint == Some(n) {
                    eprintln!(
                        "failpoint after-checkpoint-complete:{n}: aborting before the sinks commit"
                    );
                    std::process::abort();
                }
            }
        });
    let config = match seal {
        Some(seal) => {
            let before_seal: Option<u64> = std::env::var("ONCEFLOW_FAILPOINT").ok().and_then(|v| {
                v.strip_prefix("before-seal:")
                    .and_then(|n| n.trim().parse().ok())
            });
            config.completion_hook(Arc::new(FailpointSeal {
                inner: seal,
                before_seal,
            }))
        }
        None => config,
    };
    let env = StreamEnvironment::new(config);
    let stop = env.stop_handle();

    let processed = Arc::new(AtomicU64::new(0));

    let mut source = KafkaSource::new(brokers.clone(), args.input.clone(), Decoder::raw())
        .group(args.group.clone());
    if mode.is_transactional() {
        source = source.offsets_link(link.clone());
    }
    let committed_counts: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let recovered = Arc::new(AtomicU64::new(0));
    let mut sink = KafkaSink::new(sink_cfg)
        .on_commit(move |n, _subtask| {
            let mut m = committed_counts.lock().unwrap_or_else(|e| e.into_inner());
            let c = m.entry(n).or_insert(0);
            *c += 1;
            if *c == p {
                m.remove(&n);
                say(format!("checkpoint {n} committed"));
            }
        })
        .on_recovered(move |_subtask, parallelism| {
            if recovered.fetch_add(1, Ordering::SeqCst) + 1 == parallelism as u64 {
                say("job started".to_string());
            }
        });
    if mode == DeliveryMode::TransactionalOffsets {
        sink = sink.offsets_link(link);
    }

    let dlq = format!("{}.dlq", args.output);
    let proc2 = processed.clone();
    env.source("kafka-in", source)
        .map(move |m: KafkaMessage| {
            // no clock read per record: the watcher below notices input by this count
            proc2.fetch_add(1, Ordering::Relaxed);
            match m.payload.as_deref().map(serde_json::from_slice::<Input>) {
                Some(Ok(i)) => Parsed::Good(i),
                _ => Parsed::Bad {
                    key: m.key,
                    raw: m.payload.unwrap_or_default(),
                },
            }
        })
        .key_by(|r: &Parsed| match r {
            Parsed::Good(i) => i.key.clone(),
            Parsed::Bad { .. } => DLQ_KEY.to_string(),
        })
        .process(
            "totals",
            move |r: Parsed, ctx: &mut KeyedContext<'_, String, SinkRecord>| {
                match r {
                    Parsed::Good(i) => {
                        let total = {
                            let mut st = ctx.value::<i64>("total")?;
                            let t = st.get().copied().unwrap_or(0).saturating_add(i.amount);
                            st.set(t);
                            t
                        };
                        let out = OutputRef {
                            id: i.id,
                            key: &i.key,
                            amount: i.amount,
                            total,
                        };
                        // sized for a typical record: no regrowing while writing
                        let mut value = Vec::with_capacity(96 + i.key.len());
                        serde_json::to_writer(&mut value, &out).map_err(Error::serialization)?;
                        ctx.emit(SinkRecord::new(Some(i.key.into_bytes()), value));
                    }
                    Parsed::Bad { key, raw } => {
                        ctx.emit(SinkRecord {
                            topic: Some(dlq.clone()),
                            key,
                            value: raw,
                            timestamp_ms: None,
                        });
                    }
                }
                Ok(())
            },
        )
        .sink("kafka-out", sink);

    // stop conditions and live progress
    let started = Instant::now();
    let watcher_done = Arc::new(AtomicBool::new(false));
    {
        let (processed, done) = (processed.clone(), watcher_done.clone());
        let (max, idle) = (args.max_records, args.exit_when_idle_ms);
        let verbose = embedded.is_some();
        std::thread::spawn(move || {
            let mut last_print = Instant::now();
            // input was last seen when the processed count last moved (checked every 50 ms)
            let (mut last_n, mut last_input) = (processed.load(Ordering::Relaxed), started);
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let n = processed.load(Ordering::Relaxed);
                if n != last_n {
                    (last_n, last_input) = (n, Instant::now());
                }
                if max.is_some_and(|m| n >= m) {
                    tracing::info!(
                        processed = n,
                        "--max-records reached: stopping with a final checkpoint"
                    );
                    stop.stop();
                    return;
                }
                if let Some(idle) = idle {
                    let quiet = last_input.elapsed().as_millis() as u64;
                    if quiet >= idle && started.elapsed() >= Duration::from_millis(idle) {
                        tracing::info!(
                            quiet_ms = quiet,
                            "--exit-when-idle-ms reached: stopping with a final checkpoint"
                        );
                        stop.stop();
                        return;
                    }
                }
                if verbose && last_print.elapsed() >= Duration::from_secs(2) {
                    last_print = Instant::now();
                    say(format!("progress: {n} records processed"));
                }
            }
        });
    }
    let verifier = embedded
        .as_ref()
        .map(|_| demo::spawn_verifier(brokers.clone(), args.output.clone(), stop_demo.clone()));

    let result = env.execute_blocking();
    watcher_done.store(true, Ordering::Relaxed);
    stop_demo.store(true, Ordering::Relaxed);
    let result = result?;
    if let Some(v) = verifier {
        if let Ok(s) = v.join() {
            say(s);
        }
    }
    tracing::info!(
        completed = result.completed_checkpoints,
        restored_from = ?result.restored_from,
        "job finished"
    );
    say("job stopped".to_string());
    if let Some(b) = embedded {
        helper_rt.block_on(b.shutdown());
    }
    Ok(())
}

/// The checkpoint seal, with the test hook `ONCEFLOW_FAILPOINT=before-seal:N`: abort the
/// process once checkpoint N's metadata is durable, before it is sealed (so it never counts).
struct FailpointSeal {
    inner: Arc<CheckpointSeal>,
    before_seal: Option<u64>,
}

#[onceflow::runtime::async_trait]
impl CompletionHook for FailpointSeal {
    async fn seal(&self, checkpoint: CheckpointId) -> onceflow::runtime::Result<()> {
        if self.before_seal == Some(checkpoint) {
            eprintln!(
                "failpoint before-seal:{checkpoint}: aborting after the metadata, before the seal"
            );
            std::process::abort();
        }
        self.inner.seal(checkpoint).await
    }
}

/// Locks `<dir>/.instance-lock` (released by the OS when the process dies, also on kill -9);
/// `None` if another live instance holds it.
#[allow(clippy::incompatible_msrv)] // File::try_lock: Rust 1.89; the example needs no older toolchain
fn lock_checkpoint_dir(dir: &std::path::Path) -> anyhow::Result<Option<std::fs::File>> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".instance-lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(anyhow::anyhow!("cannot lock {}: {e}", path.display()))
        }
    }
}

/// Waits until the fenced older instance released the checkpoint directory. It fails at its
/// next seal or commit, so this takes about a checkpoint interval; give up after `limit`.
fn wait_for_checkpoint_dir(
    dir: &std::path::Path,
    limit: Duration,
) -> anyhow::Result<std::fs::File> {
    let t0 = Instant::now();
    loop {
        if let Some(f) = lock_checkpoint_dir(dir)? {
            tracing::info!(
                waited_ms = t0.elapsed().as_millis() as u64,
                "the older instance stopped"
            );
            return Ok(f);
        }
        if t0.elapsed() > limit {
            return Err(anyhow::anyhow!(
                "the instance holding {} was fenced but did not stop within {} s; stop it (kill it) and start again",
                dir.join(".instance-lock").display(),
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The embedded demo: an input generator and a read_committed verifier of the output.
mod demo {
    use super::*;
    use demo_support::{spawn_output_reader, spawn_paced_producer, Tally};

    /// Writes `rate` records per second (every 500th does not parse) until `stop`.
    pub fn spawn_generator(brokers: String, topic: String, rate: u64, stop: Arc<AtomicBool>) {
        spawn_paced_producer(brokers, topic, rate, stop, |id| {
            let key = format!("customer-{}", id % 8);
            let value = if id % 500 == 499 {
                format!("not json {id}")
            } else {
                format!(
                    r#"{{"id":{id},"key":"{key}","amount":{}}}"#,
                    (id % 100) as i64 - 20
                )
            };
            (key, value)
        });
    }

    /// Records, distinct ids and duplicated ids of the output.
    #[derive(Default)]
    struct Ids {
        ids: HashSet<u64>,
        records: u64,
        dups: u64,
    }

    impl Tally for Ids {
        fn record(&mut self, payload: &[u8]) {
            self.records += 1;
            if let Ok(o) = serde_json::from_slice::<Output>(payload) {
                if !self.ids.insert(o.id) {
                    self.dups += 1;
                }
            }
        }
        fn summary(&self) -> String {
            format!(
                "{} records, {} distinct ids, {} duplicates",
                self.records,
                self.ids.len(),
                self.dups
            )
        }
    }

    /// Reads the output read_committed and reports records, distinct ids and duplicates.
    pub fn spawn_verifier(
        brokers: String,
        topic: String,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<String> {
        spawn_output_reader(
            brokers,
            topic,
            "onceflow-etl-verifier",
            stop,
            Ids::default(),
        )
    }
}
