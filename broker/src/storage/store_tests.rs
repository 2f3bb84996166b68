//! Unit tests of the store's persisted topic configs, retention and DeleteRecords on the
//! in-memory backend, reopened on the same tree to check what survives.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::batch::{encode_batch, BatchSpec, RecordSpec};
use super::*;

const ROOT: &str = "/data";

fn open(backend: &Arc<MemBackend>, segment_bytes: u64) -> Result<Store> {
    let config = StorageConfig {
        segment_bytes,
        fsync: FsyncPolicy::Never,
        retention_check_interval: None,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, backend.clone(), Path::new(ROOT))
}

fn batch(spec: BatchSpec, timestamp: i64) -> Bytes {
    let value = [b'v'; 200];
    let recs = [RecordSpec {
        timestamp,
        key: Some(b"k"),
        value: Some(&value),
        headers: vec![],
    }];
    encode_batch(spec, &recs).freeze()
}

fn plain(timestamp: i64) -> Bytes {
    batch(BatchSpec::default(), timestamp)
}

/// Topic `t` with `retention.bytes` 1200 and 20 batches of about 280 bytes appended to its
/// one partition.
fn twenty_batches_bounded_at_1200_bytes(store: &Store) -> Arc<Partition> {
    store
        .create_topic_with_configs("t", 1, configs(&[("retention.bytes", "1200")]))
        .expect("create");
    let p = store.partition("t", 0).expect("partition");
    for i in 0..20 {
        p.append(plain(1_000 + i)).expect("append");
    }
    p
}

fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn topic_configs_persist_resolve_and_go_with_the_topic() {
    let backend = Arc::new(MemBackend::new());
    let store = open(&backend, 1 << 20).expect("open");
    let set = configs(&[
        ("retention.bytes", "4096"),
        ("compression.type", "lz4"),
        ("cleanup.policy", "compact,delete"),
    ]);
    store
        .create_topic_with_configs("t", 2, set.clone())
        .expect("create");
    store.create_topic("plain", 1).expect("create");
    drop(store);

    let store = open(&backend, 1 << 20).expect("reopen");
    assert_eq!(store.topic_configs("t"), Some(set));
    assert_eq!(store.topic_configs("plain"), Some(BTreeMap::new()));
    assert_eq!(store.topic_configs("nope"), None);
    let lc = store.partition("t", 1).expect("partition").log_config();
    assert_eq!(lc.retention_bytes, Some(4096));
    assert!(lc.cleanup_policy.compact && lc.cleanup_policy.delete);

    let altered = configs(&[("retention.ms", "60000")]);
    store
        .alter_topic_configs("t", altered.clone())
        .expect("alter");
    let lc = store.partition("t", 0).expect("partition").log_config();
    assert_eq!((lc.retention_ms, lc.retention_bytes), (Some(60000), None));
    drop(store);

    let store = open(&backend, 1 << 20).expect("reopen");
    assert_eq!(store.topic_configs("t"), Some(altered));
    store.delete_topic("t").expect("delete");
    store.create_topic("t", 1).expect("recreate");
    assert_eq!(store.topic_configs("t"), Some(BTreeMap::new()));
    drop(store);
    let store = open(&backend, 1 << 20).expect("reopen");
    assert_eq!(store.topic_configs("t"), Some(BTreeMap::new()));
}

#[test]
fn a_damaged_config_file_refuses_the_open_and_is_left_alone() {
    let backend = Arc::new(MemBackend::new());
    let store = open(&backend, 1 << 20).expect("open");
    store
        .create_topic_with_configs("t", 1, configs(&[("retention.ms", "1000")]))
        .expect("create");
    drop(store);
    let path = Path::new(ROOT).join(topic_config_file::CONFIG_FILE);
    let mut bytes = backend.read_file(&path).expect("read").expect("exists");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    backend.write_file_atomic(&path, &bytes).expect("write");
    match open(&backend, 1 << 20) {
        Err(StorageError::Corrupt { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains("checksum mismatch"), "{reason}");
        }
        other => panic!("expected a corruption refusal, got {other:?}"),
    }
    assert_eq!(backend.read_file(&path).expect("read"), Some(bytes));
}

