//! Storage scenarios written once and run against both the file backend (a temporary data
//! directory) and the in-memory backend: round trips across segments, reopen, torn tails,
//! idempotent producers, topic registry, damaged index and snapshot files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, set_base_offset, BatchSpec, RecordSpec};
use onceflow_broker::storage::{
    AppendError, FileBackend, FsyncPolicy, MemBackend, ReadError, StorageBackend, StorageConfig,
    StorageError, Store,
};

/// Where a scenario's store lives.
enum Env {
    File(tempfile::TempDir),
    Memory(MemBackend),
}

impl Env {
    fn file() -> Env {
        Env::File(tempfile::tempdir().expect("tempdir"))
    }
    fn memory() -> Env {
        Env::Memory(MemBackend::new())
    }
    fn root(&self) -> PathBuf {
        match self {
            Env::File(d) => d.path().to_path_buf(),
            Env::Memory(_) => PathBuf::from("/mem"),
        }
    }
    fn backend(&self) -> Arc<dyn StorageBackend> {
        match self {
            Env::File(_) => Arc::new(FileBackend),
            Env::Memory(m) => Arc::new(m.clone()),
        }
    }
    fn open_with(&self, segment_bytes: u64, fsync: FsyncPolicy) -> Store {
        let config = StorageConfig {
            data_dir: Some(self.root()),
            segment_bytes,
            fsync,
            ..StorageConfig::default()
        };
        match self {
            Env::File(_) => Store::open(config).expect("open store"),
            Env::Memory(m) => Store::open_with_backend(config, Arc::new(m.clone()), &self.root())
                .expect("open store"),
        }
    }
    fn open(&self, segment_bytes: u64) -> Store {
        self.open_with(segment_bytes, FsyncPolicy::EveryBatch)
    }
    fn files(&self, dir: &Path, ext: &str) -> Vec<PathBuf> {
        self.backend()
            .list(dir)
            .expect("list")
            .into_iter()
            .filter(|e| e.name.ends_with(ext))
            .map(|e| dir.join(e.name))
            .collect()
    }
}

fn batch(pid: i64, epoch: i16, seq: i32, records: usize, value_len: usize) -> Bytes {
    let value = vec![b'v'; value_len];
    let recs: Vec<RecordSpec<'_>> = (0..records)
        .map(|i| RecordSpec {
            timestamp: 1_000 + i as i64,
            key: Some(b"key"),
            value: Some(&value),
            headers: vec![],
        })
        .collect();
    encode_batch(
        BatchSpec {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            ..BatchSpec::default()
        },
        &recs,
    )
    .freeze()
}

fn plain(records: usize, value_len: usize) -> Bytes {
    batch(-1, -1, -1, records, value_len)
}

/// The bytes the log should hold for `b` stored at `offset`.
fn stored(b: &Bytes, offset: i64) -> Vec<u8> {
    let mut v = b.to_vec();
    set_base_offset(&mut v, offset);
    v
}

fn read_all(store: &Store, topic: &str) -> Vec<u8> {
    let p = store.partition(topic, 0).expect("partition");
    let mut out = Vec::new();
    let mut offset = p.log_start_offset();
    while offset < p.high_watermark() {
        let chunk = p.read(offset, 3000).expect("read");
        assert!(!chunk.is_empty(), "empty read at {offset}");
        // Next fetch offset: one past the last batch returned.
        let mut pos = 0;
        while pos < chunk.len() {
            let len =
                i32::from_be_bytes(chunk[pos + 8..pos + 12].try_into().unwrap()) as usize + 12;
            let base = i64::from_be_bytes(chunk[pos..pos + 8].try_into().unwrap());
            let delta = i32::from_be_bytes(chunk[pos + 23..pos + 27].try_into().unwrap());
            offset = base + i64::from(delta) + 1;
            pos += len;
        }
        out.extend_from_slice(&chunk);
    }
    out
}

