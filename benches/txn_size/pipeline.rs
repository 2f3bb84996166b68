//! One pipeline point: the built `exactly_once_etl` example (or, for `raw-copy`, this
//! benchmark's own copy loop, see `copy.rs`) run as a child process against the benchmark's
//! broker. Throughput phase: a prefilled backlog of `backlog` input records. Start-up is the
//! time from spawning the process to its first output visible to a read_committed consumer;
//! throughput is taken over the steady part, from the moment 5% of the backlog was visible to
//! the moment 95% was, so neither start-up nor the wait for the last commit counts. CPU is
//! the child's user + system time (/proc/<pid>/stat, sampled every 50 ms) over that same
//! steady part, per million records that became visible in it. Latency phase: then `rate`
//! records/s paced for a few checkpoint intervals, each timed from its send (its input
//! timestamp) to its output's read_committed visibility.
//!
//! With `--concurrent` ([`run_concurrently`]) the modes of one repetition run at the same
//! time, each its own job process with its own topics, against the one broker: every backlog
//! is prefilled first, the jobs start together, and each job's throughput is taken over the
//! common window, from the moment the last of them had 5% of its backlog visible to the
//! moment the first had 95%. The VM's speed then changes under all of them at once, so their
//! ratio does not carry it; each job has about a share of the cores instead of all of them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::common::{
    committed_reader, create_topics, delete_topics, input_json, input_key, now_us, p50_p99,
    process_cpu_seconds, watch, Point,
};

/// Share of the backlog visible where the steady part starts (and, from the end, stops).
const STEADY_EDGE: f64 = 0.05;

/// What one pipeline point runs.
pub struct Spec<'a> {
    /// The example binary.
    pub bin: &'a Path,
    /// Bootstrap servers.
    pub brokers: &'a str,
    /// Storage label for the table.
    pub storage: &'a str,
    /// Unique name part for topics, group and transactional ids.
    pub tag: String,
    /// --mode.
    pub mode: &'a str,
    /// --checkpoint-interval-ms.
    pub interval_ms: u64,
    /// Value bytes per input record.
    pub record_bytes: usize,
    /// Records prefilled for the throughput phase.
    pub backlog: u64,
    /// Records/s of the latency phase.
    pub rate: u64,
    /// --parallelism (and partitions per topic).
    pub parallelism: usize,
    /// Repetition index.
    pub rep: usize,
    /// Clock ticks per second of /proc/<pid>/stat.
    pub clock_ticks: f64,
    /// Set when the point runs beside others: its job starts once every point's backlog is
    /// prefilled.
    pub start: Option<Arc<StartGate>>,
}

/// Holds the jobs of points run concurrently until every one of them is ready to start.
pub struct StartGate {
    expected: usize,
    arrived: Mutex<usize>,
    all: Condvar,
}

/// How long a point ready to start waits for the others (one that failed never arrives).
const GATE_PATIENCE: Duration = Duration::from_secs(300);

impl StartGate {
    pub fn new(expected: usize) -> Self {
        StartGate {
            expected,
            arrived: Mutex::new(0),
            all: Condvar::new(),
        }
    }

    /// Counts this point in and waits for the rest; `false` if they did not all arrive in
    /// [`GATE_PATIENCE`] (the point then starts anyway).
    fn arrive(&self) -> bool {
        let mut n = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        self.all.notify_all();
        let (n, timeout) = self
            .all
            .wait_timeout_while(n, GATE_PATIENCE, |n| *n < self.expected)
            .unwrap_or_else(|e| e.into_inner());
        !timeout.timed_out() || *n >= self.expected
    }
}

/// Visibility times (us) of the backlog: first record, STEADY_EDGE, 1 - STEADY_EDGE, all.
#[derive(Clone, Copy, Debug)]
struct BacklogTimes {
    first: u64,
    lo: (u64, u64),
    hi: (u64, u64),
    all: u64,
}

fn producer(brokers: &str) -> anyhow::Result<BaseProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()?)
}

fn send(p: &BaseProducer, topic: &str, id: u64, bytes: usize, ts_us: u64) {
    let key = input_key(id);
    let value = input_json(id, bytes);
    let mut rec = BaseRecord::to(topic)
        .key(key.as_bytes())
        .payload(&value[..])
        .timestamp((ts_us / 1000) as i64);
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((_, r)) => {
                p.poll(Duration::from_millis(1));
                rec = r;
            }
        }
    }
}

