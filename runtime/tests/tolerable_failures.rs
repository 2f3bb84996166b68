//! Checkpoint failures in a row: up to `tolerable_failed_checkpoints` the job goes on (and a
//! completed checkpoint resets the count), one more fails the job with an error that names
//! the count and the limit; without a limit the job goes on through any number.
//!
//! The verdict depends on events only: the sink fails the pre-commit of the checkpoints it
//! is told to, and the source writes one record per barrier and ends after a fixed number of
//! barriers, so the checkpoints that fail are the same on every run.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceflow_runtime::{
    async_trait, CheckpointId, Error, JobConfig, Result, Sink, Source, SourcePoll,
    StreamEnvironment, SubtaskInfo,
};

/// Writes record `c` after barrier `c` (record 0 at once); ends after record `last`.
struct PerBarrier {
    next: u64,
    barriers_seen: u64,
    last: u64,
}

#[async_trait]
impl Source<u64> for PerBarrier {
    type Position = u64;
    fn restore(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn poll(&mut self, out: &mut Vec<u64>, _max: usize) -> Result<SourcePoll> {
        if self.next > self.last {
            return Ok(SourcePoll::Exhausted);
        }
        if self.next > self.barriers_seen {
            return Ok(SourcePoll::Idle(Duration::from_millis(1)));
        }
        out.push(self.next);
        self.next += 1;
        Ok(SourcePoll::Ready)
    }
    fn snapshot_position(&mut self, c: CheckpointId) -> Result<u64> {
        self.barriers_seen = self.barriers_seen.max(c);
        Ok(self.next)
    }
}

/// Fails the pre-commit of the checkpoints in `fail` (not the job: a plain connector error);
/// records which checkpoints it committed.
struct FailingSink {
    fail: BTreeSet<CheckpointId>,
    open: Vec<u64>,
    committed: Arc<Mutex<Vec<u64>>>,
}

#[async_trait]
impl Sink<u64> for FailingSink {
    type Pending = Vec<u64>;
    async fn recover(&mut self, _p: Vec<Vec<u64>>) -> Result<()> {
        Ok(())
    }
    async fn write_batch(&mut self, records: Vec<u64>) -> Result<()> {
        self.open.extend(records);
        Ok(())
    }
    async fn pre_commit(&mut self, c: CheckpointId) -> Result<Option<Vec<u64>>> {
        if self.fail.contains(&c) {
            // the records stay open for the next pre-commit
            return Err(Error::Connector(format!(
                "injected failure of checkpoint {c}"
            )));
        }
        Ok(Some(std::mem::take(&mut self.open)))
    }
    async fn commit(&mut self, _c: CheckpointId, p: Vec<u64>) -> Result<()> {
        self.committed.lock().unwrap().extend(p);
        Ok(())
    }
    async fn abort(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
}

const LAST: u64 = 8;

fn run(tolerable: Option<u32>, fail: &[CheckpointId]) -> (Result<u64>, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let committed = Arc::new(Mutex::new(Vec::new()));
    let sink_log = committed.clone();
    let fail: BTreeSet<CheckpointId> = fail.iter().copied().collect();
    let env = StreamEnvironment::new(
        JobConfig::new("tolerable")
            .checkpoint_interval(Duration::from_millis(5))
            .checkpoint_dir(dir.path())
            .tolerable_failed_checkpoints(tolerable),
    );
    env.source("per-barrier", |_: &SubtaskInfo| {
        Ok(PerBarrier {
            next: 0,
            barriers_seen: 0,
            last: LAST,
        })
    })
    .sink("failing", move |_: &SubtaskInfo| {
        Ok(FailingSink {
            fail: fail.clone(),
            open: Vec::new(),
            committed: sink_log.clone(),
        })
    });
    let r = env.execute_blocking().map(|r| r.completed_checkpoints);
    let mut seen = committed.lock().unwrap().clone();
    seen.sort_unstable();
    (r, seen)
}

#[test]
fn failures_in_a_row_up_to_the_limit_are_tolerated() {
    // 2 and 3 fail in a row, 5 alone: each run of failures is within the limit of 2
    let (r, seen) = run(Some(2), &[2, 3, 5]);
    r.expect("the job goes on");
    assert_eq!(seen, (0..=LAST).collect::<Vec<_>>(), "every record once");
}

#[test]
fn one_failure_past_the_limit_fails_the_job_naming_count_and_limit() {
    let (r, _) = run(Some(1), &[2, 4, 5]);
    match r {
        Err(Error::CheckpointFailed { checkpoint, reason }) => {
            assert_eq!(checkpoint, 5, "{reason}");
            assert!(
                reason.contains("2 checkpoints failed in a row, 1 are tolerated")
                    && reason.contains("injected failure of checkpoint 5"),
                "{reason}"
            );
        }
        other => panic!("expected the job to fail at checkpoint 5, got {other:?}"),
    }
    let (r, _) = run(Some(0), &[3]);
    assert!(
        matches!(r, Err(Error::CheckpointFailed { checkpoint: 3, .. })),
        "with no tolerance the first failure fails the job: {r:?}"
    );
}

#[test]
fn without_a_limit_any_number_of_failures_is_tolerated() {
    let (r, seen) = run(None, &[1, 2, 3, 4, 5, 6]);
    r.expect("the job goes on");
    assert_eq!(seen, (0..=LAST).collect::<Vec<_>>(), "every record once");
}
