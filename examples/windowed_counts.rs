//! Windowed counts, Kafka -> Kafka, exactly once: reads JSON click events `{"user", "ts",
//! "amount"}` and writes, per user, the count and sum of every 1-minute tumbling window and
//! of every session (gap 30 s) in event time (`ts`, ms), as JSON `{"kind", "user", "start",
//! "end", "count", "sum"}` keyed by user. Watermarks are tracked per Kafka partition (bounded
//! out-of-orderness, `--out-of-orderness-ms`), a partition quiet for `--idle-timeout-ms` does
//! not hold them back, and events later than `--allowed-lateness-ms` go to `<output>.late`.
//! Window contents and timers are part of every checkpoint; the sink commits Kafka
//! transactions with the checkpoints (two-phase commit).
//!
//! `cargo run --release --example windowed_counts` alone starts an embedded reference broker
//! and a demo generator (event time runs 20x faster than the wall clock, so windows close
//! every few seconds), runs for `--run-seconds` (default 20) and prints what a read_committed
//! consumer sees. With `--brokers HOST:PORT` it runs against that cluster until stopped
//! (SIGTERM: final checkpoint and commit, exit 0).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use onceflow::connectors::kafka::Decoder;
use onceflow::operators::window::{AggregateFunction, WindowAssigner, WindowResult};
use onceflow::prelude::*;
use onceflow::runtime::{SourceWatermarks, WatermarkStrategy};
use serde::{Deserialize, Serialize};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Exactly-once windowed counts per user: 1-minute windows and 30 s sessions")]
struct Args {
    /// HOST:PORT of the cluster; without it an embedded broker and a demo generator start.
    #[arg(long)]
    brokers: Option<String>,
    /// Input topic.
    #[arg(long, default_value = "clicks")]
    input: String,
    /// Output topic (late events go to `<output>.late`).
    #[arg(long, default_value = "click-counts")]
    output: String,
    /// Consumer group.
    #[arg(long, default_value = "onceflow-windowed-counts")]
    group: String,
    /// Checkpoint directory (default ./onceflow-checkpoints/windowed-counts; a fresh
    /// temporary one with the embedded broker).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Checkpoint interval.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// How far events may be out of order within a partition.
    #[arg(long, default_value_t = 5000)]
    out_of_orderness_ms: u64,
    /// A partition without records for this long stops holding the watermark back.
    #[arg(long, default_value_t = 2000)]
    idle_timeout_ms: u64,
    /// Late events within this time re-fire their window with an updated result.
    #[arg(long, default_value_t = 0)]
    allowed_lateness_ms: u64,
    /// Stop (final checkpoint + commit) after this many seconds (embedded default: 20).
    #[arg(long)]
    run_seconds: Option<u64>,
    /// Embedded mode: demo events generated per second.
    #[arg(long, default_value_t = 1000)]
    demo_rate: u64,
}

/// An input event.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Click {
    user: String,
    ts: i64,
    amount: i64,
}

/// A consumed record: the event (or `None` if it does not parse) and its partition.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Input {
    partition: i32,
    ts: i64,
    click: Option<Click>,
}

/// An output record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Count {
    kind: String,
    user: String,
    start: i64,
    end: i64,
    count: u64,
    sum: i64,
}

struct CountSum;

impl AggregateFunction<Click> for CountSum {
    type Acc = (u64, i64);
    type Out = (u64, i64);
    fn create(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), c: Click) {
        acc.0 += 1;
        acc.1 = acc.1.saturating_add(c.amount);
    }
    fn merge(&self, a: (u64, i64), b: (u64, i64)) -> (u64, i64) {
        (a.0 + b.0, a.1.saturating_add(b.1))
    }
    fn result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
}

