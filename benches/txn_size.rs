//! Exactly-once throughput and latency per transaction size.
//!
//! `cargo bench --bench txn_size -- --quick` (reduced grid, one repetition, a few minutes) or
//! without `--quick` for the full grid (three repetitions of every row). Ceilings without
//! the framework: raw rdkafka transactional producers (one per sink subtask, each on its own
//! thread; delivery reports drained by polling before each commit) over transaction sizes,
//! and a raw consume-and-produce copy loop (`raw-copy`, one thread per partition). The
//! framework: the built `exactly_once_etl` example (child process) in modes none /
//! at-least-once / transactional-offsets / two-phase-commit over checkpoint intervals.
//! 100 B and 1 KiB records; the bundled broker in memory and durable, or `--brokers
//! HOST:PORT`. Every job row reports start-up (process start to first output) apart from
//! the steady throughput, and the job process' CPU seconds per million records. Prints a
//! markdown table (min / median / max over the repetitions) and the goals, and writes
//! `txn_size.md`, `txn_size.svg` and `txn_size.png` to `--out`.

#[path = "txn_size/common.rs"]
mod common;
#[path = "txn_size/copy.rs"]
mod copy;
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
    /// Pipeline modes (`raw-copy` is the framework-free copy loop, run at the first interval
    /// only: it has no checkpoints).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Repetitions of every row (default 3, 1 with --quick); the table shows min / median /
    /// max.
    #[arg(long)]
    repeat: Option<usize>,
    /// Skip the raw producer.
    #[arg(long)]
    no_raw: bool,
    /// Run the modes of each repetition at the same time, each its own job, and take every
    /// row's throughput over the window they share (see pipeline.rs): the VM's changes of
    /// speed then fall on all of them alike, so their ratios are steadier; absolute rates are
    /// a share of the machine's.
    #[arg(long)]
    concurrent: bool,
    /// Skip the pipeline.
    #[arg(long)]
    no_pipeline: bool,
    /// Pipeline parallelism (= partitions of its topics, raw producers, copy threads).
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// Seconds of transactions per raw point (at least 3 transactions).
    #[arg(long)]
    raw_secs: Option<f64>,
    /// Pipeline backlog (throughput phase): at least this many checkpoint intervals of work
    /// at the rate the calibration run measured (see --backlog-secs).
    #[arg(long)]
    backlog_intervals: Option<f64>,
    /// Pipeline backlog: at least this many seconds of work at 1.25 x the rate of a short
    /// calibration run of `none` per storage and record size (not reported; without it, with
    /// --quick or --no-calibrate, at an assumed 300 MB/s, at most 500k records/s). Default
    /// 16, with --quick 2.
    #[arg(long)]
    backlog_secs: Option<f64>,
    /// Size backlogs by the assumed rate instead of a calibration run.
    #[arg(long)]
    no_calibrate: bool,
    /// At most this many GB of record values in one run's topics, input and output (an
    /// in-memory broker holds both; default: 40 % of the machine's memory). The job's output
    /// records are small (about 70 B of JSON), the copy loop's as large as its input.
    #[arg(long)]
    backlog_max_gb: Option<f64>,
    /// Pipeline latency phase input rate, records/s.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// The exactly_once_etl binary (default: build it with cargo, release profile).
    #[arg(long)]
    etl_bin: Option<PathBuf>,
    /// Where txn_size.md and txn_size.svg go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Redraw txn_size.md/.svg/.png in `--out` from its txn_size.tsv (the points of an
    /// earlier run) and exit.
    #[arg(long)]
    replot: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// Internal: run as the raw-copy job process (see copy.rs).
    #[arg(long, hide = true)]
    copy_child: bool,
    /// Internal: the raw-copy child's input topic.
    #[arg(long, hide = true)]
    copy_input: Option<String>,
    /// Internal: the raw-copy child's output topic.
    #[arg(long, hide = true)]
    copy_output: Option<String>,
    /// Internal: records the raw-copy child copies before it exits.
    #[arg(long, hide = true, default_value_t = 0)]
    copy_max_records: u64,
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

/// An upper bound of the example job's output record (`{"id","key","amount","total"}`,
/// about 70 B), for the memory a backlog takes.
const JOB_OUTPUT_BYTES: usize = 128;

