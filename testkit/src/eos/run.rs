//! Runs of the example job `exactly_once_etl` in a scenario: its flags, the broker of the
//! scenario, tailing the output until it is complete across restarts, a graceful stop, and
//! the final record-by-record check.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;

use crate::bins::bins;
use crate::child::Proc;
use crate::clients::{assign, consumer_with, create_topics, read_topic};
use crate::eos::{check, parse_output, Dataset, Report, PARTITIONS};
use crate::test_broker::TestBroker;

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
        let consumer = consumer_with(bootstrap, true, false);
        let parts: Vec<(&str, i32)> = [output, dlq]
            .into_iter()
            .flat_map(|t| (0..PARTITIONS).map(move |p| (t, p)))
            .collect();
        assign(&consumer, &parts);
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

/// Starts the broker of a scenario ([`TestBroker::start`]: the bundled broker or Apache Kafka,
/// per `ONCEFLOW_TEST_BROKER`): a durable data dir in `dir`, 4 partitions per auto-created
/// topic, `extra` flags of the bundled broker; the bundled broker's `RUST_LOG` comes from
/// `ONCEFLOW_EOS_BROKER_LOG` (default `warn`), its stderr goes to `dir/broker.stderr.log`.
/// Restart it with [`TestBroker::restart_same_port`] so that clients keep their bootstrap
/// address.
pub fn scenario_broker(dir: &Path, extra: &[&str]) -> TestBroker {
    TestBroker::start(dir, extra)
}

/// Kills the broker of a scenario with kill -9; panics if it had exited by itself.
pub fn kill9_broker(broker: &mut TestBroker) {
    let was_running = broker.kill9().expect("kill -9 the broker");
    assert!(
        was_running,
        "broker had exited by itself\n{}",
        broker.describe()
    );
}

/// Prepares a scenario: broker child, topics, and the dataset of `n` records.
pub fn setup(dir: &Path, args: &JobArgs, n: u64, seed: u64) -> (TestBroker, Dataset) {
    bins();
    let broker = scenario_broker(dir, &[]);
    create_topics(
        broker.bootstrap(),
        &[&args.input, &args.output, &args.dlq()],
        PARTITIONS,
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

/// Flags of one run of the example job.
#[derive(Debug, Clone)]
pub struct JobArgs {
    /// `--mode`.
    pub mode: String,
    /// `--input`.
    pub input: String,
    /// `--output`.
    pub output: String,
    /// `--group`.
    pub group: String,
    /// `--checkpoint-dir`.
    pub checkpoint_dir: PathBuf,
    /// `--checkpoint-interval-ms`.
    pub checkpoint_interval_ms: u64,
    /// `--parallelism`.
    pub parallelism: u32,
    /// `--transactional-id-prefix`.
    pub prefix: String,
    /// `--transaction-timeout-ms` (None: the job's default).
    pub transaction_timeout_ms: Option<u64>,
    /// Extra environment (e.g. ONCEFLOW_FAILPOINT).
    pub env: Vec<(String, String)>,
    /// Extra command-line arguments (e.g. `--metrics-listen ADDR`).
    pub extra_args: Vec<String>,
    /// Directory for the job's stderr logs.
    pub log_dir: PathBuf,
    /// `--brokers` of the job when it differs from the harness's bootstrap (e.g. a secured
    /// listener while the harness reads and writes over PLAINTEXT).
    pub brokers: Option<String>,
}

impl JobArgs {
    /// Defaults for a test scenario rooted at `dir`.
    pub fn new(mode: &str, dir: &Path) -> JobArgs {
        JobArgs {
            mode: mode.to_string(),
            input: "eos-input".into(),
            output: "eos-output".into(),
            group: format!("eos-group-{mode}"),
            checkpoint_dir: dir.join("checkpoints"),
            checkpoint_interval_ms: 500,
            parallelism: 2,
            prefix: format!("eos-{mode}"),
            transaction_timeout_ms: None,
            env: Vec::new(),
            extra_args: Vec::new(),
            log_dir: dir.to_path_buf(),
            brokers: None,
        }
    }

    /// The DLQ topic.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.output)
    }
}

/// Spawns the example job against `bootstrap`; `run` names its stderr log.
pub fn spawn_job(bootstrap: &str, args: &JobArgs, run: &str) -> Proc {
    let mut cmd = Command::new(&bins().job);
    cmd.args(["--brokers", args.brokers.as_deref().unwrap_or(bootstrap)])
        .args(["--input", &args.input])
        .args(["--output", &args.output])
        .args(["--group", &args.group])
        .args(["--mode", &args.mode])
        .arg("--checkpoint-dir")
        .arg(&args.checkpoint_dir)
        .args([
            "--checkpoint-interval-ms",
            &args.checkpoint_interval_ms.to_string(),
        ])
        .args(["--parallelism", &args.parallelism.to_string()])
        .args(["--transactional-id-prefix", &args.prefix])
        .env(
            "RUST_LOG",
            std::env::var("ONCEFLOW_EOS_JOB_LOG").unwrap_or_else(|_| "info".into()),
        );
    if let Some(t) = args.transaction_timeout_ms {
        cmd.args(["--transaction-timeout-ms", &t.to_string()]);
    }
    cmd.args(&args.extra_args);
    for (k, v) in &args.env {
        cmd.env(k, v);
    }
    let log = args.log_dir.join(format!("job-{run}.stderr.log"));
    Proc::spawn(&format!("job {run}"), cmd, &log)
}

/// The largest N of stdout lines containing `checkpoint N committed`.
pub fn last_committed(lines: &[String]) -> Option<u64> {
    lines
        .iter()
        .filter_map(|l| checkpoint_number(l, "committed"))
        .max()
}

/// N if `line` contains `checkpoint N <word>`.
pub fn checkpoint_number(line: &str, word: &str) -> Option<u64> {
    let at = line.find("checkpoint ")?;
    let rest = &line[at + "checkpoint ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let after = rest[digits.len()..].trim_start();
    if digits.is_empty() || !after.starts_with(word) {
        return None;
    }
    digits.parse().ok()
}
