//! Produce and fetch throughput with rdkafka against the onceflow broker binary (in memory,
//! durable with `--fsync every-batch`, durable with `--fsync never`) and librdkafka's built-in
//! `MockCluster`, in one run, with the same client settings and the same records. Prints a
//! markdown table.
//!
//! `cargo bench -p onceflow-broker --bench produce_fetch` (full) or add `-- --quick`
//! (or set `ONCEFLOW_BENCH_QUICK=1`) for a short run. `ONCEFLOW_BENCH_TARGETS=mock,never`
//! keeps only the targets whose name contains one of the comma-separated words (the mock
//! cluster is always kept, so ratios stay in the same run).
//!
//! Produce: an idempotent producer (acks=all, linger.ms=5, no compression) sends N records
//! over 4 partitions; the clock runs from the first send to the last delivery report.
//! Fetch: a consumer (assign, no group commits) reads the same number of records, the tail of
//! every partition up to the high watermark; the clock runs from assign to the last record.
//! The window is small enough that librdkafka's mock cluster, which keeps only the last ~5 MB
//! of each partition, still holds it. Each figure is the median of 5 runs (1 with --quick),
//! each on a fresh topic of the same server; the runs go round-robin over the targets (all
//! started up front), so changes in the machine's load spread over all of them. MB/s counts
//! value bytes only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use onceflow_testkit::bins::{broker_binary, BROKER_BIN_ENV};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;

/// Counts delivery reports without storing them (same cost for every target).
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
}

struct CountingContext(Arc<Counts>);

impl ClientContext for CountingContext {}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.0.ok.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.0.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// The same client settings for every target; only the bootstrap address differs.
fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4");
    c
}

/// Produces `count` records of `value_len` bytes; returns the elapsed time.
fn produce(bootstrap: &str, topic: &str, count: usize, value_len: usize) -> Result<Duration> {
    let counts = Arc::new(Counts::default());
    let producer: BaseProducer<CountingContext> = base_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "none")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(CountingContext(counts.clone()))
        .context("create producer")?;
    // Metadata (and topic auto-creation) outside the measured window.
    producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("warm-up metadata")?;
    let value = vec![b'v'; value_len];
    // One record first so the producer id is acquired (InitProducerId) and the connection is
    // up before the clock starts; librdkafka otherwise stalls ~0.5 s on the first batch.
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key("warm-up")
                .payload(&value),
        )
        .map_err(|(e, _)| anyhow!("warm-up send: {e}"))?;
    producer
        .flush(Duration::from_secs(30))
        .context("warm-up flush")?;
    if counts.ok.load(Ordering::Relaxed) != 1 {
        bail!("warm-up record not delivered");
    }
    counts.ok.store(0, Ordering::Relaxed);
    let keys: Vec<String> = (0..count).map(|i| format!("key-{i:09}")).collect();
    let start = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let mut record = BaseRecord::to(topic)
            .partition(i as i32 % PARTITIONS)
            .key(key)
            .payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("send: {e}"),
            }
        }
    }
    // Serve delivery reports until all are in: rust-rdkafka's flush() waits in 100 ms steps,
    // which would round every measurement up.
    let deadline = start + Duration::from_secs(300);
    while counts.ok.load(Ordering::Relaxed) + counts.failed.load(Ordering::Relaxed) < count as u64 {
        if Instant::now() > deadline {
            bail!("delivery reports still missing after 300 s");
        }
        producer.poll(Duration::from_millis(1));
    }
    let elapsed = start.elapsed();
    producer.flush(Duration::from_secs(10)).context("flush")?;
    let (ok, failed) = (
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    if failed > 0 || ok != count as u64 {
        bail!("{ok} delivered, {failed} failed of {count}");
    }
    Ok(elapsed)
}

