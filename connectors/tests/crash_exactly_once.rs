//! Exactly-once under crashes: a keyed running-sum job (generator -> key_by -> reduce ->
//! file sink) runs as a child process (this test binary re-executed with `crash_child_job`),
//! is SIGKILLed at random moments -- some right after a checkpoint was triggered, some right
//! after one completed (before or during the sinks' commit) -- and restarted with
//! restore = latest. The committed output is then checked record by record. The same run with
//! the at-least-once file sink must fail the check with duplicates: there each kill lands
//! after a sink subtask reported records flushed (visible) beyond the last completed
//! checkpoint, and that subtask holds the next checkpoint open until the kill, so the restart
//! replays records that are already in the output whatever the machine's speed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use onceflow_connectors::{read_committed_lines, FileSink, FileSinkMode, Generator};
use onceflow_operators::KeyBy;
use onceflow_runtime::{
    async_trait, CheckpointEvent, CheckpointId, JobConfig, RestoreMode, Result as JobResult, Sink,
    SinkFactory, StreamEnvironment, SubtaskInfo,
};
use onceflow_testkit::child::Proc;
use onceflow_testkit::jobs::{
    announce_checkpoint, announce_done, child_command, kill_repeatedly, next_event,
    spawn_with_events, EVENT_TIMEOUT,
};
use rand::Rng;
use serde::{Deserialize, Serialize};

const RECORDS: u64 = 200_000;
const KEYS: u64 = 37;
/// Records/s while the test kills the job (the final run goes at full speed).
const RATE: f64 = 10_000.0;
const SPLITS: u32 = 8;
/// Longest a final run at full speed may take on a loaded machine.
const FINAL_RUN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Event {
    id: u64,
    key: u64,
    amount: i64,
    total: i64,
}

fn amount(i: u64) -> i64 {
    (i.wrapping_mul(31) % 97) as i64 - 40
}

fn event(i: u64) -> Event {
    Event {
        id: i,
        key: i % KEYS,
        amount: amount(i),
        total: amount(i),
    }
}

/// Set by the child's checkpoint listener once a checkpoint of this run completed.
static A_CHECKPOINT_COMPLETED: AtomicBool = AtomicBool::new(false);

/// Wraps the file sink of the at-least-once child: once a checkpoint of this run completed,
/// the first pre-commit that flushes records reports `EVENT flushed-beyond N` and never
/// returns, so checkpoint N cannot complete and the flushed records (visible in an
/// at-least-once file) are past the checkpoint the restart restores. The parent kills on
/// that event: the replay must duplicate them.
struct HoldAfterFlush<F>(F);

struct HoldAfterFlushSink<S> {
    inner: S,
    written_since_barrier: usize,
}

impl<T: Send + 'static, F: SinkFactory<T>> SinkFactory<T> for HoldAfterFlush<F> {
    type Sink = HoldAfterFlushSink<F::Sink>;
    fn create(&self, info: &SubtaskInfo) -> JobResult<Self::Sink> {
        Ok(HoldAfterFlushSink {
            inner: self.0.create(info)?,
            written_since_barrier: 0,
        })
    }
}

#[async_trait]
impl<T: Send + 'static, S: Sink<T>> Sink<T> for HoldAfterFlushSink<S> {
    type Pending = S::Pending;

    async fn recover(&mut self, pending: Vec<S::Pending>) -> JobResult<()> {
        self.inner.recover(pending).await
    }

    async fn write_batch(&mut self, records: Vec<T>) -> JobResult<()> {
        self.written_since_barrier += records.len();
        self.inner.write_batch(records).await
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> JobResult<Option<S::Pending>> {
        let pending = self.inner.pre_commit(checkpoint).await?;
        let flushed = std::mem::take(&mut self.written_since_barrier);
        if flushed > 0 && A_CHECKPOINT_COMPLETED.load(Ordering::SeqCst) {
            println!("EVENT flushed-beyond {checkpoint} records={flushed}");
            std::future::pending::<()>().await;
        }
        Ok(pending)
    }

    async fn commit(&mut self, checkpoint: CheckpointId, pending: S::Pending) -> JobResult<()> {
        self.inner.commit(checkpoint, pending).await
    }

    async fn abort(&mut self, pending: S::Pending) -> JobResult<()> {
        self.inner.abort(pending).await
    }
}

