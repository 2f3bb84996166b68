//! Dataflow runtime benchmark (prints a table): records/s through map -> key_by -> reduce at
//! parallelism 1 and 2 with and without 1 s checkpoints, checkpoint duration with 1M keys of
//! state, and the cost of a channel hop between tokio tasks vs OS threads.
//!
//! Run: `cargo bench -p onceflow-connectors --bench runtime_throughput`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_connectors::{DiscardSink, Generator};
use onceflow_operators::{KeyBy, Map};
use onceflow_runtime::{CheckpointEvent, JobConfig, StreamEnvironment};

fn pipeline(records: u64, parallelism: usize, checkpoints: Option<Duration>) -> (f64, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = JobConfig::new("bench").parallelism(parallelism);
    config.worker_threads = 2;
    if let Some(every) = checkpoints {
        config = config.checkpoint_interval(every).checkpoint_dir(dir.path());
    }
    let env = StreamEnvironment::new(config);
    let sink = DiscardSink::new();
    env.source("numbers", Generator::new(records, |i| i))
        .map(|i: u64| (i % 10_000, i & 0xff))
        .key_by(|r: &(u64, u64)| r.0)
        .reduce(|a: &(u64, u64), b: (u64, u64)| (a.0, a.1 + b.1))
        .sink("discard", sink.clone());
    let start = Instant::now();
    let r = env.execute_blocking().expect("job");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(sink.count(), records);
    (records as f64 / secs, r.completed_checkpoints)
}

fn checkpoint_with_keys(keys: u64) -> (Duration, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let times: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let last: Arc<Mutex<Option<(u64, Duration)>>> = Arc::default();
    let (t2, l2) = (times.clone(), last.clone());
    let mut config = JobConfig::new("bench-state")
        .parallelism(2)
        .checkpoint_dir(dir.path())
        .retained_checkpoints(1)
        .checkpoint_listener(move |ev| match ev {
            CheckpointEvent::Triggered(n) => {
                t2.lock().unwrap().insert(n, Instant::now());
            }
            CheckpointEvent::Completed(n) => {
                if let Some(t) = t2.lock().unwrap().get(&n) {
                    *l2.lock().unwrap() = Some((n, t.elapsed()));
                }
            }
            CheckpointEvent::Failed(_) => {}
        });
    config.worker_threads = 2;
    let env = StreamEnvironment::new(config);
    env.source("keys", Generator::new(keys, |i| i))
        .key_by(|k: &u64| *k)
        .reduce(|a: &u64, b: u64| a + b)
        .sink("discard", DiscardSink::new());
    env.execute_blocking().expect("job");
    let (id, took) = last.lock().unwrap().expect("a checkpoint completed");
    let chk = dir.path().join(format!("chk-{id:020}"));
    let bytes: u64 = std::fs::read_dir(&chk)
        .expect("checkpoint dir")
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    (took, bytes)
}

fn hop_tokio(batches: usize, batch: usize) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u64>>(16);
        let start = Instant::now();
        let prod = tokio::spawn(async move {
            for i in 0..batches {
                tx.send(vec![i as u64; batch]).await.unwrap();
            }
        });
        let mut n = 0usize;
        while let Some(v) = rx.recv().await {
            n += v.len();
        }
        prod.await.unwrap();
        n as f64 / start.elapsed().as_secs_f64()
    })
}

fn hop_threads(batches: usize, batch: usize) -> f64 {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u64>>(16);
    let start = Instant::now();
    let prod = std::thread::spawn(move || {
        for i in 0..batches {
            tx.send(vec![i as u64; batch]).unwrap();
        }
    });
    let mut n = 0usize;
    while let Ok(v) = rx.recv() {
        n += v.len();
    }
    prod.join().unwrap();
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let records: u64 = std::env::var("BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!("## map -> key_by -> reduce ({records} records, 10k keys)\n");
    println!("| parallelism | checkpoints | records/s (median of 3) | checkpoints taken |");
    println!("| --- | --- | --- | --- |");
    for p in [1, 2] {
        for cp in [None, Some(Duration::from_secs(1))] {
            let runs: Vec<(f64, u64)> = (0..3).map(|_| pipeline(records, p, cp)).collect();
            let n = runs[0].1;
            let rate = median(runs.into_iter().map(|r| r.0).collect());
            let label = if cp.is_some() {
                "every 1 s"
            } else {
                "none (final only)"
            };
            println!("| {p} | {label} | {:.2} M | {n} |", rate / 1e6);
        }
    }
    println!("\n## checkpoint of keyed state (parallelism 2)\n");
    println!("| keys | checkpoint duration | checkpoint size |");
    println!("| --- | --- | --- |");
    for keys in [100_000u64, 1_000_000] {
        let (took, bytes) = checkpoint_with_keys(keys);
        println!(
            "| {keys} | {:.1} ms | {:.1} MB |",
            took.as_secs_f64() * 1000.0,
            bytes as f64 / 1e6
        );
    }
    println!("\n## one channel hop between two subtasks (records/s)\n");
    println!("| batch size | tokio tasks (mpsc) | OS threads (sync_channel) |");
    println!("| --- | --- | --- |");
    for (batches, batch) in [(2_000_000, 1), (40_000, 256)] {
        let tk = median((0..3).map(|_| hop_tokio(batches, batch)).collect());
        let th = median((0..3).map(|_| hop_threads(batches, batch)).collect());
        println!("| {batch} | {:.2} M | {:.2} M |", tk / 1e6, th / 1e6);
    }
}