/// Reads the last `per_partition` records of every partition (fewer if the log holds fewer) up
/// to its high watermark; returns (records, elapsed).
fn fetch(bootstrap: &str, topic: &str, per_partition: i64) -> Result<(u64, Duration)> {
    let consumer: BaseConsumer = base_config(bootstrap)
        .set("enable.auto.commit", "false")
        // rdkafka polls through the group queue, which needs a group id even with assign().
        .set("group.id", "onceflow-conformance-reader")
        .set("enable.partition.eof", "false")
        .create()
        .context("create consumer")?;
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_err(|e| anyhow!("watermarks {topic}/{p}: {e}"))?;
        let from = low.max(high - per_partition);
        tpl.add_partition_offset(topic, p, Offset::Offset(from))?;
        ends.push(high);
    }
    let start = Instant::now();
    consumer.assign(&tpl)?;
    let mut done = vec![false; PARTITIONS as usize];
    for (p, &end) in ends.iter().enumerate() {
        done[p] = end == 0;
    }
    let mut read = 0u64;
    let deadline = start + Duration::from_secs(300);
    while done.iter().any(|d| !d) {
        if Instant::now() > deadline {
            bail!("fetch timed out after {read} records");
        }
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = msg.map_err(|e| anyhow!("consume: {e}"))?;
        read += 1;
        let p = msg.partition() as usize;
        if msg.offset() + 1 >= ends[p] {
            done[p] = true;
        }
    }
    Ok((read, start.elapsed()))
}

/// Something that serves Kafka on a bootstrap address for the duration of a measurement.
enum Target {
    Broker {
        process: Box<BrokerProcess>,
        _data_dir: Option<tempfile::TempDir>,
    },
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
}

impl Target {
    fn bootstrap(&self) -> String {
        match self {
            Target::Broker { process, .. } => process.bootstrap().to_string(),
            Target::Mock(m) => m.bootstrap_servers(),
        }
    }
}

fn start_target(kind: &str, topic: &str) -> Result<Target> {
    let partitions = PARTITIONS.to_string();
    let extra = ["--default-partitions", partitions.as_str()];
    Ok(match kind {
        "onceflow in-memory" => Target::Broker {
            process: Box::new(BrokerProcess::spawn(Storage::InMemory, &extra)?),
            _data_dir: None,
        },
        "onceflow durable, fsync every-batch" | "onceflow durable, fsync never" => {
            let dir = tempfile::tempdir()?;
            let fsync = if kind.ends_with("every-batch") {
                "every-batch"
            } else {
                "never"
            };
            let storage = Storage::Durable {
                dir: dir.path().to_path_buf(),
                fsync: fsync.into(),
            };
            Target::Broker {
                process: Box::new(BrokerProcess::spawn(storage, &extra)?),
                _data_dir: Some(dir),
            }
        }
        "librdkafka MockCluster" => {
            let mock = MockCluster::new(1).map_err(|e| anyhow!("MockCluster: {e}"))?;
            mock.create_topic(topic, PARTITIONS, 1)
                .map_err(|e| anyhow!("mock create_topic: {e}"))?;
            Target::Mock(mock)
        }
        other => bail!("unknown target {other}"),
    })
}