fn round_trip_over_many_segments(env: Env) {
    let store = env.open(2_000);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    let mut expected = Vec::new();
    let mut next = 0;
    for i in 0..120 {
        let b = plain(1 + i % 7, (i * 37) % 300);
        let out = p.append(b.clone()).unwrap();
        assert_eq!(out.base_offset, next);
        assert!(!out.duplicate);
        expected.push((next, stored(&b, next)));
        next = out.last_offset + 1;
    }
    assert_eq!(p.high_watermark(), next);
    let logs = env.files(&env.root().join("t-0"), ".log");
    assert!(logs.len() > 5, "only {} segments", logs.len());
    let all: Vec<u8> = expected.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!(read_all(&store, "t"), all);
    // Every offset inside a batch returns that batch first.
    for (i, (base, bytes)) in expected.iter().enumerate() {
        let last = expected.get(i + 1).map_or(next, |(b, _)| *b) - 1;
        for off in [*base, last] {
            let got = p.read(off, 1).unwrap();
            assert_eq!(&got[..], &bytes[..], "offset {off}");
        }
    }
    assert!(p.read(next, 100).unwrap().is_empty());
    assert!(matches!(
        p.read(next + 1, 100),
        Err(ReadError::OffsetOutOfRange { log_start: 0, high_watermark }) if high_watermark == next
    ));
    assert!(matches!(
        p.read(-1, 100),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
}

fn offsets_continue_after_reopen(env: Env) {
    let before = {
        let store = env.open(1_000);
        store.create_topic("t", 2).unwrap();
        let p = store.partition("t", 1).unwrap();
        for _ in 0..30 {
            p.append(plain(3, 50)).unwrap();
        }
        store.flush_all().unwrap();
        read_all_partition(&store, 1)
    };
    let store = env.open(1_000);
    assert_eq!(store.topics(), vec![("t".to_string(), 2)]);
    let p = store.partition("t", 1).unwrap();
    assert_eq!(p.high_watermark(), 90);
    assert_eq!(read_all_partition(&store, 1), before);
    assert_eq!(p.append(plain(2, 10)).unwrap().base_offset, 90);
    assert_eq!(store.partition("t", 0).unwrap().high_watermark(), 0);
}

fn read_all_partition(store: &Store, partition: i32) -> Vec<u8> {
    let p = store.partition("t", partition).unwrap();
    p.read(0, usize::MAX).unwrap().to_vec()
}

fn torn_tail_is_cut_on_reopen(env: Env) {
    let batches: Vec<Bytes> = (0..10).map(|i| plain(2, 40 + i)).collect();
    {
        let store = env.open(1 << 20);
        store.create_topic("t", 1).unwrap();
        let p = store.partition("t", 0).unwrap();
        for b in &batches {
            p.append(b.clone()).unwrap();
        }
    }
    let dir = env.root().join("t-0");
    let log = env.files(&dir, ".log").pop().unwrap();
    let f = env.backend().open(&log).unwrap();
    let full = f.len();
    // Cut the last batch in half.
    f.truncate(full - (batches[9].len() as u64) / 2).unwrap();
    drop(f);
    let good: Vec<u8> = batches[..9]
        .iter()
        .enumerate()
        .flat_map(|(i, b)| stored(b, 2 * i as i64))
        .collect();
    {
        let store = env.open(1 << 20);
        let p = store.partition("t", 0).unwrap();
        assert_eq!(p.high_watermark(), 18);
        assert_eq!(read_all(&store, "t"), good);
        assert_eq!(env.backend().open(&log).unwrap().len(), good.len() as u64);
    }
    // Garbage after the last good batch: a plausible length, then noise.
    let f = env.backend().open(&log).unwrap();
    let mut garbage = vec![0u8; 8];
    garbage.extend_from_slice(&100i32.to_be_bytes());
    garbage.extend_from_slice(&[0xAB; 100]);
    f.append(&garbage).unwrap();
    drop(f);
    let store = env.open(1 << 20);
    let p = store.partition("t", 0).unwrap();
    assert_eq!(p.high_watermark(), 18);
    assert_eq!(read_all(&store, "t"), good);
    assert_eq!(p.append(plain(1, 1)).unwrap().base_offset, 18);
}

fn idempotent_producer_rules(env: Env) {
    let store = env.open(1 << 20);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    let first = p.append(batch(7, 0, 0, 3, 10)).unwrap();
    assert_eq!((first.base_offset, first.last_offset), (0, 2));
    p.append(plain(2, 10)).unwrap();
    let second = p.append(batch(7, 0, 3, 2, 10)).unwrap();
    assert_eq!(second.base_offset, 5);
    // The same batch again: original offsets, nothing appended.
    let dup = p.append(batch(7, 0, 0, 3, 10)).unwrap();
    assert!(dup.duplicate);
    assert_eq!((dup.base_offset, dup.last_offset), (0, 2));
    assert_eq!(p.high_watermark(), 7);
    // A gap.
    match p.append(batch(7, 0, 9, 1, 10)) {
        Err(AppendError::OutOfOrderSequence {
            expected: 5,
            got: 9,
        }) => {}
        other => panic!("expected out of order, got {other:?}"),
    }
    // A new epoch must start at 0; then the old one is fenced.
    assert!(matches!(
        p.append(batch(7, 1, 5, 1, 10)),
        Err(AppendError::OutOfOrderSequence {
            expected: 0,
            got: 5
        })
    ));
    assert_eq!(p.append(batch(7, 1, 0, 1, 10)).unwrap().base_offset, 7);
    assert!(matches!(
        p.append(batch(7, 0, 5, 1, 10)),
        Err(AppendError::InvalidProducerEpoch { current: 1, got: 0 })
    ));
    // Corrupt and invalid input.
    let mut bad = batch(8, 0, 0, 1, 10).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        p.append(Bytes::from(bad)),
        Err(AppendError::CorruptMessage(_))
    ));
    let mut v1 = batch(8, 0, 0, 1, 10).to_vec();
    v1[16] = 1;
    assert!(matches!(
        p.append(Bytes::from(v1)),
        Err(AppendError::InvalidRecord(_))
    ));
    assert!(matches!(
        p.append(Bytes::new()),
        Err(AppendError::CorruptMessage(_))
    ));
    assert_eq!(p.high_watermark(), 8);
}

