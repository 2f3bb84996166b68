//! Damaged files and hostile bytes never panic the store: random produce payloads are refused
//! with errors; a store whose files were truncated or had bytes flipped at random either
//! reopens or refuses with an error naming a damaged segment (an invalid batch with valid data
//! after it), and with repair it reopens; either way it serves only whole, CRC-valid batches
//! with contiguous offsets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{
    encode_batch, validate_batch, BatchSpec, RecordSpec, ATTR_TRANSACTIONAL,
};
use onceflow_broker::storage::{
    FsyncPolicy, MemBackend, StorageBackend, StorageConfig, StorageError, Store,
};
use proptest::prelude::*;

const ROOT: &str = "/corrupt";

fn open(backend: &MemBackend) -> Result<Store, onceflow_broker::storage::StorageError> {
    open_sized(backend, 700)
}

fn open_sized(
    backend: &MemBackend,
    segment_bytes: u64,
) -> Result<Store, onceflow_broker::storage::StorageError> {
    open_with(backend, segment_bytes, false)
}

/// Opens; a refusal must name a segment, and then the store opens with repair.
fn open_or_repair(backend: &MemBackend, segment_bytes: u64) -> Store {
    match open_with(backend, segment_bytes, false) {
        Ok(store) => store,
        Err(StorageError::Corrupt { path, reason }) => {
            assert!(path.starts_with(ROOT), "{path:?}");
            assert_eq!(path.extension().and_then(|e| e.to_str()), Some("log"));
            assert!(reason.contains("--repair-corrupt-logs"), "{reason}");
            open_with(backend, segment_bytes, true).expect("reopen with repair")
        }
        Err(e) => panic!("reopen after damage: {e}"),
    }
}

fn open_with(
    backend: &MemBackend,
    segment_bytes: u64,
    repair_corrupt_logs: bool,
) -> Result<Store, onceflow_broker::storage::StorageError> {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes,
        fsync: FsyncPolicy::EveryBatch,
        repair_corrupt_logs,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new(ROOT))
}

fn all_files(backend: &MemBackend, dir: &Path, out: &mut Vec<PathBuf>) {
    for e in backend.list(dir).unwrap() {
        let p = dir.join(&e.name);
        if e.is_dir {
            all_files(backend, &p, out);
        } else {
            out.push(p);
        }
    }
}

/// A store with two topics, idempotent and transactional data, markers and snapshots.
fn populated() -> MemBackend {
    populated_sized(700, 25)
}

fn populated_sized(segment_bytes: u64, batches: usize) -> MemBackend {
    let backend = MemBackend::new();
    let store = open_sized(&backend, segment_bytes).unwrap();
    store.create_topic("a", 2).unwrap();
    store.create_topic("b", 1).unwrap();
    for (topic, part) in [("a", 0), ("a", 1), ("b", 0)] {
        let p = store.partition(topic, part).unwrap();
        for i in 0..batches {
            let value = vec![i as u8; 10 + (i * 7) % 300];
            let rec = RecordSpec {
                timestamp: i as i64,
                key: None,
                value: Some(&value),
                headers: vec![],
            };
            let attributes = if i % 3 == 0 { ATTR_TRANSACTIONAL } else { 0 };
            let b = encode_batch(
                BatchSpec {
                    attributes,
                    producer_id: 3,
                    producer_epoch: 0,
                    base_sequence: i as i32,
                    ..BatchSpec::default()
                },
                &[rec],
            );
            p.append(b.freeze()).unwrap();
            if i % 3 == 0 {
                p.append_marker(3, 0, i % 2 == 0, 0, 1).unwrap();
            }
        }
    }
    store.flush_all().unwrap();
    backend
}

