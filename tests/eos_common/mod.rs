//! Harness of the exactly-once tests: the broker and the example job
//! `examples/exactly_once_etl` run as child processes over TCP on 127.0.0.1, the input is
//! produced with rdkafka, and the output is checked record by record with a read_committed
//! consumer.
//!
//! Environment knobs: `ONCEFLOW_EOS_RECORDS` (input records of the kill -9 runs; default
//! 200000), `ONCEFLOW_EOS_SEED` (random kill moments and data; printed by
//! every test), `ONCEFLOW_EOS_KILLS` (SIGKILLs per kill -9 run, default 10),
//! `ONCEFLOW_EOS_VERBOSE` (echo children's stdout), `ONCEFLOW_EOS_JOB_LOG` /
//! `ONCEFLOW_EOS_BROKER_LOG` (RUST_LOG of the children; logs stay in the test's temp dir
//! when `ONCEFLOW_EOS_KEEP` is set), `ONCEFLOW_EOS_PREBUILT` (use the example and broker
//! binaries as built, without `cargo build`).
//!
//! Faults that an assertion depends on are triggered on what the processes report (stdout
//! lines, the checkpoint directory, the topics), never on how long something takes; waits
//! are bounded only against a process that is stuck.

#![allow(dead_code)]

pub mod checkpoints;
pub mod data;
pub mod procs;
pub mod proxy;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

#[allow(unused_imports)] // used by the kill -9, failpoint and stall tests only
pub use checkpoints::*;
pub use data::*;
pub use procs::*;
#[allow(unused_imports)] // used by the network-drop tests only
pub use proxy::Proxy;

/// Serialises the scenarios of one test binary: each runs a broker and job processes, and
/// running several at once on a 2-core machine only makes kill timing meaningless.
static MACHINE: Mutex<()> = Mutex::new(());

/// Takes the machine for one scenario (poison from an earlier failed test is ignored).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A u64 from the environment or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seed of this run (`ONCEFLOW_EOS_SEED` or random), printed so failures reproduce.
pub fn seed(test: &str) -> u64 {
    let seed = env_u64("ONCEFLOW_EOS_SEED", rand::random::<u32>() as u64);
    eprintln!("[eos] {test}: ONCEFLOW_EOS_SEED={seed}");
    seed
}

/// A temp dir for one scenario; kept on disk when `ONCEFLOW_EOS_KEEP` is set.
pub fn scenario_dir(test: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("onceflow-{test}-"))
        .tempdir()
        .expect("tempdir");
    eprintln!("[eos] {test}: logs in {}", dir.path().display());
    dir
}

/// Keeps `dir` on disk if `ONCEFLOW_EOS_KEEP` is set.
pub fn finish_dir(dir: tempfile::TempDir) {
    if std::env::var_os("ONCEFLOW_EOS_KEEP").is_some() {
        let _ = dir.keep();
    }
}

/// Tails the output and DLQ topics with a read_committed consumer, counting the distinct ids
/// and malformed markers seen so far.
pub struct Tail {
    consumer: BaseConsumer,
    ids: HashSet<u64>,
    duplicates: usize,
    markers: HashSet<String>,
    output: String,
}

impl Tail {
    /// Assigns every partition of `output` and `dlq` from the beginning.
    pub fn new(bootstrap: &str, output: &str, dlq: &str) -> Tail {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("eos-tail-{}", rand::random::<u32>()))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "100")
            .create()
            .expect("tail consumer");
        let mut tpl = TopicPartitionList::new();
        for t in [output, dlq] {
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(t, p, Offset::Beginning)
                    .expect("tpl");
            }
        }
        consumer.assign(&tpl).expect("assign");
        Tail {
            consumer,
            ids: HashSet::new(),
            duplicates: 0,
            markers: HashSet::new(),
            output: output.to_string(),
        }
    }

    /// Consumes what is available for up to `d`.
    pub fn poll_for(&mut self, data: &Dataset, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            let Some(m) = self.consumer.poll(Duration::from_millis(50)) else {
                continue;
            };
            // Transient errors (e.g. the broker restarting) are retried by librdkafka.
            let Ok(m) = m else { continue };
            let value = m.payload().unwrap_or_default();
            if m.topic() == self.output {
                if let Some(o) = parse_output(value) {
                    if !self.ids.insert(o.id) {
                        self.duplicates += 1;
                    }
                }
            } else {
                let text = String::from_utf8_lossy(value);
                if let Some(mk) = data
                    .bad_markers
                    .iter()
                    .find(|mk| text.contains(mk.as_str()))
                {
                    self.markers.insert(mk.clone());
                }
            }
        }
    }

    /// True once every expected id and every malformed marker was seen.
    pub fn complete(&self, data: &Dataset) -> bool {
        self.ids.len() >= data.expected.len() && self.markers.len() >= data.bad_markers.len()
    }

    /// (ids seen, markers seen).
    pub fn progress(&self) -> (usize, usize) {
        (self.ids.len(), self.markers.len())
    }

    /// Output records seen whose id was seen before.
    pub fn duplicates(&self) -> usize {
        self.duplicates
    }
}

/// How long [`finish`] waits without any new output before it calls the job stuck. Only a
/// stuck job takes this long: a slow one on a loaded machine still makes progress.
pub const STUCK_AFTER: Duration = Duration::from_secs(240);

