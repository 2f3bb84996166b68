//! Soak run (by hand, not CI): the broker and the example job `exactly_once_etl` as child
//! processes under steady input for a fixed time, the job SIGKILLed and restarted at a fixed
//! interval. Samples the resident memory of both once a second and, at the end, checks the
//! committed output record by record (every id exactly once, every key's last total equal to
//! the sum of its inputs). Prints a table of memory (start, peak, end, growth per minute) and
//! the exactness verdict; exits non-zero if the output is not exact.
//!
//! ```sh
//! cargo bench --bench soak                          # 10 minutes, kill every 30 s
//! ONCEFLOW_SOAK_MINUTES=2 ONCEFLOW_SOAK_KILL_EVERY_S=20 cargo bench --bench soak
//! ```
//!
//! Knobs: `ONCEFLOW_SOAK_MINUTES` (10), `ONCEFLOW_SOAK_KILL_EVERY_S` (30),
//! `ONCEFLOW_SOAK_RATE` (input records per second, 2000), `ONCEFLOW_SOAK_MODE`
//! (`transactional-offsets` or `two-phase-commit`, default the latter), and the
//! `ONCEFLOW_EOS_*` knobs of the shared harness (`onceflow_testkit::eos`).

use std::time::{Duration, Instant};

use onceflow_testkit::eos::*;

/// Resident set size of `pid` in KiB, if it runs.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Memory samples of one process kind: (seconds since the start, KiB).
#[derive(Default)]
struct Samples(Vec<(f64, u64)>);

impl Samples {
    fn push(&mut self, at: f64, kib: Option<u64>) {
        if let Some(k) = kib {
            self.0.push((at, k));
        }
    }

    fn peak(&self) -> u64 {
        self.0.iter().map(|s| s.1).max().unwrap_or(0)
    }

    fn first(&self) -> u64 {
        self.0.first().map_or(0, |s| s.1)
    }

    fn last(&self) -> u64 {
        self.0.last().map_or(0, |s| s.1)
    }

    /// Least-squares slope in KiB per minute over the samples after the first minute (start-up
    /// allocation is not growth).
    fn growth_per_minute(&self) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter(|(t, _)| *t >= 60.0)
            .map(|(t, k)| (*t / 60.0, *k as f64))
            .collect();
        if pts.len() < 2 {
            return 0.0;
        }
        let n = pts.len() as f64;
        let (sx, sy) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let (num, den) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
            (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
        });
        if den == 0.0 {
            0.0
        } else {
            num / den
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is expected.
    let minutes = env_u64("ONCEFLOW_SOAK_MINUTES", 10);
    let kill_every = Duration::from_secs(env_u64("ONCEFLOW_SOAK_KILL_EVERY_S", 30));
    let rate = env_u64("ONCEFLOW_SOAK_RATE", 2000);
    let mode = std::env::var("ONCEFLOW_SOAK_MODE").unwrap_or_else(|_| "two-phase-commit".into());
    let test = "soak";
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new(&mode, dir.path());
    let run_for = Duration::from_secs(minutes * 60);
    let n = rate * minutes * 60;
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    let broker_pid = broker.pid();
    eprintln!(
        "[soak] {minutes} min, {n} records at {rate}/s, SIGKILL every {kill_every:?}, mode {mode}"
    );

    // steady input: one chunk every 100 ms over the run
    let chunks = (run_for.as_millis() / 100) as usize;
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        chunks,
        Duration::from_millis(100),
    );

    let started = Instant::now();
    let (mut broker_mem, mut job_mem) = (Samples::default(), Samples::default());
    let mut kills = 0;
    let mut run = 0;
    let mut job = spawn_job(&bootstrap, &args, "soak-0");
    let mut since_spawn = Instant::now();
    while started.elapsed() < run_for {
        std::thread::sleep(Duration::from_secs(1));
        let at = started.elapsed().as_secs_f64();
        broker_mem.push(at, broker_pid.and_then(rss_kib));
        job_mem.push(at, rss_kib(job.pid()));
        if let Some(status) = job.try_status() {
            panic!("the job exited by itself ({status})\n{}", job.describe());
        }
        if since_spawn.elapsed() >= kill_every {
            assert!(job.kill9(), "the job exited before the SIGKILL");
            kills += 1;
            run += 1;
            job = spawn_job(&bootstrap, &args, &format!("soak-{run}"));
            since_spawn = Instant::now();
        }
    }
    producer.join().expect("input producer");
    let restarts = finish(&bootstrap, &args, &data, Some(job), FINISH_TIMEOUT, 5);
    let report = check_output(&bootstrap, &args, &data);

    println!("\nsoak: {minutes} min, {n} records at {rate}/s, mode {mode}, {kills} SIGKILLs of the job, seed {seed}\n");
    println!("| process | RSS at start | peak RSS | RSS at end | growth after minute 1 |");
    println!("|---|---|---|---|---|");
    for (name, s) in [("broker", &broker_mem), ("job", &job_mem)] {
        println!(
            "| {name} | {} | {} | {} | {:+.1} MiB/min |",
            mib(s.first()),
            mib(s.peak()),
            mib(s.last()),
            s.growth_per_minute() / 1024.0
        );
    }
    println!(
        "\noutput: {} records, {} missing, {} duplicated, {} unexpected, {} wrong totals; final restarts {restarts}",
        report.output_records,
        report.missing.len(),
        report.duplicated.len(),
        report.unexpected.len(),
        report.wrong_totals.len()
    );
    if !report.is_exact() {
        eprintln!("NOT EXACT: {report:?}");
        std::process::exit(1);
    }
    println!("exact: every id once, every key's last total equals the sum of its inputs");
    drop(broker);
    finish_dir(dir);
}
