//! Crashes in the middle of retention and DeleteRecords, through the in-memory backend's crash
//! images: fsync is frozen after the Nth call of a deletion (for every N), the store is
//! reopened on what a crash would leave, and the log must start at the old or the new log
//! start with every offset from there to the end readable, contiguous and unchanged.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FsyncPolicy, MemBackend, StorageConfig, Store};

const ROOT: &str = "/crash";
const RECORDS: i64 = 20;

fn open(backend: &MemBackend) -> Store {
    let config = StorageConfig {
        segment_bytes: 600,
        fsync: FsyncPolicy::EveryBatch,
        retention_check_interval: None,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new(ROOT)).expect("open")
}

fn batch(i: i64) -> Bytes {
    let value = format!("value-{i:04}").repeat(20);
    let recs = [RecordSpec {
        timestamp: 1_000 + i,
        key: None,
        value: Some(value.as_bytes()),
        headers: vec![],
    }];
    encode_batch(BatchSpec::default(), &recs).freeze()
}

/// The base offset and value of every batch from `from` to the high watermark.
fn batches_from(store: &Store, from: i64) -> Vec<(i64, Vec<u8>)> {
    let p = store.partition("t", 0).expect("partition");
    let mut out = Vec::new();
    let mut offset = from;
    while offset < p.high_watermark() {
        let chunk = p.read(offset, usize::MAX).expect("read");
        let mut pos = 0;
        while pos < chunk.len() {
            let len =
                i32::from_be_bytes(chunk[pos + 8..pos + 12].try_into().unwrap()) as usize + 12;
            let base = i64::from_be_bytes(chunk[pos..pos + 8].try_into().unwrap());
            out.push((base, chunk[pos + 61..pos + len].to_vec()));
            offset = base + 1;
            pos += len;
        }
    }
    out
}

/// A store with `RECORDS` single-record batches over several segments, all durable.
fn filled(backend: &MemBackend, retention_bytes: Option<&str>) -> Store {
    let store = open(backend);
    let configs = retention_bytes
        .map(|b| [("retention.bytes".to_string(), b.to_string())].into())
        .unwrap_or_default();
    store
        .create_topic_with_configs("t", 1, configs)
        .expect("create");
    let p = store.partition("t", 0).expect("partition");
    for i in 0..RECORDS {
        p.append(batch(i)).expect("append");
    }
    store.flush_all().expect("flush");
    store
}

/// Reopens `image` and checks it; returns its log start.
fn check_crash_image(
    image: &MemBackend,
    old_start: i64,
    new_start: i64,
    expected: &[(i64, Vec<u8>)],
) -> i64 {
    let store = open(image);
    let p = store.partition("t", 0).expect("partition");
    let start = p.log_start_offset();
    assert!(
        start == old_start || start == new_start,
        "log start {start}, expected {old_start} or {new_start}"
    );
    assert_eq!(p.log_end_offset(), RECORDS);
    let got = batches_from(&store, start);
    let want: Vec<_> = expected
        .iter()
        .filter(|(o, _)| *o >= start)
        .cloned()
        .collect();
    assert_eq!(got, want, "records after a crash with log start {start}");
    // The reopened store keeps working: the deletion can be redone and the log appended to.
    drop(p);
    let p = store.partition("t", 0).expect("partition");
    p.append(batch(RECORDS)).expect("append after the crash");
    start
}

#[test]
fn a_crash_at_any_fsync_of_a_retention_pass_leaves_a_consistent_log() {
    let reference = MemBackend::new();
    let store = filled(&reference, Some("1200"));
    let expected = batches_from(&store, 0);
    let (segments, _) = store.enforce_retention();
    assert!(segments > 0);
    let new_start = store.partition("t", 0).unwrap().log_start_offset();
    let mut starts = Vec::new();
    for n in 0..8 {
        let backend = MemBackend::new();
        let store = filled(&backend, Some("1200"));
        backend.fail_syncs_after(n);
        let _ = store.enforce_retention();
        starts.push(check_crash_image(
            &backend.crash_image(),
            0,
            new_start,
            &expected,
        ));
    }
    assert!(
        starts.contains(&0) && starts.contains(&new_start),
        "{starts:?}"
    );
}

#[test]
fn a_crash_at_any_fsync_of_delete_records_leaves_a_consistent_log() {
    let mut starts = Vec::new();
    for n in 0..8 {
        let backend = MemBackend::new();
        let store = filled(&backend, None);
        let expected = batches_from(&store, 0);
        backend.fail_syncs_after(n);
        let _ = store.partition("t", 0).unwrap().delete_records(13);
        starts.push(check_crash_image(&backend.crash_image(), 0, 13, &expected));
    }
    assert!(starts.contains(&0) && starts.contains(&13), "{starts:?}");
}
