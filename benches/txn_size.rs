//! Exactly-once throughput and latency per transaction size.
//!
//! `cargo bench --bench txn_size -- --quick` (reduced grid, under 2 minutes) or without
//! `--quick` for the full grid: a raw rdkafka transactional producer (no framework; delivery
//! reports drained by polling before each commit) over transaction sizes, and the built
//! `exactly_once_etl` example (child process) in modes none / at-least-once /
//! transactional-offsets / two-phase-commit over checkpoint intervals; 100 B and 1 KiB
//! records; the bundled broker in memory and durable, or `--brokers HOST:PORT`. Prints a
//! markdown table and the targets, and writes `txn_size.md` and `txn_size.svg` to `--out`.

#[path = "txn_size/common.rs"]
mod common;
#[path = "txn_size/pipeline.rs"]
mod pipeline;
#[path = "txn_size/raw.rs"]
mod raw;
#[path = "txn_size/report.rs"]
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use onceflow_broker::storage::{FsyncPolicy, StorageConfig};
use onceflow_broker::BrokerConfig;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Exactly-once throughput and latency per transaction size")]
struct Args {
    /// Reduced grid (in-memory broker, 1 KiB, raw 10..10k, pipeline at 10 ms and 100 ms).
    #[arg(long)]
    quick: bool,
    /// Use this cluster instead of the bundled broker.
    #[arg(long)]
    brokers: Option<String>,
    /// Bundled broker storages: memory, durable (fsync every batch).
    #[arg(long, value_delimiter = ',')]
    storage: Option<Vec<String>>,
    /// Record (value) sizes in bytes.
    #[arg(long, value_delimiter = ',')]
    record_bytes: Option<Vec<usize>>,
    /// Raw producer transaction sizes.
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Pipeline checkpoint intervals in ms.
    #[arg(long, value_delimiter = ',')]
    intervals: Option<Vec<u64>>,
    /// Pipeline modes.
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Skip the raw producer.
    #[arg(long)]
    no_raw: bool,
    /// Skip the pipeline.
    #[arg(long)]
    no_pipeline: bool,
    /// Pipeline parallelism (= partitions of its topics).
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// Seconds of transactions per raw point (at least 3 transactions).
    #[arg(long)]
    raw_secs: Option<f64>,
    /// Pipeline backlog (throughput phase): at least this many checkpoint intervals of work
    /// at an assumed 150 MB/s (at most 200k records/s).
    #[arg(long)]
    backlog_intervals: Option<f64>,
    /// Pipeline backlog: at least this many seconds of work at the same assumed rate.
    #[arg(long)]
    backlog_secs: Option<f64>,
    /// Pipeline latency phase input rate, records/s.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// The exactly_once_etl binary (default: build it with cargo, release profile).
    #[arg(long)]
    etl_bin: Option<PathBuf>,
    /// Where txn_size.md and txn_size.svg go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn etl_binary(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(b) = &args.etl_bin {
        return Ok(b.clone());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--release", "--example", "exactly_once_etl"])
        .status()
        .context("running cargo build --example exactly_once_etl")?;
    anyhow::ensure!(st.success(), "building the exactly_once_etl example failed");
    // this binary is <target>/release/deps/txn_size-<hash>
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(Path::parent)
        .context("locating the target directory")?;
    let bin = release.join("examples").join("exactly_once_etl");
    anyhow::ensure!(bin.exists(), "{} not found", bin.display());
    Ok(bin)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{n} cores, {cpu}, load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let q = args.quick;
    let storages = args.storage.clone().unwrap_or_else(|| {
        if q {
            vec!["memory".into()]
        } else {
            vec!["memory".into(), "durable".into()]
        }
    });
    let record_bytes =
        args.record_bytes
            .clone()
            .unwrap_or_else(|| if q { vec![1024] } else { vec![100, 1024] });
    let sizes = args.sizes.clone().unwrap_or_else(|| {
        if q {
            vec![10, 100, 1_000, 10_000]
        } else {
            vec![1, 10, 100, 1_000, 10_000, 100_000]
        }
    });
    let intervals = args.intervals.clone().unwrap_or_else(|| {
        if q {
            vec![10, 100]
        } else {
            vec![10, 100, 1000]
        }
    });
    let modes = args.modes.clone().unwrap_or_else(|| {
        [
            "at-least-once",
            "two-phase-commit",
            "transactional-offsets",
            "none",
        ]
        .map(String::from)
        .to_vec()
    });
    let raw_secs = Duration::from_secs_f64(args.raw_secs.unwrap_or(if q { 1.5 } else { 4.0 }));
    let backlog_intervals = args.backlog_intervals.unwrap_or(10.0);
    let backlog_secs = args.backlog_secs.unwrap_or(if q { 2.0 } else { 3.0 });
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
            .join("txn_size")
    });
    std::fs::create_dir_all(&out)?;
    let bin = if args.no_pipeline {
        PathBuf::new()
    } else {
        etl_binary(&args)?
    };
    let machine_before = machine();
    println!("machine: {machine_before}");
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let mut points = Vec::new();
    let storage_list: Vec<String> = if args.brokers.is_some() {
        vec!["external".into()]
    } else {
        storages
    };
    let mut counter = 0u64;
    let run_id = common::now_us() % 1_000_000_000;
    for storage in &storage_list {
        let dir = tempfile::tempdir()?;
        let (broker, brokers) = match &args.brokers {
            Some(b) => (None, b.clone()),
            None => {
                let mut cfg = BrokerConfig::default();
                match storage.as_str() {
                    "memory" => {}
                    "durable" => {
                        cfg.storage = StorageConfig {
                            data_dir: Some(dir.path().to_path_buf()),
                            fsync: FsyncPolicy::EveryBatch,
                            ..StorageConfig::default()
                        }
                    }
                    other => anyhow::bail!("--storage {other}: expected memory or durable"),
                }
                let b = rt.block_on(onceflow_broker::start(cfg))?;
                let s = b.bootstrap_servers();
                (Some(b), s)
            }
        };
        for &bytes in &record_bytes {
            if !args.no_raw {
                for &size in &sizes {
                    counter += 1;
                    let tag = format!("{run_id}-{counter}");
                    match raw::run(&rt, &brokers, storage, &tag, size, bytes, raw_secs) {
                        Ok(p) => {
                            eprintln!(
                                "{storage} {bytes} B raw-txn {size}: {:.0} records/s",
                                p.records_per_s
                            );
                            points.push(p);
                        }
                        Err(e) => eprintln!("{storage} {bytes} B raw-txn {size}: FAILED: {e:#}"),
                    }
                }
            }
            if !args.no_pipeline {
                let guess_rate = (150e6 / bytes as f64).min(200_000.0);
                for &ms in &intervals {
                    let secs = backlog_secs.max(backlog_intervals * ms as f64 / 1000.0);
                    let backlog = (guess_rate * secs).max(1000.0) as u64;
                    for mode in &modes {
                        counter += 1;
                        let spec = pipeline::Spec {
                            bin: &bin,
                            brokers: &brokers,
                            storage,
                            tag: format!("{run_id}-{counter}"),
                            mode,
                            interval_ms: ms,
                            record_bytes: bytes,
                            backlog,
                            rate: args.rate,
                            parallelism: args.parallelism,
                        };
                        match pipeline::run(&rt, &spec) {
                            Ok(p) => {
                                eprintln!("{storage} {bytes} B {mode} {ms} ms: {:.0} records/s, e2e p50 {:.1} ms", p.records_per_s, p.e2e_ms.0);
                                points.push(p);
                                write_outputs(&out, &points, &machine_before, started)?;
                            }
                            Err(e) => {
                                eprintln!("{storage} {bytes} B {mode} {ms} ms: FAILED: {e:#}")
                            }
                        }
                    }
                }
            }
        }
        if let Some(b) = broker {
            rt.block_on(b.shutdown());
        }
    }
    write_outputs(&out, &points, &machine_before, started)?;
    println!("{}", std::fs::read_to_string(out.join("txn_size.md"))?);
    println!("wrote txn_size.md and txn_size.svg to {}", out.display());
    Ok(())
}

/// Writes txn_size.md and txn_size.svg; called after every point so a cut
/// run keeps what it measured.
fn write_outputs(
    out: &Path,
    points: &[common::Point],
    machine_before: &str,
    started: Instant,
) -> anyhow::Result<()> {
    let table = report::table(points);
    let targets = report::targets(points);
    let machine_now = machine();
    let md = format!(
        "machine at start: {machine_before}\n\nmachine at end: {machine_now}\n\nwall time: {:.0} s\n\n{table}\nTargets (this run):\n\n{targets}",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(out.join("txn_size.md"), &md)?;
    report::plot(points, &out.join("txn_size.svg"))?;
    Ok(())
}