fn producer_state_survives_reopen(env: Env, with_snapshot: bool) {
    {
        let store = env.open(600);
        store.create_topic("t", 1).unwrap();
        let p = store.partition("t", 0).unwrap();
        for seq in 0..20 {
            p.append(batch(42, 3, seq * 2, 2, 30)).unwrap();
        }
        if with_snapshot {
            store.flush_all().unwrap();
        }
    }
    let dir = env.root().join("t-0");
    if !with_snapshot {
        for s in env.files(&dir, ".snapshot") {
            env.backend().remove_file(&s).unwrap();
        }
    }
    let store = env.open(600);
    let p = store.partition("t", 0).unwrap();
    let dup = p.append(batch(42, 3, 38, 2, 30)).unwrap();
    assert!(dup.duplicate, "last batch not recognised as duplicate");
    assert_eq!(dup.base_offset, 38);
    assert!(matches!(
        p.append(batch(42, 3, 41, 1, 30)),
        Err(AppendError::OutOfOrderSequence {
            expected: 40,
            got: 41
        })
    ));
    assert!(matches!(
        p.append(batch(42, 2, 0, 1, 30)),
        Err(AppendError::InvalidProducerEpoch { current: 3, got: 2 })
    ));
    assert_eq!(p.append(batch(42, 3, 40, 1, 30)).unwrap().base_offset, 40);
}

fn damaged_index_and_snapshot_are_rebuilt(env: Env) {
    let expected = {
        let store = env.open(5_000);
        store.create_topic("t", 1).unwrap();
        let p = store.partition("t", 0).unwrap();
        for seq in 0..200 {
            p.append(batch(5, 0, seq, 1, 100)).unwrap();
        }
        store.flush_all().unwrap();
        read_all(&store, "t")
    };
    let dir = env.root().join("t-0");
    let backend = env.backend();
    for (i, idx) in env.files(&dir, ".index").into_iter().enumerate() {
        match i % 3 {
            0 => backend.write_file_atomic(&idx, b"not an index").unwrap(),
            1 => backend.remove_file(&idx).unwrap(),
            _ => {
                let mut bytes = backend.read_file(&idx).unwrap().unwrap();
                let n = bytes.len();
                if n > 20 {
                    bytes[n - 10] ^= 0xff;
                }
                backend.write_file_atomic(&idx, &bytes).unwrap();
            }
        }
    }
    for snap in env.files(&dir, ".snapshot") {
        backend.write_file_atomic(&snap, b"OFPS garbage").unwrap();
    }
    let store = env.open(5_000);
    assert_eq!(read_all(&store, "t"), expected);
    let p = store.partition("t", 0).unwrap();
    assert!(p.append(batch(5, 0, 199, 1, 100)).unwrap().duplicate);
    assert_eq!(p.append(batch(5, 0, 200, 1, 100)).unwrap().base_offset, 200);
    for off in (0..200).step_by(17) {
        let got = p.read(off, 1).unwrap();
        assert_eq!(i64::from_be_bytes(got[..8].try_into().unwrap()), off);
    }
}