fn to_record(kind: &'static str) -> impl Fn(WindowResult<String, (u64, i64)>) -> SinkRecord {
    move |r| {
        let c = Count {
            kind: kind.to_string(),
            user: r.key.clone(),
            start: r.window.start,
            end: r.window.end,
            count: r.value.0,
            sum: r.value.1,
        };
        let value = serde_json::to_vec(&c).unwrap_or_default();
        SinkRecord::new(Some(r.key.into_bytes()), value)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

mod demo_support;
use demo_support::say;

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,onceflow_runtime=info".into()),
        )
        .init();
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.parallelism > 0, "--parallelism must be at least 1");
    anyhow::ensure!(
        args.checkpoint_interval_ms > 0,
        "--checkpoint-interval-ms must be positive"
    );
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
        "windowed-counts",
        args.brokers.as_ref(),
        args.checkpoint_dir.clone(),
    )?;
    if embedded.is_some() {
        say(format!(
            "embedded broker at {brokers}; demo generator writes {} events/s to {}; checkpoints in {}",
            args.demo_rate,
            args.input,
            checkpoint_dir.display()
        ));
        let topics = [
            args.input.clone(),
            args.output.clone(),
            format!("{}.late", args.output),
        ];
        helper_rt.block_on(demo::create_topics(&brokers, &topics))?;
        demo::spawn_generator(
            brokers.clone(),
            args.input.clone(),
            args.demo_rate,
            stop_demo.clone(),
        );
    }
    let run_for = args
        .run_seconds
        .or(embedded.as_ref().map(|_| 20))
        .map(Duration::from_secs);

    let interval = Duration::from_millis(args.checkpoint_interval_ms);
    let config = JobConfig::new("windowed-counts")
        .parallelism(args.parallelism)
        .checkpoint_interval(interval)
        .checkpoint_dir(&checkpoint_dir)
        .restore(RestoreMode::Latest)
        .stop_on_sigterm(true)
        .checkpoint_listener(|ev| {
            if let CheckpointEvent::Completed(n) = ev {
                tracing::debug!(checkpoint = n, "checkpoint complete");
            }
        });
    let env = StreamEnvironment::new(config);
    let stop = env.stop_handle();

    // event time from the payload's `ts` (the Kafka timestamp if it does not parse),
    // watermarks per partition, idle partitions left out of the minimum
    let decoder = Decoder::new(|m: &KafkaMessage| {
        let click = m
            .payload
            .as_deref()
            .and_then(|p| serde_json::from_slice::<Click>(p).ok());
        Input {
            partition: m.partition,
            ts: click.as_ref().map(|c| c.ts).or(m.timestamp_ms).unwrap_or(0),
            click,
        }
    });
    let strategy = WatermarkStrategy::bounded_out_of_orderness(
        Duration::from_millis(args.out_of_orderness_ms),
        |i: &Input| i.ts,
    )
    .with_splits(|i: &Input| i.partition.max(0) as u32)
    .with_idleness(Duration::from_millis(args.idle_timeout_ms));
    let source = KafkaSource::new(brokers.clone(), args.input.clone(), decoder)
        .group(args.group.clone())
        .with_watermarks(strategy);
    let clicks = env.source("clicks", source).flat_map(|i: Input| i.click);
    let by_user = clicks.key_by(|c: &Click| c.user.clone());
    let lateness = Duration::from_millis(args.allowed_lateness_ms);
    let minutes = by_user
        .window(WindowAssigner::tumbling(Duration::from_secs(60)), |c| c.ts)
        .allowed_lateness(lateness)
        .aggregate("per-minute", CountSum);
    let sessions = by_user
        .window(WindowAssigner::session(Duration::from_secs(30)), |c| c.ts)
        .allowed_lateness(lateness)
        .aggregate("sessions", CountSum);
    let late_topic = format!("{}.late", args.output);
    let late = minutes.late_records().map(move |c: Click| {
        let value = serde_json::to_vec(&c).unwrap_or_default();
        SinkRecord::new(Some(c.user.into_bytes()), value).to_topic(late_topic.clone())
    });
    minutes
        .results()
        .map(to_record("minute"))
        .union(&sessions.results().map(to_record("session")))
        .union(&late)
        .sink(
            "kafka-out",
            KafkaSink::new(
                KafkaSinkConfig::new(brokers.clone(), args.output.clone())
                    .transactional_id_prefix("onceflow-windowed-counts")
                    .checkpoint_interval(interval),
            ),
        );

    if let Some(d) = run_for {
        std::thread::spawn(move || {
            std::thread::sleep(d);
            say(format!(
                "{} s elapsed: stopping with a final checkpoint",
                d.as_secs()
            ));
            stop.stop();
        });
    }
    let verifier = embedded
        .as_ref()
        .map(|_| demo::spawn_verifier(brokers.clone(), args.output.clone(), stop_demo.clone()));
    say("job started".to_string());
    let result = env.execute_blocking();
    stop_demo.store(true, Ordering::Relaxed);
    let result = result?;
    if let Some(v) = verifier {
        if let Ok(s) = v.join() {
            say(s);
        }
    }
    say(format!(
        "job stopped after {} checkpoints (restored from {:?})",
        result.completed_checkpoints, result.restored_from
    ));
    if let Some(b) = embedded {
        helper_rt.block_on(b.shutdown());
    }
    Ok(())
}

