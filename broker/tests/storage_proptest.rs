//! Property tests of the log: for random batch and segment sizes, read() returns exactly the
//! appended batches (offsets rewritten), from any offset, before and after a reopen.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, set_base_offset, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FsyncPolicy, MemBackend, StorageBackend, StorageConfig, Store};
use proptest::prelude::*;

fn make_batch(records: usize, value_len: usize, ts: i64) -> Bytes {
    let value = vec![7u8; value_len];
    let recs = vec![
        RecordSpec {
            timestamp: ts,
            key: Some(b"k"),
            value: Some(&value),
            headers: vec![],
        };
        records
    ];
    encode_batch(BatchSpec::default(), &recs).freeze()
}

fn check(
    backend: Arc<dyn StorageBackend>,
    root: &Path,
    sizes: &[(usize, usize)],
    segment_bytes: u64,
    probes: &[usize],
) {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes,
        fsync: FsyncPolicy::Never,
        ..StorageConfig::default()
    };
    let store = Store::open_with_backend(config.clone(), Arc::clone(&backend), root).unwrap();
    store.create_topic("p", 1).unwrap();
    let p = store.partition("p", 0).unwrap();
    // (base offset, last offset, stored bytes)
    let mut expected: Vec<(i64, i64, Vec<u8>)> = Vec::new();
    for (i, (records, value_len)) in sizes.iter().enumerate() {
        let b = make_batch(*records, *value_len, i as i64);
        let out = p.append(b.clone()).unwrap();
        let mut v = b.to_vec();
        set_base_offset(&mut v, out.base_offset);
        expected.push((out.base_offset, out.last_offset, v));
    }
    let verify = |store: &Store| {
        let p = store.partition("p", 0).unwrap();
        let end = expected.last().map_or(0, |e| e.1 + 1);
        assert_eq!(p.high_watermark(), end);
        // From offset 0 with unlimited bytes: one segment's worth at a time, in order.
        let mut got = Vec::new();
        let mut off = 0;
        while off < end {
            let chunk = p.read(off, usize::MAX).unwrap();
            assert!(!chunk.is_empty());
            let k = expected.iter().position(|e| e.0 == off).unwrap();
            let mut n = 0;
            let mut i = k;
            while n < chunk.len() {
                n += expected[i].2.len();
                i += 1;
            }
            assert_eq!(n, chunk.len(), "chunk ends inside a batch");
            off = expected[i - 1].1 + 1;
            got.extend_from_slice(&chunk);
        }
        let all: Vec<u8> = expected.iter().flat_map(|e| e.2.clone()).collect();
        assert_eq!(got, all);
        for probe in probes {
            if expected.is_empty() {
                break;
            }
            let e = &expected[probe % expected.len()];
            let off = e.0 + (*probe as i64 % (e.1 - e.0 + 1));
            let first = p.read(off, 1).unwrap();
            assert_eq!(&first[..], &e.2[..]);
            let ts = p.offset_for_timestamp((probe % expected.len()) as i64);
            assert_eq!(ts.map(|t| t.0), Some(e.0));
        }
    };
    verify(&store);
    store.flush_all().unwrap();
    drop(store);
    let store = Store::open_with_backend(config, backend, root).unwrap();
    verify(&store);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn memory_read_returns_what_was_appended(
        sizes in prop::collection::vec((1usize..20, 0usize..700), 0..120),
        segment_bytes in 100u64..6000,
        probes in prop::collection::vec(0usize..10_000, 8),
    ) {
        check(Arc::new(MemBackend::new()), Path::new("/prop"), &sizes, segment_bytes, &probes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn file_read_returns_what_was_appended(
        sizes in prop::collection::vec((1usize..20, 0usize..2000), 1..80),
        segment_bytes in 100u64..20_000,
        probes in prop::collection::vec(0usize..10_000, 8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        check(Arc::new(onceflow_broker::storage::FileBackend), dir.path(), &sizes, segment_bytes, &probes);
    }
}
