//! Operator and source hooks the event-time work builds on: a source's watermarks reach
//! operators (minimum over inputs, monotonic), and a processing-time deadline wakes an
//! operator that has no input.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_runtime::{
    async_trait, CheckpointId, JobConfig, Operator, Partitioning, Result, Sink, Source, SourcePoll,
    StreamEnvironment, SubtaskInfo, Watermark,
};

struct Counting {
    next: u64,
    end: u64,
}

#[async_trait]
impl Source<u64> for Counting {
    type Position = u64;
    fn restore(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn poll(&mut self, out: &mut Vec<u64>, _max: usize) -> Result<SourcePoll> {
        if self.next >= self.end {
            return Ok(SourcePoll::Exhausted);
        }
        out.push(self.next);
        self.next += 1;
        Ok(SourcePoll::Idle(Duration::from_micros(200)))
    }
    fn snapshot_position(&mut self, _c: CheckpointId) -> Result<u64> {
        Ok(self.next)
    }
    fn current_watermark(&mut self) -> Option<Watermark> {
        self.next.checked_sub(1).map(|n| Watermark(n as i64))
    }
}

/// Holds records until a processing-time deadline 5 ms after the first held one.
struct Delay {
    held: Vec<u64>,
    deadline: Option<Instant>,
    watermarks: Arc<Mutex<Vec<Watermark>>>,
    wakeups: Arc<Mutex<u32>>,
}

impl Operator<u64, u64> for Delay {
    fn process(&mut self, record: u64, _out: &mut Vec<u64>) -> Result<()> {
        self.held.push(record);
        self.deadline
            .get_or_insert_with(|| Instant::now() + Duration::from_millis(5));
        Ok(())
    }
    fn handle_watermark(
        &mut self,
        wm: Watermark,
        _out: &mut Vec<u64>,
    ) -> Result<Option<Watermark>> {
        self.watermarks.lock().unwrap().push(wm);
        Ok(Some(wm))
    }
    fn processing_deadline(&self) -> Option<Instant> {
        self.deadline
    }
    fn on_processing_time(&mut self, _now: Instant, out: &mut Vec<u64>) -> Result<()> {
        *self.wakeups.lock().unwrap() += 1;
        self.deadline = None;
        out.append(&mut self.held);
        Ok(())
    }
    fn finish(&mut self, out: &mut Vec<u64>) -> Result<()> {
        out.append(&mut self.held);
        Ok(())
    }
}

struct Collect(Arc<Mutex<Vec<u64>>>);

#[async_trait]
impl Sink<u64> for Collect {
    type Pending = ();
    async fn recover(&mut self, _p: Vec<()>) -> Result<()> {
        Ok(())
    }
    async fn write_batch(&mut self, r: Vec<u64>) -> Result<()> {
        self.0.lock().unwrap().extend(r);
        Ok(())
    }
    async fn pre_commit(&mut self, _c: CheckpointId) -> Result<Option<()>> {
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
fn watermarks_flow_and_processing_deadlines_fire() {
    let env = StreamEnvironment::new(JobConfig::new("hooks"));
    let watermarks = Arc::new(Mutex::new(Vec::new()));
    let wakeups = Arc::new(Mutex::new(0));
    let out = Arc::new(Mutex::new(Vec::new()));
    let (w2, k2, o2) = (watermarks.clone(), wakeups.clone(), out.clone());
    let a = env.source("a", |_: &SubtaskInfo| Ok(Counting { next: 0, end: 300 }));
    let b = env.source("b", |_: &SubtaskInfo| Ok(Counting { next: 0, end: 200 }));
    a.union(&b)
        .add_operator("delay", Partitioning::Forward, move |_| {
            Ok(Delay {
                held: Vec::new(),
                deadline: None,
                watermarks: w2.clone(),
                wakeups: k2.clone(),
            })
        })
        .sink("collect", move |_: &SubtaskInfo| Ok(Collect(o2.clone())));
    env.execute_blocking().expect("job");
    let mut got = out.lock().unwrap().clone();
    got.sort_unstable();
    let mut want: Vec<u64> = (0..300).chain(0..200).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    assert!(
        *wakeups.lock().unwrap() > 0,
        "the deadline must wake the operator"
    );
    let wms = watermarks.lock().unwrap();
    assert!(
        wms.windows(2).all(|w| w[0] < w[1]),
        "watermarks strictly increase"
    );
    // the minimum over both inputs; an exhausted source sends the maximum watermark
    assert!(wms.contains(&Watermark(299)), "{wms:?}");
    assert_eq!(wms.last(), Some(&Watermark(i64::MAX)));
}