/// The embedded demo: an input generator and a read_committed verifier of the output.
mod demo {
    use super::*;
    use demo_support::{spawn_output_reader, spawn_paced_producer, Tally};
    use rdkafka::config::ClientConfig;

    /// Creates the demo's topics (4 partitions each) so the source finds its input at once.
    pub async fn create_topics(brokers: &str, topics: &[String]) -> anyhow::Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, 4, TopicReplication::Fixed(1)))
            .collect();
        for r in admin.create_topics(&new, &AdminOptions::new()).await? {
            if let Err((topic, e)) = r {
                anyhow::bail!("cannot create topic {topic}: {e}");
            }
        }
        Ok(())
    }

    /// Writes `rate` events per second until `stop`: 40 users, each active in bursts (so
    /// sessions close), event time 20 ms apart per event (20x the wall clock at 1000/s) and
    /// up to 2 s out of order.
    pub fn spawn_generator(brokers: String, topic: String, rate: u64, stop: Arc<AtomicBool>) {
        let base = now_ms();
        spawn_paced_producer(brokers, topic, rate, stop, move |i| {
            let id = i as i64;
            let user = format!("user-{}", (id / 200 + id % 4) % 40);
            let ts = base + id * 20 - (id * 7919 % 100) * 20;
            let value = format!(
                r#"{{"user":"{user}","ts":{ts},"amount":{}}}"#,
                id % 100 - 20
            );
            (user, value)
        });
    }

    /// Minute windows, sessions and windows seen twice in the output.
    #[derive(Default)]
    struct Windows {
        seen: HashSet<(String, String, i64)>,
        minutes: u64,
        sessions: u64,
        repeats: u64,
        events: u64,
    }

    impl Tally for Windows {
        fn record(&mut self, payload: &[u8]) {
            let Ok(c) = serde_json::from_slice::<Count>(payload) else {
                return;
            };
            match c.kind.as_str() {
                "minute" => {
                    self.minutes += 1;
                    self.events += c.count;
                }
                _ => self.sessions += 1,
            }
            if !self.seen.insert((c.kind, c.user, c.start)) {
                self.repeats += 1;
            }
        }
        fn summary(&self) -> String {
            format!(
                "{} minute windows ({} events), {} sessions, {} repeated windows",
                self.minutes, self.events, self.sessions, self.repeats
            )
        }
    }

    /// Reads the output read_committed; reports results and windows seen twice (with no
    /// allowed lateness every window fires exactly once, so a repeat would be a duplicate).
    pub fn spawn_verifier(
        brokers: String,
        topic: String,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<String> {
        spawn_output_reader(
            brokers,
            topic,
            "onceflow-windowed-counts-verifier",
            stop,
            Windows::default(),
        )
    }
}