fn drain(p: &BaseProducer) {
    while p.in_flight_count() > 0 {
        p.poll(Duration::from_millis(1));
    }
}

struct ChildGuard(Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn id_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<u64> {
    serde_json::from_slice::<OutputId>(m.payload()?)
        .ok()
        .map(|o| o.id)
}

/// The one field of an output record the watcher reads. serde skips the other fields
/// without building them; a `serde_json::Value` per record (a map, a string per field) cost
/// the watcher, which shares the machine with the job it measures, a visible share of the
/// CPU at 300k records/s.
#[derive(serde::Deserialize)]
struct OutputId {
    id: u64,
}

/// Runs one point.
pub fn run(rt: &tokio::runtime::Runtime, s: &Spec<'_>) -> anyhow::Result<Point> {
    run_timed(rt, s).map(|m| m.point)
}

/// A point and the times (us) at which its backlog records became visible, in order: entry
/// k is when k + 1 distinct backlog records were.
struct Measured {
    point: Point,
    visible: Vec<u64>,
    /// (time us, the job's CPU seconds) every [`CPU_SAMPLE_STEP`] until the backlog was
    /// visible.
    cpu_seen: Vec<(u64, f64)>,
}

/// How often a point samples its job's CPU time while the backlog goes through.
const CPU_SAMPLE_STEP: Duration = Duration::from_millis(50);

fn run_timed(rt: &tokio::runtime::Runtime, s: &Spec<'_>) -> anyhow::Result<Measured> {
    let (input, output) = (format!("in-{}", s.tag), format!("out-{}", s.tag));
    let dlq = format!("{output}.dlq");
    let parts = s.parallelism as i32;
    let created = create_topics(rt, s.brokers, &[&input, &output, &dlq], parts);
    let r = created.and_then(|()| measure(s, &input, &output, parts));
    if r.is_err() {
        // the others wait for this point's job until it arrives: do not keep them waiting
        if let Some(gate) = &s.start {
            let _ = std::thread::spawn({
                let gate = gate.clone();
                move || gate.arrive()
            });
        }
    }
    delete_topics(rt, s.brokers, &[&input, &output, &dlq]);
    r
}

/// Runs the points at the same time (see the module documentation); each result is in the
/// order of `specs`. A point's `records_per_s` and `steady_s` are over the window that all
/// the successful points share; if they share none (one finished before another reached 5%)
/// each keeps its own and a warning says so.
pub fn run_concurrently(
    rt: &tokio::runtime::Runtime,
    mut specs: Vec<Spec<'_>>,
) -> Vec<anyhow::Result<Point>> {
    let gate = Arc::new(StartGate::new(specs.len()));
    for s in &mut specs {
        s.start = Some(gate.clone());
    }
    let mut results: Vec<anyhow::Result<Measured>> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .map(|s| scope.spawn(move || run_timed(rt, s)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the point's thread panicked")))
            })
            .collect()
    });
    let ok: Vec<&Measured> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let window = common_window(&ok.iter().map(|m| &m.visible[..]).collect::<Vec<_>>());
    match window {
        Some((t1, t2)) => {
            for m in results.iter_mut().filter_map(|r| r.as_mut().ok()) {
                let secs = (t2 - t1) as f64 / 1e6;
                let records = visible_at(&m.visible, t2) - visible_at(&m.visible, t1);
                m.point.records_per_s = records / secs;
                m.point.steady_s = secs;
                // CPU per record over the same window: the job's efficiency, whatever share
                // of the cores it got
                if let Some((cpu, per_m)) = cpu_between(&m.cpu_seen, t1, t2, records) {
                    m.point.cpu_s_per_m = per_m;
                    tracing::info!(mode = %m.point.mode, rep = m.point.rep, cores = cpu / secs, "CPU share over the common window");
                }
            }
        }
        None if ok.len() > 1 => tracing::warn!(
            "the concurrent points share no steady window: each keeps its own throughput"
        ),
        None => {}
    }
    results.into_iter().map(|r| r.map(|m| m.point)).collect()
}

/// Marks of a backlog of `n` records: how many are visible where the steady part starts and
/// where it ends.
fn steady_marks(n: u64) -> (u64, u64) {
    let lo = ((n as f64 * STEADY_EDGE).ceil() as u64).max(1);
    let hi = ((n as f64 * (1.0 - STEADY_EDGE)).floor() as u64).max(lo);
    (lo, hi)
}

