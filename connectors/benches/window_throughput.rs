//! Windowed aggregation benchmark (prints a table): records/s of a count+sum aggregate per
//! key in tumbling (1 s), sliding (10 s every 1 s: size/slide = 10) and session (1 s gap)
//! event-time windows, end to end (generator with watermarks -> key_by -> window -> discard)
//! and for the window operator alone (records and watermarks handed to it directly).
//!
//! Run: `cargo bench -p onceflow-connectors --bench window_throughput`
//! (`BENCH_RECORDS=N` changes the records per run, default 2,000,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_connectors::{DiscardSink, Generator};
use onceflow_operators::window::{
    Aggregate, AggregateFunction, WindowAssigner, WindowOperator, WindowSpec,
};
use onceflow_operators::KeyBy;
use onceflow_runtime::{
    JobConfig, Operator, SourceWatermarks, StreamEnvironment, SubtaskInfo, Watermark,
    WatermarkStrategy,
};

const KEYS: u64 = 1000;

/// Record `i`: 1 ms of event time apart, slightly out of order; keys come in bursts of 50
/// consecutive records (so sessions with a 1 s gap hold 50 records and merge on every one).
fn event(i: u64) -> (u64, i64, u64) {
    let key = (i / 50) % KEYS;
    let ts = i as i64 - (i % 7) as i64;
    (key, ts, i & 0xff)
}

struct CountSum;

impl AggregateFunction<(u64, i64, u64)> for CountSum {
    type Acc = (u64, u64);
    type Out = (u64, u64);
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), r: (u64, i64, u64)) {
        acc.0 += 1;
        acc.1 += r.2;
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
    fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }
}

fn job(records: u64, parallelism: usize, assigner: WindowAssigner) -> (f64, u64) {
    let mut config = JobConfig::new("bench-window").parallelism(parallelism);
    config.worker_threads = 2;
    let env = StreamEnvironment::new(config);
    let sink = DiscardSink::new();
    let strategy = WatermarkStrategy::bounded_out_of_orderness(
        Duration::from_millis(10),
        |r: &(u64, i64, u64)| r.1,
    );
    env.source(
        "events",
        Generator::new(records, event).with_watermarks(strategy),
    )
    .key_by(|r: &(u64, i64, u64)| r.0)
    .window(assigner, |r| r.1)
    .aggregate("window", CountSum)
    .results()
    .sink("discard", sink.clone());
    let start = Instant::now();
    env.execute_blocking().expect("job");
    (records as f64 / start.elapsed().as_secs_f64(), sink.count())
}

fn operator_only(records: u64, assigner: WindowAssigner) -> (f64, u64) {
    let info = SubtaskInfo {
        job_name: "bench".into(),
        operator: "window".into(),
        node_uid: "n00-window".into(),
        index: 0,
        parallelism: 1,
        max_parallelism: 128,
        restored_checkpoint: 0,
    };
    let spec = WindowSpec {
        key: Arc::new(|r: &(u64, i64, u64)| r.0),
        timestamp: Arc::new(|r: &(u64, i64, u64)| r.1),
        assigner,
        allowed_lateness: 0,
    };
    let mut op = WindowOperator::new(spec, Arc::new(Aggregate(CountSum)), &info).expect("op");
    let mut out = Vec::new();
    let mut fired = 0u64;
    let start = Instant::now();
    for i in 0..records {
        op.process(event(i), &mut out).expect("process");
        if i % 1000 == 999 {
            op.handle_watermark(Watermark(i as i64 - 10), &mut out)
                .expect("watermark");
            fired += out.len() as u64;
            out.clear();
        }
    }
    op.handle_watermark(Watermark(i64::MAX), &mut out)
        .expect("watermark");
    fired += out.len() as u64;
    (records as f64 / start.elapsed().as_secs_f64(), fired)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let records: u64 = std::env::var("BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let cases = [
        (
            "tumbling 1 s",
            WindowAssigner::tumbling(Duration::from_secs(1)),
        ),
        (
            "sliding 10 s / 1 s",
            WindowAssigner::sliding(Duration::from_secs(10), Duration::from_secs(1)),
        ),
        (
            "session gap 1 s",
            WindowAssigner::session(Duration::from_secs(1)),
        ),
    ];
    println!("windowed count+sum per key, {KEYS} keys, {records} records per run, median of 3");
    println!();
    println!("| window | operator alone (records/s) | job p=1 (records/s) | job p=2 (records/s) | results |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, assigner) in cases {
        let op = median((0..3).map(|_| operator_only(records, assigner).0).collect());
        let mut results = 0;
        let mut job_rate = |p| {
            median(
                (0..3)
                    .map(|_| {
                        let (r, n) = job(records, p, assigner);
                        results = n;
                        r
                    })
                    .collect(),
            )
        };
        let p1 = job_rate(1);
        let p2 = job_rate(2);
        println!(
            "| {name} | {:.2} M | {:.2} M | {:.2} M | {results} |",
            op / 1e6,
            p1 / 1e6,
            p2 / 1e6
        );
    }
}