/// The job, run inside the child process.
#[test]
fn crash_child_job() {
    let Ok(dir) = std::env::var("ONCEFLOW_CRASH_DIR") else {
        return; // only meaningful when spawned by the crash test
    };
    let dir = Path::new(&dir);
    let mode = match std::env::var("ONCEFLOW_CRASH_MODE").as_deref() {
        Ok("at-least-once") => FileSinkMode::AtLeastOnce,
        _ => FileSinkMode::ExactlyOnce,
    };
    let config = JobConfig::new("crash-sum")
        .parallelism(
            std::env::var("ONCEFLOW_CRASH_PARALLELISM")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(2),
        )
        .checkpoint_interval(Duration::from_millis(100))
        .checkpoint_dir(dir.join("checkpoints"))
        .retained_checkpoints(2)
        .restore(RestoreMode::Latest)
        .checkpoint_listener(|ev| {
            if let CheckpointEvent::Completed(_) = ev {
                A_CHECKPOINT_COMPLETED.store(true, Ordering::SeqCst);
            }
            announce_checkpoint(ev)
        });
    let hold_after_flush = std::env::var_os("ONCEFLOW_CRASH_HOLD_AFTER_FLUSH").is_some();
    let sigterm = std::env::var("ONCEFLOW_CRASH_MODE").as_deref() == Ok("sigterm");
    let generator = if sigterm {
        Generator::unbounded(event)
    } else {
        Generator::new(RECORDS, event)
    };
    let env = StreamEnvironment::new(config.stop_on_sigterm(sigterm));
    let generator = generator.splits(SPLITS);
    let generator = match std::env::var("ONCEFLOW_CRASH_PAUSE_AT") {
        Ok(at) => generator.pause_at(at.parse().expect("ONCEFLOW_CRASH_PAUSE_AT")),
        Err(_) => generator,
    };
    let generator = match std::env::var("ONCEFLOW_CRASH_FULL_SPEED") {
        Ok(_) => generator,
        Err(_) => generator.rate_per_second(RATE),
    };
    let sums = env
        .source("events", generator)
        .key_by(|e: &Event| e.key)
        .reduce(|acc: &Event, e: Event| Event {
            total: acc.total + e.amount,
            ..e
        });
    let sink = FileSink::new(dir.join("out")).mode(mode);
    if hold_after_flush {
        sums.sink("out", HoldAfterFlush(sink));
    } else {
        sums.sink("out", sink);
    }
    let r = env.execute_blocking().expect("job failed");
    announce_done(&r);
}

fn spawn_child(dir: &Path, mode: &str) -> Proc {
    spawn_child_with(dir, mode, false, 2)
}

/// Starts the job; `parallelism` may differ from run to run (state is rescaled on restore).
fn spawn_child_with(dir: &Path, mode: &str, full_speed: bool, parallelism: usize) -> Proc {
    let mut cmd = child_command("crash_child_job");
    cmd.env("ONCEFLOW_CRASH_PARALLELISM", parallelism.to_string());
    if full_speed {
        cmd.env("ONCEFLOW_CRASH_FULL_SPEED", "1");
    } else {
        // a run that is going to be killed must not end first, however fast the machine
        cmd.env("ONCEFLOW_CRASH_PAUSE_AT", (RECORDS * 3 / 4).to_string());
    }
    cmd.env("ONCEFLOW_CRASH_DIR", dir)
        .env("ONCEFLOW_CRASH_MODE", mode);
    spawn_with_events(cmd)
}

fn wait_event(job: &mut Proc, prefix: &str, timeout: Duration) -> bool {
    next_event(job, prefix, timeout).is_some()
}

