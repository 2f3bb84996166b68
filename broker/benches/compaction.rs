//! Log cleaner throughput and its cost to producers, measured on the storage layer (no
//! network) in one run. Prints a markdown table.
//!
//! `cargo bench -p onceflow-broker --bench compaction` (add `-- --quick` for a short run).
//!
//! 1. Cleaner: a compacted partition (file backend, `--fsync never`, 4 MiB segments) is filled
//!    with batches of 100 keyed records (100-byte values, 10,000 keys), then one pass cleans
//!    every closed segment: MB/s = bytes of the cleanable log / pass time (both reads
//!    included, the key map and the filtering, plus writing and swapping the cleaned files).
//! 2. Produce with and without the cleaner: the same appends (one thread, batches of 100
//!    records) to a compacted partition of a store whose background cleaner ticks every
//!    10 ms (1 MiB segments, `min.cleanable.dirty.ratio` 0.01, so it cleans continuously),
//!    and of a store without a cleaner; rounds alternate between the two, median of 3 (1 with
//!    --quick).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FileBackend, FsyncPolicy, LogConfig, StorageConfig, Store};

const KEYS: usize = 10_000;
const PER_BATCH: usize = 100;
const VALUE: usize = 100;

fn batches(count: usize, seed: usize) -> Vec<Bytes> {
    let value = vec![b'v'; VALUE];
    (0..count)
        .map(|b| {
            let keys: Vec<String> = (0..PER_BATCH)
                .map(|i| format!("key-{:05}", (seed + b * PER_BATCH + i * 7919) % KEYS))
                .collect();
            let recs: Vec<RecordSpec> = keys
                .iter()
                .map(|k| RecordSpec {
                    timestamp: 1,
                    key: Some(k.as_bytes()),
                    value: Some(&value),
                    headers: Vec::new(),
                })
                .collect();
            encode_batch(BatchSpec::default(), &recs).freeze()
        })
        .collect()
}

fn store(dir: &Path, segment_bytes: u64, cleaner: Option<Duration>) -> Store {
    let config = StorageConfig {
        segment_bytes,
        fsync: FsyncPolicy::Never,
        cleaner_interval: cleaner,
        ..StorageConfig::default()
    };
    let s = Store::open_with_backend(config, Arc::new(FileBackend), dir).expect("store");
    s.create_topic("t", 1).expect("topic");
    let mut lc = LogConfig::with_segment_bytes(segment_bytes);
    for (k, v) in [
        ("cleanup.policy", "compact"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("delete.retention.ms", "0"),
    ] {
        assert!(lc.apply(k, v));
    }
    s.set_topic_log_config("t", lc).expect("config");
    s
}

fn append_all(s: &Store, data: &[Bytes]) -> Duration {
    let p = s.partition("t", 0).expect("partition");
    let started = Instant::now();
    for b in data {
        p.append(b.clone()).expect("append");
    }
    started.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (fill, rounds, produce) = if quick {
        (1_000, 1, 1_000)
    } else {
        (4_000, 3, 4_000)
    };
    let tmp = tempfile::tempdir().expect("tempdir");

    // 1. One cleaning pass over a filled log.
    let s = store(&tmp.path().join("clean"), 4 << 20, None);
    append_all(&s, &batches(fill, 0));
    let started = Instant::now();
    let r = s.clean_now("t", 0).expect("clean").expect("cleanable");
    let secs = started.elapsed().as_secs_f64();
    let dirty_mb = r.bytes_read as f64 / 2.0 / 1e6;
    println!("| cleaner pass | dirty MB | written MB | records kept | records removed | seconds | MB/s |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} segments | {dirty_mb:.1} | {:.1} | {} | {} | {secs:.2} | {:.0} |",
        r.segments,
        r.bytes_written as f64 / 1e6,
        r.stats.records_kept,
        r.stats.records_removed,
        dirty_mb / secs
    );
    drop(s);

    // 2. Produce with and without the background cleaner, alternating.
    let data = batches(produce, 1);
    let records = (produce * PER_BATCH) as f64;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for cleaner in [true, false] {
            let dir = tmp.path().join(format!("produce-{round}-{cleaner}"));
            let interval = cleaner.then_some(Duration::from_millis(10));
            let s = store(&dir, 1 << 20, interval);
            let secs = append_all(&s, &data).as_secs_f64();
            if cleaner {
                with.push(records / secs);
            } else {
                without.push(records / secs);
            }
        }
    }
    let (w, wo) = (median(with), median(without));
    println!();
    println!("| appends (batches of {PER_BATCH}) | records/s | ratio |");
    println!("|---|---|---|");
    println!("| without cleaner | {wo:.0} | 1.00 |");
    println!("| cleaner every 10 ms | {w:.0} | {:.2} |", w / wo);
}