/// Runs the job (restarting it if it exits, at most `max_restarts` times) until the tail saw
/// every id and every malformed record, then stops it with SIGTERM and expects exit 0.
/// `job` may hold an already running instance. `timeout` bounds the whole run; besides, the
/// output must grow at least every [`STUCK_AFTER`]. Returns the number of restarts the test did.
pub fn finish(
    bootstrap: &str,
    args: &JobArgs,
    data: &Dataset,
    job: Option<Proc>,
    timeout: Duration,
    max_restarts: usize,
) -> usize {
    finish_when(bootstrap, args, data, job, timeout, max_restarts, |_| true)
}

/// [`finish`], but the job is stopped only once `also(tail)` holds as well (e.g. a duplicate
/// was seen).
pub fn finish_when(
    bootstrap: &str,
    args: &JobArgs,
    data: &Dataset,
    job: Option<Proc>,
    timeout: Duration,
    max_restarts: usize,
    also: impl Fn(&Tail) -> bool,
) -> usize {
    let mut tail = Tail::new(bootstrap, &args.output, &args.dlq());
    let mut restarts = 0;
    let mut job = job.unwrap_or_else(|| spawn_job(bootstrap, args, "final"));
    let started = Instant::now();
    let (mut last_progress, mut progressed) = (tail.progress(), Instant::now());
    loop {
        tail.poll_for(data, Duration::from_millis(300));
        if tail.complete(data) && also(&tail) {
            break;
        }
        if tail.progress() != last_progress {
            (last_progress, progressed) = (tail.progress(), Instant::now());
        }
        if let Some(status) = job.try_status() {
            assert!(
                restarts < max_restarts,
                "the job exited ({status}) {restarts} times before the output was complete \
                 (seen {:?} of {} ids / {} dlq)\n{}",
                tail.progress(),
                data.expected.len(),
                data.bad_markers.len(),
                job.describe()
            );
            eprintln!(
                "[eos] job exited by itself ({status}); restarting it\n{}",
                job.describe()
            );
            restarts += 1;
            job = spawn_job(bootstrap, args, &format!("final-restart-{restarts}"));
            progressed = Instant::now();
        }
        assert!(
            progressed.elapsed() < STUCK_AFTER && started.elapsed() < timeout,
            "output incomplete: seen {:?} of {} ids / {} dlq markers ({} duplicates); no new \
             output for {:?}, {:?} in all (limits {STUCK_AFTER:?} without progress, {timeout:?} \
             in all)\n{}",
            tail.progress(),
            data.expected.len(),
            data.bad_markers.len(),
            tail.duplicates(),
            progressed.elapsed(),
            started.elapsed(),
            job.describe()
        );
    }
    // SIGTERM is the graceful stop of a running job: wait until it runs (a restart may still
    // be recovering when the output is already complete).
    assert!(
        job.wait_line(START_TIMEOUT, |l| l.contains("job started"))
            .is_some(),
        "the last instance never printed `job started` ({:?})\n{}",
        job.try_status(),
        job.describe()
    );
    job.stop_gracefully(STOP_TIMEOUT);
    assert!(
        job.lines().iter().any(|l| l.contains("job stopped")),
        "no `job stopped` line after SIGTERM\n{}",
        job.describe()
    );
    restarts
}

/// Bound of waits for an event a job reports once it works at all (`job started`, a first
/// checkpoint): generous, so that only a stuck job hits it, never a slow one.
pub const START_TIMEOUT: Duration = Duration::from_secs(240);

/// Bound of a whole [`finish`] run (besides [`STUCK_AFTER`]): only a job that never gets
/// anywhere hits it.
pub const FINISH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Bound of waits for a job to stop (SIGTERM's final checkpoint, fencing, a refusal).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(180);

/// Reads the committed output and DLQ and checks them against `data`.
pub fn check_output(bootstrap: &str, args: &JobArgs, data: &Dataset) -> Report {
    let output = read_topic(bootstrap, &args.output, true);
    let dlq = read_topic(bootstrap, &args.dlq(), true);
    check(data, &output, &dlq)
}

/// Prepares a scenario: broker child, topics, and the dataset of `n` records.
pub fn setup(dir: &std::path::Path, args: &JobArgs, n: u64, seed: u64) -> (Broker, Dataset) {
    bins();
    let broker = Broker::start(dir, &[]);
    create_topics(
        broker.bootstrap(),
        &[&args.input, &args.output, &args.dlq()],
    );
    (broker, Dataset::generate(n, seed))
}

/// [`finish`], then the record-by-record check of the committed output, which must be exact;
/// `what` names the faults of the scenario (printed, and in the failure message). Returns the
/// restarts [`finish`] needed.
#[allow(clippy::too_many_arguments)]
pub fn finish_exact(
    test: &str,
    what: &str,
    bootstrap: &str,
    args: &JobArgs,
    data: &Dataset,
    job: Option<Proc>,
    timeout: Duration,
    max_restarts: usize,
) -> usize {
    let restarts = finish(bootstrap, args, data, job, timeout, max_restarts);
    let report = check_output(bootstrap, args, data);
    eprintln!("[eos] {test}: {what}; {restarts} restarts to finish\n{report}");
    assert!(report.is_exact(), "output after {what}:\n{report}");
    restarts
}