/// The window (us) in which every timeline is between its 5% and 95% marks, if any.
fn common_window(timelines: &[&[u64]]) -> Option<(u64, u64)> {
    let mut start = 0u64;
    let mut end = u64::MAX;
    for v in timelines {
        if v.is_empty() {
            return None;
        }
        let (lo, hi) = steady_marks(v.len() as u64);
        start = start.max(v[lo as usize - 1]);
        end = end.min(v[hi as usize - 1]);
    }
    (!timelines.is_empty() && end > start).then_some((start, end))
}

/// The job's CPU seconds at `t`, interpolated between the samples around it.
fn cpu_at(samples: &[(u64, f64)], t: u64) -> Option<f64> {
    let k = samples.partition_point(|&(x, _)| x <= t);
    let (ta, ca) = *samples.get(k.checked_sub(1)?)?;
    let (tb, cb) = *samples.get(k)?;
    Some(ca + (cb - ca) * (t - ta) as f64 / (tb - ta).max(1) as f64)
}

/// The job's CPU seconds from `t1` to `t2`, and per million of the `records` that became
/// visible in that time; `None` if the samples do not cover it.
fn cpu_between(samples: &[(u64, f64)], t1: u64, t2: u64, records: f64) -> Option<(f64, f64)> {
    let cpu = cpu_at(samples, t2)? - cpu_at(samples, t1)?;
    Some((cpu, cpu / records.max(1.0) * 1e6))
}

/// Gap (us) that separates two bursts of visibility in [`visible_at`].
const BURST_GAP_US: u64 = 1000;

/// Records of a timeline visible at `t`, interpolated: a read_committed consumer sees the
/// output in bursts (a two-phase-commit job's at every commit), so progress is drawn as a
/// straight line from the end of one burst (its time and count) to the end of the next, not
/// as a staircase that would put up to a burst's worth of error at each edge of the window.
fn visible_at(visible: &[u64], t: u64) -> f64 {
    let n = visible.len();
    let ends_burst = |i: usize| i + 1 == n || visible[i + 1] - visible[i] > BURST_GAP_US;
    let k = visible.partition_point(|&x| x <= t);
    if k == 0 {
        return 0.0;
    }
    if k == n {
        return n as f64;
    }
    // the last burst that ended by t (none: the line starts at the first record, count 0)
    let (ta, ca) = match (0..k).rev().find(|&i| ends_burst(i)) {
        Some(i) => (visible[i], (i + 1) as f64),
        None => (visible[0], 0.0),
    };
    // the burst that ends after t
    let b = (k..n).find(|&i| ends_burst(i)).unwrap_or(n - 1);
    let (tb, cb) = (visible[b], (b + 1) as f64);
    if tb <= ta {
        return ca;
    }
    ca + (cb - ca) * t.saturating_sub(ta) as f64 / (tb - ta) as f64
}

fn job_command(s: &Spec<'_>, input: &str, output: &str, ckpt: &Path, max: u64) -> Command {
    if s.mode == "raw-copy" {
        let mut c = Command::new(s.bin);
        c.args(["--copy-child", "--brokers", s.brokers])
            .args(["--copy-input", input, "--copy-output", output])
            .args(["--parallelism", &s.parallelism.to_string()])
            .args(["--copy-max-records", &max.to_string()]);
        return c;
    }
    let mut c = Command::new(s.bin);
    c.args(["--brokers", s.brokers, "--input", input, "--output", output])
        .args(["--group", &format!("g-{}", s.tag), "--mode", s.mode])
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .args(["--checkpoint-interval-ms", &s.interval_ms.to_string()])
        .args(["--parallelism", &s.parallelism.to_string()])
        .args(["--transactional-id-prefix", &format!("etl-{}", s.tag)])
        .args(["--max-records", &max.to_string()]);
    // extra job flags for diagnosis, e.g. `--metrics-listen 127.0.0.1:9898`
    if let Ok(extra) = std::env::var("TXN_SIZE_JOB_ARGS") {
        c.args(extra.split_whitespace());
    }
    c
}