#[test]
fn retention_by_bytes_moves_the_log_start_and_survives_a_reopen() {
    let backend = Arc::new(MemBackend::new());
    // About two 280-byte batches per segment.
    let store = open(&backend, 600).expect("open");
    let p = twenty_batches_bounded_at_1200_bytes(&store);
    let (segments, bytes) = store.enforce_retention();
    assert!(
        segments > 0 && bytes > 0,
        "{segments} segments, {bytes} bytes"
    );
    let start = p.log_start_offset();
    assert!(start > 0 && start < 20, "log start {start}");
    assert!(matches!(
        p.read(start - 1, 1 << 20),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    assert!(!p.read(start, 1 << 20).expect("read").is_empty());
    // A second pass has nothing left to do.
    assert_eq!(store.enforce_retention(), (0, 0));
    drop((p, store));

    let store = open(&backend, 600).expect("reopen");
    let p = store.partition("t", 0).expect("partition");
    assert_eq!(p.log_start_offset(), start);
    assert_eq!(p.log_end_offset(), 20);
}

#[test]
fn retention_by_time_and_the_open_transaction_bound() {
    let backend = Arc::new(MemBackend::new());
    let store = open(&backend, 600).expect("open");
    store
        .create_topic_with_configs("t", 1, configs(&[("retention.ms", "1000")]))
        .expect("create");
    let p = store.partition("t", 0).expect("partition");
    for _ in 0..4 {
        p.append(plain(1_000)).expect("append");
    }
    // An open transaction at offset 4, then more (old) data after it.
    let txn = BatchSpec {
        attributes: 0x10,
        producer_id: 7,
        producer_epoch: 0,
        base_sequence: 0,
        ..BatchSpec::default()
    };
    p.append(batch(txn, 1_000)).expect("append");
    for _ in 0..6 {
        p.append(plain(1_000)).expect("append");
    }
    assert_eq!(p.last_stable_offset(), 4);
    store.enforce_retention();
    let start = p.log_start_offset();
    assert!(
        start > 0 && start <= 4,
        "log start {start} passed the open transaction"
    );
    p.append_marker(7, 0, true, 0, 1_000).expect("commit");
    store.enforce_retention();
    assert!(
        p.log_start_offset() > 4,
        "log start {}",
        p.log_start_offset()
    );
}

#[test]
fn delete_records_checkpoints_a_start_inside_a_segment() {
    let backend = Arc::new(MemBackend::new());
    let store = open(&backend, 600).expect("open");
    store.create_topic("t", 1).expect("create");
    let p = store.partition("t", 0).expect("partition");
    for i in 0..10 {
        p.append(plain(1_000 + i)).expect("append");
    }
    assert!(matches!(
        p.delete_records(11),
        Err(DeleteRecordsError::OffsetOutOfRange { .. })
    ));
    assert_eq!(p.delete_records(5).expect("delete"), 5);
    assert_eq!(p.delete_records(3).expect("lower is a no-op"), 5);
    assert_eq!(p.offset_for_timestamp(0).map(|hit| hit.0), Some(5));
    assert!(matches!(
        p.read(4, 1 << 20),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    drop((p, store));
    let store = open(&backend, 600).expect("reopen");
    let p = store.partition("t", 0).expect("partition");
    assert_eq!(p.log_start_offset(), 5);
    assert_eq!(p.delete_records(-1).expect("to the high watermark"), 10);
    assert_eq!(p.read(10, 1 << 20).expect("read").len(), 0);
}

#[test]
fn an_interrupted_deletion_is_finished_at_open() {
    let backend = Arc::new(MemBackend::new());
    let store = open(&backend, 600).expect("open");
    store.create_topic("t", 1).expect("create");
    let p = store.partition("t", 0).expect("partition");
    for i in 0..10 {
        p.append(plain(1_000 + i)).expect("append");
    }
    let dir = p.dir().to_path_buf();
    drop((p, store));
    // A crash right after the checkpoint was written, before any segment was removed.
    backend
        .write_file_atomic(&dir.join(log_start::LOG_START_FILE), &log_start::encode(6))
        .expect("write");
    let store = open(&backend, 600).expect("reopen");
    let p = store.partition("t", 0).expect("partition");
    assert_eq!(p.log_start_offset(), 6);
    let logs: Vec<String> = backend
        .list(&dir)
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.ends_with(".log"))
        .collect();
    let first: i64 = logs
        .iter()
        .filter_map(|n| n[..20].parse().ok())
        .min()
        .expect("a segment");
    assert!(first <= 6 && first > 0, "segments left: {logs:?}");
}

#[test]
fn only_the_brokers_own_in_memory_store_appends_in_place() {
    // The produce handler appends on the connection's task only for this store: a backend
    // handed in (a test's, which may hold or fail syncs) or a data directory stays on the
    // blocking pool.
    let own = Store::open(StorageConfig {
        data_dir: None,
        retention_check_interval: None,
        ..StorageConfig::default()
    })
    .unwrap();
    assert!(own.appends_in_memory());
    let backend = Arc::new(MemBackend::new());
    assert!(!open(&backend, 1 << 20).unwrap().appends_in_memory());
    let dir = tempfile::tempdir().unwrap();
    let on_disk = Store::open(StorageConfig {
        data_dir: Some(dir.path().to_path_buf()),
        fsync: FsyncPolicy::Never,
        retention_check_interval: None,
        ..StorageConfig::default()
    })
    .unwrap();
    assert!(!on_disk.appends_in_memory());
}

#[test]
fn a_roll_is_over_retention_bytes_exactly_when_a_pass_would_delete() {
    let backend = Arc::new(MemBackend::new());
    // About two 280-byte batches per segment; no retention thread: the test runs the passes.
    let store = open(&backend, 600).expect("open");
    let bound = configs(&[("retention.bytes", "1200")]);
    store
        .create_topic_with_configs("deleted", 1, bound.clone())
        .expect("create");
    let mut compacted = bound;
    compacted.insert("cleanup.policy".into(), "compact".into());
    store
        .create_topic_with_configs("compacted", 1, compacted)
        .expect("create");
    for topic in ["deleted", "compacted"] {
        let p = store.partition(topic, 0).expect("partition");
        let mut seen_over = false;
        for i in 0..20 {
            p.append(plain(1_000 + i)).expect("append");
            let over = partition::over_retention_bytes(&p.log_config(), &p.lock_state());
            seen_over |= over;
            let (segments, _) = store.enforce_retention();
            assert_eq!(segments > 0, over, "{topic}, after append {i}");
        }
        assert_eq!(seen_over, topic == "deleted", "{topic}");
    }
}

#[test]
fn a_roll_past_retention_bytes_is_trimmed_before_the_interval() {
    // longer than the test: only the rolls can start the passes awaited below
    roll_trims_with_interval(std::time::Duration::from_secs(3600));
}

#[test]
fn an_interval_past_what_a_clock_can_hold_still_trims_at_the_roll() {
    // a library caller may pass any Duration: the retention thread must not overflow the
    // clock on it (and so die, leaving every partition untrimmed)
    roll_trims_with_interval(std::time::Duration::MAX);
}

fn roll_trims_with_interval(interval: std::time::Duration) {
    let backend = Arc::new(MemBackend::new());
    let config = StorageConfig {
        segment_bytes: 600,
        fsync: FsyncPolicy::Never,
        retention_check_interval: Some(interval),
        ..StorageConfig::default()
    };
    let store = Store::open_with_backend(config, backend, Path::new(ROOT)).expect("open");
    let p = twenty_batches_bounded_at_1200_bytes(&store);
    // Between two rolls only the active segment grows, so what each roll's pass guarantees
    // is about the closed segments: those after the oldest hold less than retention.bytes
    // (the active segment may have grown past the rule since; the next roll trims that).
    let closed_past_oldest = || -> u64 {
        let st = p.lock_state();
        let closed = st.segments.len().saturating_sub(1);
        st.segments[..closed].iter().skip(1).map(|s| s.size()).sum()
    };
    // Bound of the wait: only a missing pass reaches it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while closed_past_oldest() >= 1200 || p.log_start_offset() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no pass trimmed the partition: log start {}, closed segments after the oldest {} bytes",
            p.log_start_offset(),
            closed_past_oldest()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let start = p.log_start_offset();
    assert!(start > 0 && start < 20, "log start {start}");
    assert!(!p.read(start, 1 << 20).expect("read").is_empty());
}

#[test]
fn a_partition_is_marked_due_once_until_taken() {
    let due = partition::RetentionDue::default();
    let none = std::time::Duration::from_millis(1);
    assert!(due.take(none).is_empty());
    due.mark("t", 0);
    due.mark("t", 0);
    due.mark("t", 1);
    due.mark("u", 0);
    let taken = due.take(none);
    assert_eq!(
        taken,
        vec![
            ("t".to_string(), 0),
            ("t".to_string(), 1),
            ("u".to_string(), 0)
        ]
    );
    assert!(due.take(none).is_empty());
}
