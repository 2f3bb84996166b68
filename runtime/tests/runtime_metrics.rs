//! The runtime's metrics reach an installed `metrics` recorder: records in/out and busy time
//! per operator, checkpoint duration, alignment time, state size and failed checkpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use onceflow_runtime::state::OperatorSnapshot;
use onceflow_runtime::{
    async_trait, metrics as m, CheckpointId, Error, JobConfig, Operator, Partitioning, Result,
    Sink, Source, SourcePoll, StreamEnvironment, SubtaskInfo,
};

#[derive(Default)]
struct Cell {
    sum: AtomicU64,
    events: AtomicU64,
}

impl CounterFn for Cell {
    fn increment(&self, v: u64) {
        self.sum.fetch_add(v, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.sum.fetch_max(v, Ordering::Relaxed);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, v: f64) {
        self.sum.fetch_add((v * 1e6) as u64, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
    }
    fn decrement(&self, _v: f64) {}
    fn set(&self, v: f64) {
        self.sum.store(v as u64, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _v: f64) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default, Clone)]
struct TestRecorder(Arc<Mutex<HashMap<String, Vec<Arc<Cell>>>>>);

impl TestRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let c = Arc::new(Cell::default());
        self.0
            .lock()
            .unwrap()
            .entry(key.name().to_string())
            .or_default()
            .push(c.clone());
        c
    }
    fn sum(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |v| v.iter().map(|c| c.sum.load(Ordering::Relaxed)).sum())
    }
    fn events(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).map_or(0, |v| {
            v.iter().map(|c| c.events.load(Ordering::Relaxed)).sum()
        })
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _k: KeyName, _u: Option<Unit>, _d: SharedString) {}
    fn describe_gauge(&self, _k: KeyName, _u: Option<Unit>, _d: SharedString) {}
    fn describe_histogram(&self, _k: KeyName, _u: Option<Unit>, _d: SharedString) {}
    fn register_counter(&self, key: &Key, _m: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _m: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _m: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// 20 000 numbers; after the last one the source idles until it has taken checkpoint 4's
/// barrier (one checkpoint runs at a time, so 1-3 have finished), so the job cannot end
/// before the checkpoints the test counts, however loaded the machine.
struct Numbers(u64, CheckpointId);

#[async_trait]
impl Source<u64> for Numbers {
    type Position = u64;
    fn restore(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn poll(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll> {
        for _ in 0..max.min(50) {
            if self.0 >= 20_000 {
                if self.1 < 4 {
                    return Ok(SourcePoll::Idle(Duration::from_millis(1)));
                }
                return Ok(SourcePoll::Exhausted);
            }
            out.push(self.0);
            self.0 += 1;
        }
        Ok(SourcePoll::Idle(Duration::from_micros(500)))
    }
    fn snapshot_position(&mut self, c: CheckpointId) -> Result<u64> {
        self.1 = c;
        Ok(self.0)
    }
}

struct Stateful(u64);

impl Operator<u64, u64> for Stateful {
    fn process(&mut self, r: u64, out: &mut Vec<u64>) -> Result<()> {
        self.0 += 1;
        out.push(r);
        Ok(())
    }
    fn snapshot(&mut self, _c: CheckpointId) -> Result<OperatorSnapshot> {
        Ok(OperatorSnapshot::default())
    }
    fn state_entries(&self) -> usize {
        self.0 as usize
    }
}

/// Fails the pre-commit of checkpoint 2.
struct Flaky;

#[async_trait]
impl Sink<u64> for Flaky {
    type Pending = ();
    async fn recover(&mut self, _p: Vec<()>) -> Result<()> {
        Ok(())
    }
    async fn write_batch(&mut self, _r: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn pre_commit(&mut self, c: CheckpointId) -> Result<Option<()>> {
        if c == 2 {
            return Err(Error::Connector("injected".into()));
        }
        Ok(None)
    }
    async fn commit(&mut self, _c: CheckpointId, _p: ()) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self, _p: ()) -> Result<()> {
        Ok(())
    }
}

#[test]
fn runtime_metrics_are_recorded() {
    let rec = TestRecorder::default();
    metrics::set_global_recorder(rec.clone()).expect("first recorder in this test binary");
    let dir = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new(
        JobConfig::new("metrics")
            .checkpoint_interval(Duration::from_millis(10))
            .checkpoint_dir(dir.path()),
    );
    env.source("numbers", |_: &SubtaskInfo| Ok(Numbers(0, 0)))
        .add_operator("stateful", Partitioning::Forward, |_| Ok(Stateful(0)))
        .sink("flaky", |_: &SubtaskInfo| Ok(Flaky));
    let r = env.execute_blocking().expect("job");
    assert!(
        r.failed_checkpoints >= 1 && r.completed_checkpoints >= 2,
        "{r:?}"
    );
    assert_eq!(rec.sum(m::RECORDS_IN), 40_000, "operator + sink");
    assert_eq!(rec.sum(m::RECORDS_OUT), 40_000, "source + operator");
    assert!(rec.events(m::BUSY_SECONDS) > 0);
    assert!(rec.events(m::CHECKPOINT_SECONDS) >= 2);
    assert!(rec.events(m::ALIGNMENT_SECONDS) >= 2);
    assert_eq!(rec.sum(m::CHECKPOINTS_FAILED), r.failed_checkpoints);
    assert_eq!(rec.sum(m::CHECKPOINTS_COMPLETED), r.completed_checkpoints);
    assert!(rec.sum(m::STATE_ENTRIES) > 0);
    assert!(rec.sum(m::CHECKPOINT_BYTES) > 0);
}
