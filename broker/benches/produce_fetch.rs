//! Produce and fetch throughput with rdkafka against the onceflow broker binary (in memory,
//! durable with `--fsync every-batch`, durable with `--fsync never`) and librdkafka's built-in
//! `MockCluster`, in one run, with the same client settings and the same records. Prints a
//! markdown table.
//!
//! `cargo bench -p onceflow-broker --bench produce_fetch` (full) or add `-- --quick`
//! (or set `ONCEFLOW_BENCH_QUICK=1`) for a short run.
//!
//! Produce: an idempotent producer (acks=all, linger.ms=5, no compression) sends N records
//! over 4 partitions; the clock runs from the first send to the last delivery report.
//! Fetch: a consumer (assign, no group) reads every partition from its log start to the high
//! watermark; the clock runs from assign to the last record. The mock cluster keeps only the
//! last ~5 MB of each partition, so it may serve fewer records than were produced: the table
//! shows how many each target served. MB/s counts value bytes only.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use common::{BrokerProcess, Storage};
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
    producer.flush(Duration::from_secs(300)).context("flush")?;
    let elapsed = start.elapsed();
    let (ok, failed) = (
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    if failed > 0 || ok != count as u64 {
        bail!("{ok} delivered, {failed} failed of {count}");
    }
    Ok(elapsed)
}

/// Reads every partition from its log start to its high watermark; returns (records, elapsed).
fn fetch(bootstrap: &str, topic: &str) -> Result<(u64, Duration)> {
    let consumer: BaseConsumer = base_config(bootstrap)
        .set("enable.auto.commit", "false")
        // rdkafka polls through the group queue, which needs a group id even with assign().
        .set("group.id", "onceflow-conformance-reader")
        .set("enable.partition.eof", "false")
        .create()
        .context("create consumer")?;
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_err(|e| anyhow!("watermarks {topic}/{p}: {e}"))?;
        ends.push(high);
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
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
        process: BrokerProcess,
        _data_dir: Option<tempfile::TempDir>,
    },
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
}

impl Target {
    fn bootstrap(&self) -> String {
        match self {
            Target::Broker { process, .. } => process.bootstrap(),
            Target::Mock(m) => m.bootstrap_servers(),
        }
    }
}

fn start_target(kind: &str, topic: &str) -> Result<Target> {
    let partitions = PARTITIONS.to_string();
    let extra = ["--default-partitions", partitions.as_str()];
    Ok(match kind {
        "onceflow in-memory" => Target::Broker {
            process: BrokerProcess::spawn(Storage::InMemory, &extra)?,
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
                process: BrokerProcess::spawn(storage, &extra)?,
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
    produce: Duration,
    fetched: u64,
    fetch: Duration,
}

fn rate(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64().max(1e-9)
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("ONCEFLOW_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let targets = [
        "onceflow in-memory",
        "onceflow durable, fsync every-batch",
        "onceflow durable, fsync never",
        "librdkafka MockCluster",
    ];
    let sizes: [(usize, usize); 2] = if quick {
        [(100, 20_000), (1024, 5_000)]
    } else {
        [(100, 300_000), (1024, 100_000)]
    };
    eprintln!(
        "produce_fetch: {} mode, {PARTITIONS} partitions",
        if quick { "quick" } else { "full" }
    );
    let mut rows = Vec::new();
    for (value_len, count) in sizes {
        for (t, target) in targets.iter().enumerate() {
            let topic = format!("bench-{value_len}-{t}");
            let server = start_target(target, &topic)?;
            let bootstrap = server.bootstrap();
            let produce_time = produce(&bootstrap, &topic, count, value_len)
                .with_context(|| format!("{target}: produce"))?;
            let (fetched, fetch_time) =
                fetch(&bootstrap, &topic).with_context(|| format!("{target}: fetch"))?;
            eprintln!("{target} {value_len} B: produce {produce_time:?}, fetch {fetched} in {fetch_time:?}");
            rows.push(Row {
                target,
                value_len,
                produced: count,
                produce: produce_time,
                fetched,
                fetch: fetch_time,
            });
            drop(server);
        }
    }

    println!("| target | record value | produced | produce records/s | produce MB/s | fetched | fetch records/s | fetch MB/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let p = rate(r.produced as f64, r.produce);
        let f = rate(r.fetched as f64, r.fetch);
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
    for (value_len, _) in sizes {
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
                rate(r.produced as f64, r.produce) / rate(mock.produced as f64, mock.produce),
                rate(r.fetched as f64, r.fetch) / rate(mock.fetched as f64, mock.fetch)
            );
        }
    }
    Ok(())
}