fn measure(s: &Spec<'_>, input: &str, output: &str, parts: i32) -> anyhow::Result<Measured> {
    let (input, output) = (input.to_string(), output.to_string());
    let interval = Duration::from_millis(s.interval_ms);
    let latency_secs = (3 * s.interval_ms).max(2000) as f64 / 1000.0;
    let n2 = ((s.rate as f64) * latency_secs) as u64;
    let n1 = s.backlog;

    // prefill the backlog
    let p = producer(s.brokers)?;
    for id in 0..n1 {
        send(&p, &input, id, s.record_bytes, now_us());
    }
    drain(&p);

    // watcher of the output
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..n2).map(|_| AtomicU64::new(0)).collect());
    let (phase_tx, phase_rx) = mpsc::channel::<(BacklogTimes, Vec<u64>)>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let watcher = {
        let (brokers, output, sent) = (s.brokers.to_string(), output.clone(), sent.clone());
        std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
            let c = committed_reader(&brokers, &output, parts)?;
            let _ = ready_tx.send(());
            let mut seen = vec![false; n1 as usize];
            let mut backlog_seen = 0u64;
            let mut visible = Vec::with_capacity(n1 as usize);
            let (lo_n, hi_n) = steady_marks(n1);
            let mut times = BacklogTimes {
                first: 0,
                lo: (0, 0),
                hi: (0, 0),
                all: 0,
            };
            let mut lat = Vec::with_capacity(n2 as usize);
            let mut lat_seen = vec![false; n2 as usize];
            let deadline = Instant::now() + Duration::from_secs(900);
            let ok = watch(&c, deadline, |m, t| {
                if let Some(id) = m.and_then(id_of) {
                    if id < n1 {
                        if !seen[id as usize] {
                            seen[id as usize] = true;
                            backlog_seen += 1;
                            visible.push(t);
                            if backlog_seen == 1 {
                                times.first = t;
                            }
                            if backlog_seen == lo_n {
                                times.lo = (lo_n, t);
                            }
                            if backlog_seen == hi_n {
                                times.hi = (hi_n, t);
                            }
                            if backlog_seen == n1 {
                                times.all = t;
                                let _ = phase_tx.send((times, std::mem::take(&mut visible)));
                            }
                        }
                    } else if let Some(i) = (id - n1)
                        .try_into()
                        .ok()
                        .filter(|i: &usize| *i < lat_seen.len())
                    {
                        if !lat_seen[i] {
                            lat_seen[i] = true;
                            let s0 = sent[i].load(Ordering::Acquire);
                            lat.push(t.saturating_sub(s0) as f64 / 1000.0);
                        }
                    }
                }
                backlog_seen == n1 && lat.len() as u64 == n2
            })?;
            if !ok {
                anyhow::bail!(
                    "output incomplete: {backlog_seen}/{n1} backlog, {}/{n2} paced",
                    lat.len()
                );
            }
            Ok(lat)
        })
    };

    // the job starts once the watcher is assigned (its start-up is not the watcher's), and
    // with others: once they are all ready too
    match ready_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err(match watcher.join() {
                Ok(Err(e)) => e.context("the read_committed watcher did not start"),
                _ => anyhow::anyhow!("the read_committed watcher stopped before it started"),
            })
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            anyhow::bail!("the read_committed watcher was not assigned within 60 s")
        }
    }
    if let Some(gate) = &s.start {
        if !gate.arrive() {
            tracing::warn!(tag = %s.tag, "not every concurrent point got ready: starting anyway");
        }
    }
    let dir = tempfile::tempdir()?;
    // TXN_SIZE_JOB_LOG (a RUST_LOG filter, for diagnosis) logs the job to
    // job-<tag>.log in the current directory instead of a file deleted with the row
    let log_filter = std::env::var("TXN_SIZE_JOB_LOG").ok();
    let stderr_path = match &log_filter {
        Some(_) => std::path::PathBuf::from(format!("job-{}.log", s.tag)),
        None => dir.path().join("stderr.log"),
    };
    let stderr = std::fs::File::create(&stderr_path)?;
    let spawned = now_us();
    let child = job_command(s, &input, &output, &dir.path().join("ckpt"), n1 + n2)
        .env("RUST_LOG", log_filter.as_deref().unwrap_or("warn"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {}", s.bin.display()))?;
    let mut child = ChildGuard(child);
    let lines: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let reader = {
        let out = child.0.stdout.take().context("child stdout")?;
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let t = now_us();
                lines.lock().unwrap_or_else(|e| e.into_inner()).push((t, l));
            }
        })
    };
    let stderr_tail = || {
        std::fs::read_to_string(&stderr_path)
            .map(|s| s.lines().rev().take(15).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    };
    let find = |pred: &dyn Fn(&str) -> bool| -> Option<u64> {
        lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, l)| pred(l))
            .map(|(t, _)| *t)
    };
    let wait_start = Instant::now();
    loop {
        if find(&|l| l == "job started").is_some() {
            break;
        }
        if wait_start.elapsed() > Duration::from_secs(60) || child.0.try_wait()?.is_some() {
            anyhow::bail!("the job did not start; stderr:\n{}", stderr_tail());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // the job's CPU seconds over time, for CPU per record over the steady part (or, with
    // concurrent points, over their common window)
    let mut cpu_seen: Vec<(u64, f64)> = Vec::new();
    let backlog_deadline = Instant::now() + Duration::from_secs(600);
    let (backlog, visible) = loop {
        match phase_rx.recv_timeout(CPU_SAMPLE_STEP) {
            Ok(v) => break v,
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < backlog_deadline => {
                if let Some(c) = process_cpu_seconds(child.0.id(), s.clock_ticks) {
                    cpu_seen.push((now_us(), c));
                }
            }
            Err(_) => anyhow::bail!("backlog not visible in time; stderr:\n{}", stderr_tail()),
        }
    };
    if let Some(c) = process_cpu_seconds(child.0.id(), s.clock_ticks) {
        cpu_seen.push((now_us(), c));
    }

    // latency phase: paced input, send time = input timestamp
    let t0 = Instant::now();
    let tick = Duration::from_millis(5);
    let mut id = 0u64;
    while id < n2 {
        let due = ((t0.elapsed().as_secs_f64() * s.rate as f64) as u64 + 1).min(n2);
        while id < due {
            let t = now_us();
            sent[id as usize].store(t, Ordering::Release);
            send(&p, &input, n1 + id, s.record_bytes, t);
            id += 1;
        }
        p.poll(Duration::ZERO);
        std::thread::sleep(tick);
    }
    drain(&p);
    let lat = watcher
        .join()
        .map_err(|_| anyhow::anyhow!("watcher panicked"))?
        .map_err(|e| anyhow::anyhow!("{e}; stderr:\n{}", stderr_tail()))?;
    let exit_deadline = Instant::now() + Duration::from_secs(60) + interval;
    let status = loop {
        if let Some(st) = child.0.try_wait()? {
            break st;
        }
        if Instant::now() > exit_deadline {
            anyhow::bail!("the job did not stop after --max-records");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = reader.join();
    if !status.success() {
        anyhow::bail!("the job exited with {status}; stderr:\n{}", stderr_tail());
    }

    // commit latency: `checkpoint N complete` -> `checkpoint N committed` as seen here
    let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
    let mut complete = std::collections::HashMap::new();
    let mut commits = Vec::new();
    for (t, l) in lines.iter() {
        if let Some(n) = l.strip_prefix("checkpoint ") {
            if let Some(n) = n.strip_suffix(" complete") {
                complete.insert(n.to_string(), *t);
            } else if let Some(n) = n.strip_suffix(" committed") {
                if let Some(c) = complete.get(n) {
                    commits.push(t.saturating_sub(*c) as f64 / 1000.0);
                }
            }
        }
    }
    let secs = (backlog.hi.1.saturating_sub(backlog.lo.1) as f64 / 1e6).max(1e-6);
    let rate = (backlog.hi.0 - backlog.lo.0).max(1) as f64 / secs;
    let startup_s = backlog.first.saturating_sub(spawned) as f64 / 1e6;
    // CPU per record of the steady part, so that start-up (the transactional modes make
    // their producers then) does not enter it; start-up is its own column
    let records = (backlog.hi.0 - backlog.lo.0) as f64;
    let cpu_s_per_m = cpu_between(&cpu_seen, backlog.lo.1, backlog.hi.1, records)
        .map_or(f64::NAN, |(_, per_m)| per_m);
    tracing::debug!(?backlog, spawned, "backlog visibility");
    let commit_ms = if commits.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        p50_p99(commits)
    };
    let point = Point {
        storage: s.storage.to_string(),
        record_bytes: s.record_bytes,
        mode: s.mode.to_string(),
        interval_ms: Some(s.interval_ms),
        records_per_txn: if s.mode == "raw-copy" {
            f64::NAN
        } else {
            rate * interval.as_secs_f64() / s.parallelism as f64
        },
        records_per_s: rate,
        commit_ms,
        e2e_ms: p50_p99(lat),
        records: n1,
        startup_s,
        run_s: backlog.all.saturating_sub(spawned) as f64 / 1e6,
        steady_s: secs,
        cpu_s_per_m,
        rep: s.rep,
    };
    Ok(Measured {
        point,
        visible,
        cpu_seen,
    })
}