/// The machine's memory (MemTotal of /proc/meminfo) in bytes.
fn memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = info
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
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
        // No colour codes in a log file (the runs are usually redirected).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    if args.copy_child {
        return copy::run_child(copy::CopySpec {
            brokers: args
                .brokers
                .clone()
                .context("--copy-child needs --brokers")?,
            input: args
                .copy_input
                .clone()
                .context("--copy-child needs --copy-input")?,
            output: args
                .copy_output
                .clone()
                .context("--copy-child needs --copy-output")?,
            parallelism: args.parallelism.max(1),
            max_records: args.copy_max_records,
        });
    }
    if args.replot {
        let out = args.out.clone().context("--replot needs --out DIR")?;
        let tsv = std::fs::read_to_string(out.join("txn_size.tsv"))
            .with_context(|| format!("reading {}", out.join("txn_size.tsv").display()))?;
        let points = tsv
            .lines()
            .filter(|l| !l.is_empty())
            .map(common::Point::from_tsv)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let md = std::fs::read_to_string(out.join("txn_size.md")).unwrap_or_default();
        let machine_line = md
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("machine at start: "))
            .unwrap_or("unknown (replotted)")
            .to_string();
        let concurrent = md.contains(CONCURRENT_NOTE);
        write_outputs(&out, &points, &machine_line, Instant::now(), concurrent)?;
        println!("{}", std::fs::read_to_string(out.join("txn_size.md"))?);
        return Ok(());
    }
    let q = args.quick;
    let repeat = args.repeat.unwrap_or(if q { 1 } else { 3 }).max(1);
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
            "raw-copy",
        ]
        .map(String::from)
        .to_vec()
    });
    let raw_secs = Duration::from_secs_f64(args.raw_secs.unwrap_or(if q { 1.5 } else { 4.0 }));
    let backlog_intervals = args.backlog_intervals.unwrap_or(10.0);
    // 16 s of work keeps a job's start-up (0.07-0.9 s, docs/BENCHMARKS.md) under 5 %
    // of its run, and dilutes a fixed cost early in a run, which weighed on the steady
    // part's rate of 8 s runs
    let backlog_secs = args.backlog_secs.unwrap_or(if q { 2.0 } else { 16.0 });
    let calibrate = !(q || args.no_calibrate);
    let backlog_max_bytes = match args.backlog_max_gb {
        Some(gb) => gb * 1e9,
        None => memory_bytes().map_or(4e9, |m| m as f64 * 0.4),
    };
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
    let self_bin = std::env::current_exe().context("locating this benchmark's binary")?;
    let clock_ticks = common::clock_ticks();
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
                    for rep in 0..repeat {
                        counter += 1;
                        let tag = format!("{run_id}-{counter}");
                        let spec = raw::Spec {
                            brokers: &brokers,
                            storage,
                            tag: &tag,
                            size,
                            record_bytes: bytes,
                            producers: args.parallelism.max(1),
                            budget: raw_secs,
                            rep,
                        };
                        match raw::run(&rt, &spec) {
                            Ok(p) => {
                                eprintln!(
                                    "{storage} {bytes} B raw-txn {size} x{} (rep {rep}): {:.0} records/s",
                                    spec.producers, p.records_per_s
                                );
                                points.push(p);
                            }
                            Err(e) => {
                                eprintln!("{storage} {bytes} B raw-txn {size}: FAILED: {e:#}")
                            }
                        }
                    }
                }
            }
            if !args.no_pipeline {
                let guess_rate = (300e6 / bytes as f64).min(500_000.0);
                // the most records one run's topics may hold: the job writes at most
                // JOB_OUTPUT_BYTES per record, the copy loop what it reads
                let max_records = |mode: &str| {
                    let out = if mode == "raw-copy" {
                        bytes
                    } else {
                        JOB_OUTPUT_BYTES
                    };
                    (backlog_max_bytes / (bytes + out) as f64).max(1000.0)
                };
                // the rate the backlogs are sized by: a short run of `none` (the fastest
                // job mode; raw-copy is at most 1.2x of it in every grid so far) measures
                // the machine, so that runs are long enough on a fast one and not needlessly
                // long on a slow one
                let calibrate_mode = if modes.iter().any(|m| m != "raw-copy") {
                    Some("none")
                } else {
                    modes.first().map(String::as_str)
                };
                // one run of `mode` of this storage and record size
                let spec = |mode, interval_ms, backlog, rep, tag| pipeline::Spec {
                    bin: if mode == "raw-copy" { &self_bin } else { &bin },
                    brokers: &brokers,
                    storage,
                    tag,
                    mode,
                    interval_ms,
                    record_bytes: bytes,
                    backlog,
                    rate: args.rate,
                    parallelism: args.parallelism,
                    rep,
                    clock_ticks,
                    start: None,
                };
                let rate = match calibrate_mode.filter(|_| calibrate) {
                    Some(mode) => {
                        counter += 1;
                        let calibration = spec(
                            mode,
                            intervals.first().copied().unwrap_or(100),
                            ((guess_rate * 2.0) as u64).clamp(1000, max_records(mode) as u64),
                            0,
                            format!("{run_id}-{counter}"),
                        );
                        match pipeline::run(&rt, &calibration) {
                            Ok(p) => {
                                eprintln!(
                                    "{storage} {bytes} B calibration ({mode}, not reported): {:.0} records/s; backlogs sized for {:.0} records/s",
                                    p.records_per_s,
                                    1.25 * p.records_per_s
                                );
                                1.25 * p.records_per_s
                            }
                            Err(e) => {
                                eprintln!("{storage} {bytes} B calibration ({mode}): FAILED: {e:#}; backlogs sized for the assumed {guess_rate:.0} records/s");
                                guess_rate
                            }
                        }
                    }
                    None => guess_rate,
                };
                for (k, &ms) in intervals.iter().enumerate() {
                    let secs = backlog_secs.max(backlog_intervals * ms as f64 / 1000.0);
                    let wanted = (rate * secs).max(1000.0);
                    let backlog = |mode: &str, say: bool| {
                        let max = max_records(mode);
                        if wanted > max && say {
                            eprintln!(
                                "{storage} {bytes} B {mode} {ms} ms: backlog capped at {max:.0} records ({:.1} GB in the topics, --backlog-max-gb), {:.1} s of work at {rate:.0} records/s",
                                backlog_max_bytes / 1e9,
                                max / rate
                            );
                        }
                        wanted.min(max) as u64
                    };
                    // repetitions go round the modes, so every mode sees the same noise
                    for rep in 0..repeat {
                        let mut specs = Vec::new();
                        for mode in &modes {
                            // the copy loop has no checkpoints: once per record size
                            if mode == "raw-copy" && k > 0 {
                                continue;
                            }
                            counter += 1;
                            specs.push(spec(
                                mode,
                                ms,
                                backlog(mode, rep == 0),
                                rep,
                                format!("{run_id}-{counter}"),
                            ));
                        }
                        // odd repetitions run the modes in reverse, so no mode always runs
                        // first (on a fresh machine) or right after the same other mode
                        if rep % 2 == 1 {
                            specs.reverse();
                        }
                        let labels: Vec<&str> = specs.iter().map(|s| s.mode).collect();
                        let results = if args.concurrent {
                            pipeline::run_concurrently(&rt, specs)
                        } else {
                            specs.iter().map(|s| pipeline::run(&rt, s)).collect()
                        };
                        for (mode, r) in labels.into_iter().zip(results) {
                            match r {
                                Ok(p) => {
                                    eprintln!(
                                        "{storage} {bytes} B {mode} {ms} ms (rep {rep}): {:.0} records/s steady, start-up {:.2} s of {:.1} s, {:.1} CPU s per M records, e2e p50 {:.1} ms",
                                        p.records_per_s, p.startup_s, p.run_s, p.cpu_s_per_m, p.e2e_ms.0
                                    );
                                    points.push(p);
                                    write_outputs(
                                        &out,
                                        &points,
                                        &machine_before,
                                        started,
                                        args.concurrent,
                                    )?;
                                }
                                Err(e) => {
                                    eprintln!("{storage} {bytes} B {mode} {ms} ms: FAILED: {e:#}")
                                }
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
    write_outputs(&out, &points, &machine_before, started, args.concurrent)?;
    println!("{}", std::fs::read_to_string(out.join("txn_size.md"))?);
    println!(
        "wrote txn_size.md, txn_size.svg and txn_size.png to {}",
        out.display()
    );
    Ok(())
}

/// Said in txn_size.md of a `--concurrent` run (and recognised by `--replot`).
const CONCURRENT_NOTE: &str = "The modes of each repetition ran at the same time (--concurrent): each row's records/s and CPU s / M records are over the window all of them were in their steady part.\n\n";

/// Writes txn_size.md, txn_size.svg and txn_size.png; called after every point so a cut run
/// keeps what it measured.
fn write_outputs(
    out: &Path,
    points: &[common::Point],
    machine_before: &str,
    started: Instant,
    concurrent: bool,
) -> anyhow::Result<()> {
    let table = report::table(points);
    let targets = report::targets(points);
    let machine_now = machine();
    let how = if concurrent { CONCURRENT_NOTE } else { "" };
    let md = format!(
        "machine at start: {machine_before}\n\nmachine at end: {machine_now}\n\nwall time: {:.0} s\n\n{how}{table}\nGoals (this run; ratios of medians, in brackets min-max of the ratios of the repetitions run side by side):\n\n{targets}",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(out.join("txn_size.md"), &md)?;
    let tsv: String = points.iter().map(|p| p.to_tsv() + "\n").collect();
    std::fs::write(out.join("txn_size.tsv"), tsv)?;
    report::plot(points, &out.join("txn_size.svg"), &out.join("txn_size.png"))?;
    Ok(())
}