/// Runs the job with `kills` SIGKILLs, then to completion; returns the kill count.
fn run_with_kills(dir: &Path, mode: &str, kills: usize) -> usize {
    let started = Instant::now();
    kill_repeatedly(kills, 30..600, |rng| {
        // the exactly-once run also changes the parallelism on restarts
        let parallelism = if mode == "exactly-once" {
            rng.random_range(1..=3)
        } else {
            2
        };
        spawn_child_with(dir, mode, false, parallelism)
    })
    .unwrap_or_else(|e| {
        panic!(
            "the job finished before {kills} kills (only {}); make it longer",
            e.kills_done
        )
    });
    eprintln!(
        "{kills} kills in {:?}; running to completion",
        started.elapsed()
    );
    let mut child = spawn_child_with(dir, mode, true, 2);
    let deadline = Instant::now() + FINAL_RUN_TIMEOUT;
    let done_line =
        next_event(&mut child, "done", FINAL_RUN_TIMEOUT).expect("final run did not finish");
    assert!(
        done_line.contains("restored_from=Some("),
        "the final run must restore from a checkpoint: {done_line}"
    );
    loop {
        if let Some(status) = child.try_status() {
            assert!(status.success(), "final run failed: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "final run did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    kills
}

/// Committed lines ordered by (checkpoint, subtask): within one checkpoint a key belongs to one
/// subtask, so this is each key's processing order even when the parallelism changed.
fn committed_lines_in_checkpoint_order(out: &Path) -> Result<Vec<String>, String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let Some(rest) = name.strip_prefix("part-") else {
            continue;
        };
        let rest = rest.trim_end_matches(".jsonl");
        // exactly-once: part-<subtask>-<checkpoint>; at-least-once: part-<subtask>-r<run>-<seq>
        let parts: Vec<&str> = rest.split('-').collect();
        let key = match parts.as_slice() {
            [sub, chk] => (
                chk.parse::<u128>().unwrap_or(0),
                0,
                sub.parse::<u64>().unwrap_or(0),
            ),
            [sub, run, seq] => (
                run.trim_start_matches('r').parse::<u128>().unwrap_or(0),
                seq.parse::<u64>().unwrap_or(0),
                sub.parse::<u64>().unwrap_or(0),
            ),
            _ => return Err(format!("unexpected output file {name}")),
        };
        files.push((key, path));
    }
    files.sort();
    let mut lines = Vec::new();
    for (_, f) in files {
        let text = std::fs::read_to_string(&f).map_err(|e| e.to_string())?;
        lines.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
    }
    Ok(lines)
}

/// Checks the committed output record by record: no id twice, running totals consistent per
/// key; with `complete`, every id of the input present and every final sum exact, otherwise
/// (a stopped unbounded run) every split's ids a gap-free prefix.
fn check_output(dir: &Path, complete: bool) -> Result<(), String> {
    let lines = committed_lines_in_checkpoint_order(&dir.join("out"))?;
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut per_key: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    // a torn line (a record cut by the kill) can only come from an at-least-once sink
    let mut torn = Vec::new();
    for l in &lines {
        match serde_json::from_str::<Event>(l) {
            Ok(e) => {
                *seen.entry(e.id).or_insert(0) += 1;
                per_key.entry(e.key).or_default().push(e);
            }
            Err(e) => torn.push(format!("{l}: {e}")),
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    if !dups.is_empty() {
        return Err(format!(
            "{} ids duplicated (e.g. {:?}) among {} lines; {} torn lines",
            dups.len(),
            dups.iter().take(3).collect::<Vec<_>>(),
            lines.len(),
            torn.len()
        ));
    }
    if let Some(t) = torn.first() {
        return Err(format!("{} torn lines, e.g. {t}", torn.len()));
    }
    if complete {
        let missing = (0..RECORDS).filter(|i| !seen.contains_key(i)).count();
        if missing > 0 {
            return Err(format!("{missing} ids missing"));
        }
    } else {
        for split in 0..u64::from(SPLITS) {
            let n = seen
                .keys()
                .filter(|id| *id % u64::from(SPLITS) == split)
                .count() as u64;
            if let Some(gap) = (0..n)
                .map(|k| k * u64::from(SPLITS) + split)
                .find(|id| !seen.contains_key(id))
            {
                return Err(format!(
                    "split {split}: id {gap} missing below its highest id"
                ));
            }
        }
    }
    for (key, events) in &per_key {
        let mut total = 0i64;
        for e in events {
            total += e.amount;
            if e.total != total {
                return Err(format!(
                    "key {key}: record {} has running total {}, expected {total}",
                    e.id, e.total
                ));
            }
        }
        let want: i64 = (0..RECORDS).filter(|i| i % KEYS == *key).map(amount).sum();
        if complete && total != want {
            return Err(format!("key {key}: final sum {total}, expected {want}"));
        }
    }
    Ok(())
}

#[test]
fn crash_exactly_once_file_sink_survives_20_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kills = run_with_kills(dir.path(), "exactly-once", 21);
    assert!(kills >= 20);
    if let Err(e) = check_output(dir.path(), true) {
        panic!("exactly-once violated after {kills} kills: {e}");
    }
}

#[test]
fn crash_at_least_once_sink_shows_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kills = 3;
    for k in 0..kills {
        let mut cmd = child_command("crash_child_job");
        cmd.env("ONCEFLOW_CRASH_DIR", dir.path())
            .env("ONCEFLOW_CRASH_MODE", "at-least-once")
            .env("ONCEFLOW_CRASH_HOLD_AFTER_FLUSH", "1");
        let mut child = spawn_with_events(cmd);
        let flushed = next_event(&mut child, "flushed-beyond", EVENT_TIMEOUT);
        child.kill9();
        let flushed = flushed.unwrap_or_else(|| {
            panic!("run {k}: the job never flushed records beyond a completed checkpoint")
        });
        eprintln!("kill {k} after `{flushed}`");
    }
    let mut child = spawn_child_with(dir.path(), "at-least-once", true, 2);
    let done = next_event(&mut child, "done", FINAL_RUN_TIMEOUT).expect("final run did not finish");
    assert!(
        child
            .wait_exit(EVENT_TIMEOUT)
            .expect("the job exits")
            .success(),
        "final run failed"
    );
    assert!(done.contains("restored_from=Some("), "{done}");
    let err = check_output(dir.path(), true).expect_err(
        "an at-least-once sink must duplicate the records it flushed past the restored checkpoint",
    );
    assert!(err.contains("duplicated"), "{err}");
}

#[test]
fn sigterm_stops_with_a_final_checkpoint_and_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = spawn_child(dir.path(), "sigterm");
    for _ in 0..3 {
        assert!(
            wait_event(&mut child, "completed", EVENT_TIMEOUT),
            "no checkpoint"
        );
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let done = next_event(&mut child, "done", EVENT_TIMEOUT).expect("job did not stop");
    let exit = child.wait_exit(EVENT_TIMEOUT).expect("the job exits");
    assert!(exit.success(), "{exit}");
    assert!(done.contains("failed=0"), "{done}");
    let lines = read_committed_lines(&dir.path().join("out")).expect("output");
    assert!(!lines.is_empty());
    if let Err(e) = check_output(dir.path(), false) {
        panic!("output after SIGTERM is not a consistent prefix: {e}");
    }
    // nothing left uncommitted: no in-progress files
    let leftovers = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(leftovers, 0, "a final checkpoint commits everything");
}