struct Row {
    target: &'static str,
    value_len: usize,
    produced: usize,
    /// Median produce rate over the repetitions, records/s.
    produce_rate: f64,
    fetched: u64,
    /// Median fetch rate over the repetitions, records/s.
    fetch_rate: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rate(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64().max(1e-9)
}

/// nproc, CPU model and load average, for the record.
fn machine_summary() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "Machine: {cpus} CPUs ({model}), load average {} at start.",
        load.join(" ")
    )
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("ONCEFLOW_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let only = std::env::var("ONCEFLOW_BENCH_TARGETS").unwrap_or_default();
    let targets: Vec<&'static str> = [
        "onceflow in-memory",
        "onceflow durable, fsync every-batch",
        "onceflow durable, fsync never",
        "librdkafka MockCluster",
    ]
    .into_iter()
    .filter(|t| {
        only.is_empty()
            || t.contains("MockCluster")
            || only
                .split(',')
                .any(|w| !w.is_empty() && t.contains(w.trim()))
    })
    .collect();
    // (value bytes, records produced, records fetched per partition). The fetch window is the
    // same for every target and small enough that the mock cluster (which keeps only the last
    // ~5 MB of each partition) still holds it.
    let sizes: [(usize, usize, i64); 2] = if quick {
        [(100, 20_000, 5_000), (1024, 5_000, 1_250)]
    } else {
        [(100, 300_000, 35_000), (1024, 100_000, 4_000)]
    };
    let reps = if quick { 1 } else { 5 };
    eprintln!(
        "produce_fetch: {} mode, {PARTITIONS} partitions, median of {reps}",
        if quick { "quick" } else { "full" }
    );
    // Run a private copy of the broker binary: the target directory may be shared with other
    // checkouts whose builds would replace it in the middle of a run.
    let bin_dir = tempfile::tempdir()?;
    let bin_copy = bin_dir.path().join("onceflow-broker");
    std::fs::copy(broker_binary(), &bin_copy).context("copy the broker binary")?;
    std::env::set_var(BROKER_BIN_ENV, &bin_copy);
    println!("{}", machine_summary());
    println!();
    let mut rows = Vec::new();
    for (value_len, count, window) in sizes {
        // All targets stay up and the repetitions go round-robin over them, so a change in
        // the machine's load during the run hits every target alike.
        let servers = targets
            .iter()
            .enumerate()
            .map(|(t, target)| start_target(target, &format!("bench-{value_len}-{t}-0")))
            .collect::<Result<Vec<_>>>()?;
        let mut produce_rates = vec![Vec::new(); targets.len()];
        let mut fetch_rates = vec![Vec::new(); targets.len()];
        let mut fetched = vec![0; targets.len()];
        for rep in 0..reps {
            for (t, (target, server)) in targets.iter().zip(&servers).enumerate() {
                let bootstrap = server.bootstrap();
                let topic = format!("bench-{value_len}-{t}-{rep}");
                // start_target made the first topic; the mock does not auto-create the rest.
                if let (Target::Mock(mock), true) = (server, rep > 0) {
                    mock.create_topic(&topic, PARTITIONS, 1)
                        .map_err(|e| anyhow!("mock create_topic: {e}"))?;
                }
                let produce_time = produce(&bootstrap, &topic, count, value_len)
                    .with_context(|| format!("{target}: produce"))?;
                let (n, fetch_time) = fetch(&bootstrap, &topic, window)
                    .with_context(|| format!("{target}: fetch"))?;
                eprintln!("{target} {value_len} B #{rep}: produce {count} in {produce_time:?}, fetch {n} in {fetch_time:?}");
                produce_rates[t].push(rate(count as f64, produce_time));
                fetch_rates[t].push(rate(n as f64, fetch_time));
                fetched[t] = n;
            }
        }
        for (t, target) in targets.iter().enumerate() {
            rows.push(Row {
                target,
                value_len,
                produced: count,
                produce_rate: median(std::mem::take(&mut produce_rates[t])),
                fetched: fetched[t],
                fetch_rate: median(std::mem::take(&mut fetch_rates[t])),
            });
        }
        drop(servers);
    }

    println!("| target | record value | produced | produce records/s | produce MB/s | fetched | fetch records/s | fetch MB/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let (p, f) = (r.produce_rate, r.fetch_rate);
        println!(
            "| {} | {} B | {} | {:.0} | {:.1} | {} | {:.0} | {:.1} |",
            r.target,
            r.value_len,
            r.produced,
            p,
            p * r.value_len as f64 / 1e6,
            r.fetched,
            f,
            f * r.value_len as f64 / 1e6
        );
    }
    println!();
    println!("Ratios to librdkafka MockCluster (produce records/s, fetch records/s):");
    println!();
    for (value_len, _, _) in sizes {
        let mock = rows
            .iter()
            .find(|r| r.value_len == value_len && r.target == "librdkafka MockCluster");
        let Some(mock) = mock else { continue };
        for r in rows
            .iter()
            .filter(|r| r.value_len == value_len && r.target != mock.target)
        {
            println!(
                "- {} B, {}: produce {:.2}x, fetch {:.2}x",
                value_len,
                r.target,
                r.produce_rate / mock.produce_rate,
                r.fetch_rate / mock.fetch_rate
            );
        }
    }
    Ok(())
}