fn topics_persist_and_delete_removes_files(env: Env) {
    {
        let store = env.open(1 << 20);
        store.create_topic("b", 2).unwrap();
        store.create_topic("a.x_y-z", 1).unwrap();
        assert!(matches!(
            store.create_topic("b", 1),
            Err(StorageError::TopicExists(_))
        ));
        assert!(matches!(
            store.create_topic("..", 1),
            Err(StorageError::InvalidTopic(_))
        ));
        assert!(matches!(
            store.create_topic("ok", 0),
            Err(StorageError::InvalidTopic(_))
        ));
        store
            .partition("b", 1)
            .unwrap()
            .append(plain(1, 5))
            .unwrap();
        assert!(store.partition("b", 2).is_none());
        assert!(store.partition("b", -1).is_none());
        assert!(store.partition("nope", 0).is_none());
    }
    let store = env.open(1 << 20);
    assert_eq!(
        store.topics(),
        vec![("a.x_y-z".to_string(), 1), ("b".to_string(), 2)]
    );
    assert_eq!(store.partition("b", 1).unwrap().high_watermark(), 1);
    let old = store.partition("b", 1).unwrap();
    store.delete_topic("b").unwrap();
    assert!(matches!(
        store.delete_topic("b"),
        Err(StorageError::UnknownTopic(_))
    ));
    assert!(matches!(
        old.append(plain(1, 1)),
        Err(AppendError::Storage(StorageError::UnknownTopic(_)))
    ));
    let dirs: Vec<String> = env
        .backend()
        .list(&env.root())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(!dirs.iter().any(|d| d.starts_with("b-")), "{dirs:?}");
    // Re-created empty, and the deletion survives reopen.
    store.create_topic("b", 1).unwrap();
    assert_eq!(store.partition("b", 0).unwrap().high_watermark(), 0);
    drop(store);
    let store = env.open(1 << 20);
    assert_eq!(
        store.topics(),
        vec![("a.x_y-z".to_string(), 1), ("b".to_string(), 1)]
    );
}

fn timestamps_and_read_limits(env: Env) {
    let store = env.open(3_000);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    for i in 0..100i64 {
        let value = vec![0u8; 80];
        let recs = [RecordSpec {
            timestamp: 10_000 + i * 10,
            key: None,
            value: Some(&value),
            headers: vec![(b"h".as_slice(), Some(b"x".as_slice()))],
        }];
        p.append(encode_batch(BatchSpec::default(), &recs).freeze())
            .unwrap();
    }
    assert_eq!(p.offset_for_timestamp(0), Some((0, 10_000)));
    assert_eq!(p.offset_for_timestamp(10_455), Some((46, 10_460)));
    assert_eq!(p.offset_for_timestamp(10_990), Some((99, 10_990)));
    assert_eq!(p.offset_for_timestamp(10_991), None);
    let one = p.read(0, 1).unwrap().len();
    let got = p.read(0, one * 5 + one / 2).unwrap();
    assert_eq!(got.len(), one * 5, "max_bytes cuts at a batch boundary");
}

macro_rules! scenarios {
    ($($name:ident => $body:expr;)*) => {
        mod file_backend {
            use super::*;
            $(#[test] fn $name() { let f: fn(Env) = $body; f(Env::file()) })*
        }
        mod memory_backend {
            use super::*;
            $(#[test] fn $name() { let f: fn(Env) = $body; f(Env::memory()) })*
        }
    };
}

scenarios! {
    round_trip => round_trip_over_many_segments;
    reopen_continues_offsets => offsets_continue_after_reopen;
    torn_tail => torn_tail_is_cut_on_reopen;
    idempotence => idempotent_producer_rules;
    producer_state_with_snapshot => |env| producer_state_survives_reopen(env, true);
    producer_state_without_snapshot => |env| producer_state_survives_reopen(env, false);
    damaged_index_and_snapshot => damaged_index_and_snapshot_are_rebuilt;
    topics => topics_persist_and_delete_removes_files;
    timestamps => timestamps_and_read_limits;
}