/// Everything served is whole valid batches with contiguous offsets.
fn check_served(store: &Store) {
    for (topic, n) in store.topics() {
        for part in 0..n {
            let p = store.partition(&topic, part).unwrap();
            let mut offset = p.log_start_offset();
            while offset < p.high_watermark() {
                let chunk = p.read(offset, 500).expect("read");
                assert!(!chunk.is_empty());
                let mut pos = 0;
                while pos < chunk.len() {
                    let len = i32::from_be_bytes(chunk[pos + 8..pos + 12].try_into().unwrap())
                        as usize
                        + 12;
                    let h = validate_batch(&chunk[pos..pos + len]).expect("served batch is valid");
                    assert!(
                        h.base_offset <= offset && offset <= h.last_offset()
                            || h.base_offset == offset
                    );
                    offset = h.last_offset() + 1;
                    pos += len;
                }
            }
            let _ = p.offset_for_timestamp(3);
            let _ = p
                .read_committed(p.log_start_offset(), 1000)
                .expect("read_committed");
            assert!(p.last_stable_offset() <= p.high_watermark());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_produce_payloads_are_refused_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let backend = MemBackend::new();
        let store = open(&backend).unwrap();
        store.create_topic("t", 1).unwrap();
        let p = store.partition("t", 0).unwrap();
        let _ = p.append(Bytes::from(bytes.clone()));
        let _ = p.append_control(Bytes::from(bytes));
        check_served(&store);
    }

    #[test]
    fn damaged_files_reopen_without_panic(
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..6),
    ) {
        let backend = populated();
        let mut files = Vec::new();
        all_files(&backend, Path::new(ROOT), &mut files);
        for (file, at, kind, byte) in damage {
            let path = file.get(&files);
            let mut content = backend.read_file(path).unwrap().unwrap_or_default();
            if content.is_empty() {
                continue;
            }
            let i = at.index(content.len());
            match kind {
                0 => content.truncate(i),
                1 => content[i] ^= byte | 1,
                _ => content.extend_from_slice(&[byte; 40]),
            }
            backend.write_file_atomic(path, &content).unwrap();
        }
        let store = open_or_repair(&backend, 700);
        check_served(&store);
        // Still writable: appends land at the high watermark.
        for (topic, n) in store.topics() {
            for part in 0..n {
                let p = store.partition(&topic, part).unwrap();
                let hw = p.high_watermark();
                let b = encode_batch(BatchSpec::default(), &[RecordSpec::default()]).freeze();
                prop_assert_eq!(p.append(b).unwrap().base_offset, hw);
            }
        }
    }
}

/// Reads everything reachable without asserting success: sealed segments are not re-scanned
/// on open (as in Kafka), so damage before their last index entry is only found by reads
/// (which refuse the damaged batch), but nothing may panic or loop.
fn touch_everything(store: &Store) {
    for (topic, n) in store.topics() {
        for part in 0..n {
            let p = store.partition(&topic, part).unwrap();
            let mut offset = p.log_start_offset();
            let mut steps = 0;
            while offset < p.high_watermark() && steps < 10_000 {
                steps += 1;
                match p.read(offset, 300) {
                    Ok(chunk) if chunk.len() >= 27 => {
                        assert_whole_valid_batches(&chunk);
                        let base = i64::from_be_bytes(chunk[..8].try_into().unwrap());
                        let delta = i32::from_be_bytes(chunk[23..27].try_into().unwrap());
                        let next = base.saturating_add(i64::from(delta)).saturating_add(1);
                        offset = if next > offset { next } else { offset + 1 };
                    }
                    _ => offset += 1,
                }
            }
            let _ = p.offset_for_timestamp(50);
            let _ = p.read_committed(p.log_start_offset(), 1000);
            let _ = p.aborted_transactions(0, i64::MAX);
        }
    }
}

/// A read result is a sequence of whole batches that pass validation (CRC included).
fn assert_whole_valid_batches(chunk: &[u8]) {
    let mut pos = 0;
    while pos < chunk.len() {
        let len = i32::from_be_bytes(chunk[pos + 8..pos + 12].try_into().unwrap()) as usize + 12;
        validate_batch(&chunk[pos..pos + len]).expect("a served batch passes validation");
        pos += len;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn damage_inside_large_indexed_segments_never_panics(
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let backend = populated_sized(64 * 1024, 400);
        let mut files = Vec::new();
        all_files(&backend, Path::new(ROOT), &mut files);
        for (file, at, byte) in damage {
            let path = file.get(&files);
            let mut content = backend.read_file(path).unwrap().unwrap_or_default();
            if content.is_empty() {
                continue;
            }
            let i = at.index(content.len());
            content[i] ^= byte | 1;
            backend.write_file_atomic(path, &content).unwrap();
        }
        let store = open_or_repair(&backend, 64 * 1024);
        touch_everything(&store);
    }
}
