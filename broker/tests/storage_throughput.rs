//! Throughput figures of the storage layer alone (ignored by default; nothing is asserted):
//! `cargo test -p onceflow-broker --release --test storage_throughput -- --ignored --nocapture`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FsyncPolicy, MemBackend, StorageConfig, Store};

fn run(label: &str, store: &Store, record_len: usize, records_per_batch: usize, batches: usize) {
    store.create_topic(label, 1).unwrap();
    let p = store.partition(label, 0).unwrap();
    let value = vec![1u8; record_len];
    let recs = vec![
        RecordSpec {
            timestamp: 1,
            key: None,
            value: Some(&value),
            headers: vec![]
        };
        records_per_batch
    ];
    let encoded: Vec<Bytes> = (0..batches)
        .map(|i| {
            encode_batch(
                BatchSpec {
                    producer_id: 1,
                    producer_epoch: 0,
                    base_sequence: (i * records_per_batch) as i32,
                    ..BatchSpec::default()
                },
                &recs,
            )
            .freeze()
        })
        .collect();
    let bytes: usize = encoded.iter().map(|b| b.len()).sum();
    let started = Instant::now();
    for b in encoded {
        p.append(b).unwrap();
    }
    let append = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut offset = 0;
    let mut read = 0;
    while offset < p.high_watermark() {
        let chunk = p.read(offset, 1 << 20).unwrap();
        read += chunk.len();
        let mut pos = 0;
        while pos < chunk.len() {
            let len =
                i32::from_be_bytes(chunk[pos + 8..pos + 12].try_into().unwrap()) as usize + 12;
            let base = i64::from_be_bytes(chunk[pos..pos + 8].try_into().unwrap());
            let delta = i32::from_be_bytes(chunk[pos + 23..pos + 27].try_into().unwrap());
            offset = base + i64::from(delta) + 1;
            pos += len;
        }
    }
    let fetch = started.elapsed().as_secs_f64();
    assert_eq!(read, bytes);
    let records = (batches * records_per_batch) as f64;
    println!(
        "| {label:<28} | {record_len:>5} | {:>10.0} | {:>8.1} | {:>10.0} | {:>8.1} |",
        records / append,
        bytes as f64 / append / 1e6,
        records / fetch,
        bytes as f64 / fetch / 1e6
    );
}

#[test]
#[ignore]
fn storage_throughput() {
    println!("| mode | record bytes | append rec/s | append MB/s | read rec/s | read MB/s |");
    let mem = Store::open_with_backend(
        StorageConfig::default(),
        Arc::new(MemBackend::new()),
        Path::new("/b"),
    )
    .unwrap();
    run("memory-100", &mem, 100, 160, 2_000);
    run("memory-1k", &mem, 1024, 16, 2_000);
    let dir = tempfile::tempdir().unwrap();
    for (name, fsync) in [
        ("never", FsyncPolicy::Never),
        ("every-batch", FsyncPolicy::EveryBatch),
    ] {
        let store = Store::open(StorageConfig {
            data_dir: Some(dir.path().join(name)),
            segment_bytes: 64 << 20,
            fsync,
            ..StorageConfig::default()
        })
        .unwrap();
        run(&format!("file-{name}-100"), &store, 100, 160, 2_000);
        run(&format!("file-{name}-1k"), &store, 1024, 16, 2_000);
    }
}
