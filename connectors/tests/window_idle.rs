//! Idle partitions: a source reads two partitions; partition 1 sends one early record and then
//! goes quiet while partition 0 keeps going. With idleness declared (200 ms) window results
//! appear while the job is still running; without it, the quiet partition holds the
//! watermark back and nothing fires until the end of input. Both when one source subtask
//! reads both partitions (per-split minimum) and when each of two subtasks reads one (the
//! quiet subtask declares itself idle to the downstream input gates).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_connectors::DiscardSink;
use onceflow_operators::window::{WindowAssigner, WindowResult};
use onceflow_operators::{KeyBy, Map};
use onceflow_runtime::{
    async_trait, CheckpointId, JobConfig, Result, Source, SourcePoll, SourceWatermarks,
    StreamEnvironment, SubtaskInfo, WatermarkStrategy,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Ev {
    partition: u32,
    ts: i64,
}

/// Partition 0: a record every ms, 10 ms of event time apart; partition 1: one record at
/// ts 0, then silence. Ends when `stop` is set or after `run_for`.
struct TwoPartitions {
    /// Which partitions this subtask reads.
    partitions: Vec<u32>,
    next: i64,
    started: Instant,
    run_for: Duration,
    stop: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
}

#[async_trait]
impl Source<Ev> for TwoPartitions {
    type Position = i64;

    fn restore(&mut self, _positions: Vec<i64>) -> Result<()> {
        Ok(())
    }

    async fn poll(&mut self, out: &mut Vec<Ev>, _max: usize) -> Result<SourcePoll> {
        if self.stop.load(Ordering::SeqCst) || self.started.elapsed() > self.run_for {
            self.ended.store(true, Ordering::SeqCst);
            return Ok(SourcePoll::Exhausted);
        }
        if self.next == 0 && self.partitions.contains(&1) {
            out.push(Ev {
                partition: 1,
                ts: 0,
            });
        }
        if self.partitions.contains(&0) {
            out.push(Ev {
                partition: 0,
                ts: self.next * 10,
            });
        }
        self.next += 1;
        Ok(SourcePoll::Idle(Duration::from_millis(1)))
    }

    fn snapshot_position(&mut self, _checkpoint: CheckpointId) -> Result<i64> {
        Ok(self.next)
    }
}

/// Runs the job; returns (a result for a window at or after 1 s arrived while the source was
/// still running, total results).
fn run(idleness: Option<Duration>, run_for: Duration, parallelism: usize) -> (bool, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(AtomicBool::new(false));
    let results = Arc::new(AtomicU64::new(0));
    let env = StreamEnvironment::new(JobConfig::new("idle").parallelism(parallelism));
    let mut strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |e: &Ev| e.ts)
        .with_splits(|e: &Ev| e.partition);
    if let Some(t) = idleness {
        strategy = strategy.with_idleness(t);
    }
    let (s, e) = (stop.clone(), ended.clone());
    let source = move |info: &SubtaskInfo| {
        Ok(TwoPartitions {
            partitions: (0..2u32)
                .filter(|p| *p as usize % info.parallelism == info.index)
                .collect(),
            next: 0,
            started: Instant::now(),
            run_for,
            stop: s.clone(),
            ended: e.clone(),
        })
    };
    let (s, e, n) = (stop.clone(), ended.clone(), results.clone());
    env.source("two-partitions", source.with_watermarks(strategy))
        .key_by(|e: &Ev| e.partition)
        .window(WindowAssigner::tumbling(Duration::from_millis(100)), |e| {
            e.ts
        })
        .reduce("latest", |_, b| b.clone())
        .results()
        .map(move |r: WindowResult<u32, Ev>| {
            n.fetch_add(1, Ordering::SeqCst);
            if r.window.start >= 1000 && !e.load(Ordering::SeqCst) {
                s.store(true, Ordering::SeqCst);
            }
            r.window.start
        })
        .sink("discard", DiscardSink::new());
    env.execute_blocking().expect("job");
    (stop.load(Ordering::SeqCst), results.load(Ordering::SeqCst))
}

#[test]
fn an_idle_partition_does_not_hold_back_window_results() {
    let (fired_while_running, n) =
        run(Some(Duration::from_millis(200)), Duration::from_secs(20), 1);
    assert!(
        fired_while_running,
        "with idleness, windows fire while partition 1 is quiet"
    );
    assert!(n > 0);
}

#[test]
fn an_idle_source_subtask_does_not_hold_back_window_results() {
    let (fired_while_running, n) =
        run(Some(Duration::from_millis(200)), Duration::from_secs(20), 2);
    assert!(
        fired_while_running,
        "with idleness, windows fire while the subtask reading partition 1 is quiet"
    );
    assert!(n > 0);
}

#[test]
fn without_idleness_a_quiet_partition_holds_back_every_window() {
    for parallelism in [1, 2] {
        let (fired_while_running, n) = run(None, Duration::from_millis(1500), parallelism);
        assert!(
            !fired_while_running,
            "without idleness nothing may fire while partition 1 is quiet"
        );
        assert!(n > 0, "the end of input releases the windows");
    }
}
