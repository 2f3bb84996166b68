//! Windows stay exact through crashes: an event-time job (generator with per-split
//! watermarks -> 1 s tumbling count/sum per key and 2 s-gap sessions per user -> exactly-once
//! file sink) runs as a child process (this test binary re-executed with
//! `window_crash_child_job`), is SIGKILLed at random moments (at least 10 times: at random
//! times, while a checkpoint is in flight, right after one completed) in the middle of open
//! windows, and restarted with restore = latest. Its committed output must be identical to
//! that of an uninterrupted run of the same job. A run that is going to be killed holds back
//! the last sixth of the input (`Generator::pause_at`), so it cannot finish before its kill on
//! a fast machine; the final run reads the rest.

use std::path::Path;
use std::time::Duration;

use onceflow_connectors::{read_committed_lines, FileSink, Generator};
use onceflow_operators::window::{AggregateFunction, WindowAssigner, WindowResult};
use onceflow_operators::{KeyBy, Map};
use onceflow_runtime::{
    JobConfig, RestoreMode, SourceWatermarks, StreamEnvironment, WatermarkStrategy,
};
use onceflow_testkit::child::Proc;
use onceflow_testkit::jobs::{
    announce_checkpoint, announce_done, child_command, kill_repeatedly, next_event,
    spawn_with_events, EVENT_TIMEOUT,
};
use serde::{Deserialize, Serialize};

const RECORDS: u64 = 60_000;
const KEYS: u64 = 13;
const RATE: f64 = 10_000.0;
const SPLITS: u32 = 8;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Event {
    id: u64,
    key: u64,
    user: u64,
    ts: i64,
    amount: i64,
}

/// Event `i`: 10 ms apart in event time, up to 490 ms out of order; users are active in
/// bursts (300 events, i.e. 3 s) so their sessions close.
fn event(i: u64) -> Event {
    let jitter = (i.wrapping_mul(7919) % 50) as i64 * 10;
    Event {
        id: i,
        key: i % KEYS,
        user: (i / 300) % 5,
        ts: i as i64 * 10 - jitter,
        amount: (i.wrapping_mul(31) % 97) as i64 - 40,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Out {
    kind: String,
    key: u64,
    start: i64,
    end: i64,
    count: u64,
    sum: i64,
}

struct CountSum;

impl AggregateFunction<Event> for CountSum {
    type Acc = (u64, i64);
    type Out = (u64, i64);
    fn create(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), e: Event) {
        acc.0 += 1;
        acc.1 += e.amount;
    }
    fn merge(&self, a: (u64, i64), b: (u64, i64)) -> (u64, i64) {
        (a.0 + b.0, a.1 + b.1)
    }
    fn result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
}

fn out(kind: &str) -> impl Fn(WindowResult<u64, (u64, i64)>) -> Out + Send + Sync + 'static {
    let kind = kind.to_string();
    move |r| Out {
        kind: kind.clone(),
        key: r.key,
        start: r.window.start,
        end: r.window.end,
        count: r.value.0,
        sum: r.value.1,
    }
}

/// The job, run inside the child process.
#[test]
fn window_crash_child_job() {
    let Ok(dir) = std::env::var("ONCEFLOW_WINDOW_CRASH_DIR") else {
        return; // only meaningful when spawned by the crash test
    };
    let dir = Path::new(&dir);
    let config = JobConfig::new("window-crash")
        .parallelism(2)
        .checkpoint_interval(Duration::from_millis(100))
        .checkpoint_dir(dir.join("checkpoints"))
        .retained_checkpoints(2)
        .restore(RestoreMode::Latest)
        .checkpoint_listener(announce_checkpoint);
    let env = StreamEnvironment::new(config);
    let strategy =
        WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(1000), |e: &Event| e.ts)
            .with_splits(|e: &Event| (e.id % u64::from(SPLITS)) as u32);
    let mut generator = Generator::new(RECORDS, event)
        .splits(SPLITS)
        .rate_per_second(RATE);
    if let Ok(at) = std::env::var("ONCEFLOW_WINDOW_CRASH_PAUSE_AT") {
        generator = generator.pause_at(at.parse().expect("ONCEFLOW_WINDOW_CRASH_PAUSE_AT"));
    }
    let events = env.source("events", generator.with_watermarks(strategy));
    let per_key = events
        .key_by(|e: &Event| e.key)
        .window(WindowAssigner::tumbling(Duration::from_secs(1)), |e| e.ts)
        .aggregate("per-key-1s", CountSum)
        .results()
        .map(out("tumbling"));
    let sessions = events
        .key_by(|e: &Event| e.user)
        .window(WindowAssigner::session(Duration::from_secs(2)), |e| e.ts)
        .aggregate("sessions", CountSum)
        .results()
        .map(out("session"));
    per_key
        .union(&sessions)
        .sink("out", FileSink::new(dir.join("out")));
    let r = env.execute_blocking().expect("job failed");
    announce_done(&r);
}

/// Starts the job; a run that is going to be killed (`to_be_killed`) holds back the last
/// sixth of the input, so it cannot end before its kill however fast the machine is.
fn spawn_child(dir: &Path, to_be_killed: bool) -> Proc {
    let mut cmd = child_command("window_crash_child_job");
    cmd.env("ONCEFLOW_WINDOW_CRASH_DIR", dir);
    if to_be_killed {
        cmd.env(
            "ONCEFLOW_WINDOW_CRASH_PAUSE_AT",
            (RECORDS * 5 / 6).to_string(),
        );
    }
    spawn_with_events(cmd)
}

/// Runs the job to completion in `dir` and returns the final run's `done` line.
fn run_to_completion(dir: &Path) -> String {
    let mut child = spawn_child(dir, false);
    let done =
        next_event(&mut child, "done", Duration::from_secs(300)).expect("run did not finish");
    let status = child.wait_exit(EVENT_TIMEOUT).expect("the job exits");
    assert!(status.success(), "run failed: {status}");
    done
}

fn sorted_output(dir: &Path) -> Vec<Out> {
    let mut v: Vec<Out> = read_committed_lines(&dir.join("out"))
        .expect("committed output")
        .iter()
        .map(|l| serde_json::from_str(l).expect("output line"))
        .collect();
    v.sort();
    v
}

#[test]
fn window_job_killed_mid_window_matches_an_uninterrupted_run() {
    let golden_dir = tempfile::tempdir().expect("tempdir");
    run_to_completion(golden_dir.path());
    let golden = sorted_output(golden_dir.path());
    // sanity of the golden run itself: every event counted once per window type
    let total = |kind: &str| -> u64 {
        golden
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| o.count)
            .sum()
    };
    assert_eq!(total("tumbling"), RECORDS);
    assert_eq!(total("session"), RECORDS);
    assert!(golden.iter().any(|o| o.kind == "session" && o.count > 250));

    let dir = tempfile::tempdir().expect("tempdir");
    let kills = 12;
    kill_repeatedly(kills, 50..700, |_| spawn_child(dir.path(), true)).unwrap_or_else(|e| {
        panic!(
            "the job finished before {kills} kills (only {})",
            e.kills_done
        )
    });
    let done = run_to_completion(dir.path());
    assert!(
        done.contains("restored_from=Some("),
        "the final run must restore from a checkpoint: {done}"
    );
    let got = sorted_output(dir.path());
    assert_eq!(got.len(), golden.len(), "number of window results");
    assert!(
        got == golden,
        "output after {kills} kills differs from the golden run"
    );
}
