//! Transactional produce benchmark against the in-process reference broker: records/s and
//! commit latency (p50/p99) per transaction size, printed as a markdown table.
//!
//! `cargo run --release -p onceflow-broker --example txn_bench [-- --durable]`
//! (`--durable`: a temporary data dir with `--fsync every-batch`; default: in-memory).
//! 100-byte records, one partition, one transactional producer (librdkafka via rdkafka).
//! Delivery reports are drained by polling before each commit (rust-rdkafka's flush waits
//! in 100 ms steps).

use std::time::{Duration, Instant};

use onceflow_broker::storage::{FsyncPolicy, StorageConfig};
use onceflow_broker::BrokerConfig;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const SIZES: [usize; 5] = [1, 10, 100, 1_000, 10_000];
const T: Duration = Duration::from_secs(30);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One row: records/s, commit p50/p99 (ms), delivery-drain p50 (ms), transactions.
struct Row {
    rate: f64,
    p50: f64,
    p99: f64,
    drain_p50: f64,
    txns: usize,
}

fn run(bootstrap: &str, size: usize) -> anyhow::Result<Row> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", format!("bench-{size}"))
        .set("linger.ms", "0")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    p.init_transactions(T)?;
    let payload = vec![b'x'; 100];
    let topic = format!("bench-{size}");
    // Warm-up transaction (topic creation, coordinator lookup) before the clock.
    p.begin_transaction()?;
    p.send(
        BaseRecord::<(), [u8]>::to(&topic)
            .partition(0)
            .payload(&payload),
    )
    .map_err(|(e, _)| e)?;
    p.commit_transaction(T)?;
    let total_records = (20_000usize).max(size * 3);
    let txns = (total_records / size).clamp(3, 400);
    let mut commits = Vec::with_capacity(txns);
    let mut drains = Vec::with_capacity(txns);
    let start = Instant::now();
    for _ in 0..txns {
        p.begin_transaction()?;
        for _ in 0..size {
            let mut rec = BaseRecord::<(), [u8]>::to(&topic)
                .partition(0)
                .payload(&payload);
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        p.poll(Duration::from_millis(1));
                        rec = r;
                    }
                }
            }
        }
        let d = Instant::now();
        while p.in_flight_count() > 0 {
            p.poll(Duration::from_millis(1));
        }
        drains.push(d.elapsed().as_secs_f64() * 1000.0);
        let c = Instant::now();
        p.commit_transaction(T)?;
        commits.push(c.elapsed().as_secs_f64() * 1000.0);
    }
    let elapsed = start.elapsed().as_secs_f64();
    commits.sort_by(|a, b| a.total_cmp(b));
    drains.sort_by(|a, b| a.total_cmp(b));
    Ok(Row {
        rate: (txns * size) as f64 / elapsed,
        p50: percentile(&commits, 0.5),
        p99: percentile(&commits, 0.99),
        drain_p50: percentile(&drains, 0.5),
        txns,
    })
}

fn main() -> anyhow::Result<()> {
    let durable = std::env::args().any(|a| a == "--durable");
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut config = BrokerConfig::default();
    if durable {
        config.storage = StorageConfig {
            data_dir: Some(dir.path().to_path_buf()),
            fsync: FsyncPolicy::EveryBatch,
            ..StorageConfig::default()
        };
    }
    let broker = rt.block_on(onceflow_broker::start(config))?;
    let bootstrap = broker.bootstrap_servers();
    println!(
        "storage: {}, 100-byte records, 1 partition",
        if durable {
            "durable (fsync every-batch)"
        } else {
            "in-memory"
        }
    );
    println!(
        "| records/txn | txns | records/s | commit p50 ms | commit p99 ms | send-to-acked p50 ms |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for size in SIZES {
        let r = run(&bootstrap, size)?;
        println!(
            "| {size} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            r.txns, r.rate, r.p50, r.p99, r.drain_p50
        );
    }
    rt.block_on(broker.shutdown());
    Ok(())
}
