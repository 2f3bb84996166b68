//! Crash and fault-injection tests through the storage seam: the in-memory backend models what
//! a crash keeps (synced bytes of synced directory entries), freezes fsync after the Nth call
//! and fails writes, and the store is reopened on the crash image.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, set_base_offset, BatchSpec, RecordSpec};
use onceflow_broker::storage::{
    AppendError, FsyncPolicy, MemBackend, StorageConfig, StorageError, Store,
};

const ROOT: &str = "/crash";

fn open(backend: &MemBackend, fsync: FsyncPolicy, segment_bytes: u64) -> Store {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes,
        fsync,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new(ROOT)).expect("open")
}

fn idem(seq: i32, records: usize, value_len: usize) -> Bytes {
    let value = vec![b'x'; value_len];
    let recs = vec![
        RecordSpec {
            timestamp: 5,
            key: None,
            value: Some(&value),
            headers: vec![],
        };
        records
    ];
    encode_batch(
        BatchSpec {
            producer_id: 11,
            producer_epoch: 0,
            base_sequence: seq,
            ..BatchSpec::default()
        },
        &recs,
    )
    .freeze()
}

fn whole_log(store: &Store) -> Vec<u8> {
    let p = store.partition("t", 0).expect("partition");
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < p.high_watermark() {
        let chunk = p.read(offset, usize::MAX).expect("read");
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

/// Appends batches of a growing sequence; returns the stored bytes of each acknowledged one.
fn append_until_error(store: &Store, count: usize) -> (Vec<Vec<u8>>, Option<AppendError>) {
    let p = store.partition("t", 0).expect("partition");
    let mut acked = Vec::new();
    let mut seq = 0;
    for i in 0..count {
        let n = 1 + i % 4;
        let b = idem(seq, n, 20 + (i * 13) % 200);
        match p.append(b.clone()) {
            Ok(out) => {
                assert!(!out.duplicate);
                let mut v = b.to_vec();
                set_base_offset(&mut v, out.base_offset);
                acked.push(v);
                seq += n as i32;
            }
            Err(e) => return (acked, Some(e)),
        }
    }
    (acked, None)
}

#[test]
fn every_batch_acknowledgements_survive_a_crash_at_any_point() {
    for stop in [0usize, 1, 2, 7, 20, 45] {
        let backend = MemBackend::new();
        let store = open(&backend, FsyncPolicy::EveryBatch, 700);
        store.create_topic("t", 1).unwrap();
        let (acked, err) = append_until_error(&store, stop);
        assert!(err.is_none());
        let image = backend.crash_image();
        drop(store);
        let store = open(&image, FsyncPolicy::EveryBatch, 700);
        assert_eq!(
            whole_log(&store),
            acked.concat(),
            "crash after {stop} appends"
        );
        // Producer state came back too: the last batch is a duplicate, the next one follows.
        let p = store.partition("t", 0).unwrap();
        let next_seq: i32 = (0..stop).map(|i| 1 + (i % 4) as i32).sum();
        if stop > 0 {
            let last_n = 1 + (stop - 1) % 4;
            let last = idem(
                next_seq - last_n as i32,
                last_n,
                20 + ((stop - 1) * 13) % 200,
            );
            assert!(p.append(last).unwrap().duplicate);
        }
        assert!(!p.append(idem(next_seq, 1, 1)).unwrap().duplicate);
    }
}

#[test]
fn frozen_fsync_keeps_exactly_the_acknowledged_batches() {
    for budget in 0..40u64 {
        let backend = MemBackend::new();
        let store = open(&backend, FsyncPolicy::EveryBatch, 600);
        store.create_topic("t", 1).unwrap();
        backend.fail_syncs_after(budget);
        let (acked, err) = append_until_error(&store, 60);
        assert!(
            matches!(err, Some(AppendError::Storage(StorageError::Io { .. }))),
            "budget {budget}: {err:?}"
        );
        // The partition is offline after a failed fsync.
        let p = store.partition("t", 0).unwrap();
        assert!(matches!(
            p.append(idem(0, 1, 1)),
            Err(AppendError::Storage(_))
        ));
        let image = backend.crash_image();
        drop(store);
        let store = open(&image, FsyncPolicy::EveryBatch, 600);
        assert_eq!(whole_log(&store), acked.concat(), "fsync budget {budget}");
    }
}

#[test]
fn unsynced_policies_recover_a_valid_prefix() {
    for fsync in [
        FsyncPolicy::Never,
        FsyncPolicy::Interval(std::time::Duration::from_secs(3600)),
    ] {
        let backend = MemBackend::new();
        let store = open(&backend, fsync, 800);
        store.create_topic("t", 1).unwrap();
        let (acked, _) = append_until_error(&store, 50);
        let synced = acked.concat();
        // A flush syncs what the rolls sealed (they leave it unsynced) and the active segment.
        store.sync_data().unwrap();
        // More appends, rolling several segments, none synced.
        let p = store.partition("t", 0).unwrap();
        let mut all = synced.clone();
        for i in 0..20 {
            let value = vec![b'y'; 100 + i];
            let b = encode_batch(
                BatchSpec::default(),
                &[RecordSpec {
                    value: Some(&value),
                    ..RecordSpec::default()
                }],
            )
            .freeze();
            let out = p.append(b.clone()).unwrap();
            let mut v = b.to_vec();
            set_base_offset(&mut v, out.base_offset);
            all.extend_from_slice(&v);
        }
        let image = backend.crash_image();
        drop(store);
        let store = open(&image, fsync, 800);
        let got = whole_log(&store);
        assert_eq!(
            got, synced,
            "{fsync}: the flushed log survives whole, the appends after it (and their \
             rolls) synced nothing"
        );
        assert_eq!(&all[..got.len()], &got[..], "{fsync}: not a prefix");
        // Appends continue right after the surviving prefix.
        let p = store.partition("t", 0).unwrap();
        let hw = p.high_watermark();
        assert_eq!(
            p.append(encode_batch(BatchSpec::default(), &[RecordSpec::default()]).freeze())
                .unwrap()
                .base_offset,
            hw
        );
    }
}

/// A flush fsyncs without holding the partition's lock: appends go on while the disk is
/// busy, and the flush covers what was written before it started. Under `interval-ms` even
/// appends that roll segments go on (the roll leaves its syncs to the flusher).
#[test]
fn appends_go_on_while_a_flush_syncs() {
    for (fsync, segment_bytes) in [
        (FsyncPolicy::Never, 1 << 20),
        (
            FsyncPolicy::Interval(std::time::Duration::from_secs(3600)),
            800,
        ),
    ] {
        let backend = MemBackend::new();
        let store = open(&backend, fsync, segment_bytes);
        store.create_topic("t", 1).unwrap();
        let (before, _) = append_until_error(&store, 5);
        let segments_before = store.partition("t", 0).unwrap().segment_count();
        backend.hold_syncs();
        let flusher = std::thread::spawn({
            let store = store.clone();
            move || store.sync_data()
        });
        assert!(
            backend.wait_for_held_syncs(1, std::time::Duration::from_secs(30)),
            "the flush never reached its fsync"
        );
        // The flush is inside its fsync: appends must not wait for it.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let appender = std::thread::spawn({
            let p = store.partition("t", 0).unwrap();
            move || {
                for _ in 0..10 {
                    let value = [b'z'; 200];
                    let rec = RecordSpec {
                        value: Some(&value),
                        ..RecordSpec::default()
                    };
                    p.append(encode_batch(BatchSpec::default(), &[rec]).freeze())
                        .unwrap();
                }
                done_tx.send(()).unwrap();
            }
        });
        let appended = done_rx.recv_timeout(std::time::Duration::from_secs(30));
        backend.release_syncs();
        flusher.join().unwrap().unwrap();
        appender.join().unwrap();
        assert!(
            appended.is_ok(),
            "{fsync}: appends waited for the flush's fsync"
        );
        let segments_after = store.partition("t", 0).unwrap().segment_count();
        if segment_bytes < 1 << 20 {
            assert!(
                segments_after > segments_before,
                "{fsync}: the appends rolled no segment"
            );
        }
        let image = backend.crash_image();
        drop(store);
        let store = open(&image, FsyncPolicy::Never, segment_bytes);
        // The flush covers what was appended before it (a disk may also have written some of
        // what came during it).
        let got = whole_log(&store);
        let before = before.concat();
        assert!(
            got.len() >= before.len() && got[..before.len()] == before[..],
            "{fsync}: the flush lost appends made before it"
        );
    }
}

#[test]
fn flush_all_makes_everything_durable() {
    let backend = MemBackend::new();
    let store = open(&backend, FsyncPolicy::Never, 1 << 20);
    store.create_topic("t", 1).unwrap();
    let (acked, _) = append_until_error(&store, 30);
    store.flush_all().unwrap();
    let image = backend.crash_image();
    let store = open(&image, FsyncPolicy::Never, 1 << 20);
    assert_eq!(whole_log(&store), acked.concat());
}

/// The interval flusher syncs the active segment and, with small segments, the sealed ones
/// the rolls left unsynced.
#[test]
fn interval_flusher_syncs_in_the_background() {
    for segment_bytes in [1 << 20, 800] {
        let backend = MemBackend::new();
        let store = open(
            &backend,
            FsyncPolicy::Interval(std::time::Duration::from_millis(10)),
            segment_bytes,
        );
        store.create_topic("t", 1).unwrap();
        let (acked, _) = append_until_error(&store, 40);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let image = backend.crash_image();
            let reopened = open(&image, FsyncPolicy::Never, segment_bytes);
            if whole_log(&reopened) == acked.concat() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "flusher never synced (segments of {segment_bytes} B)"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn failed_write_is_undone_and_later_appends_continue() {
    let backend = MemBackend::new();
    let store = open(&backend, FsyncPolicy::EveryBatch, 1 << 20);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    p.append(idem(0, 2, 10)).unwrap();
    backend.fail_writes_after(0);
    assert!(matches!(
        p.append(idem(2, 1, 10)),
        Err(AppendError::Storage(_))
    ));
    backend.fail_writes_after(u64::MAX);
    // The undo (a truncate) failed too, so the partition stays offline until reopen.
    assert!(matches!(
        p.append(idem(2, 1, 10)),
        Err(AppendError::Storage(_))
    ));
    drop(store);
    let store = open(&backend, FsyncPolicy::EveryBatch, 1 << 20);
    let p = store.partition("t", 0).unwrap();
    assert_eq!(p.high_watermark(), 2);
    assert_eq!(p.append(idem(2, 1, 10)).unwrap().base_offset, 2);
}

#[test]
fn concurrent_every_batch_appends_share_fsyncs_and_all_survive() {
    let backend = MemBackend::new();
    let store = open(&backend, FsyncPolicy::EveryBatch, 2_000);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..50 {
                    let value = vec![t as u8; 30 + i];
                    let rec = RecordSpec {
                        timestamp: i as i64,
                        key: None,
                        value: Some(&value),
                        headers: vec![],
                    };
                    let b = encode_batch(BatchSpec::default(), &[rec.clone(), rec]).freeze();
                    let out = p.append(b.clone()).unwrap();
                    // Acknowledged means readable (the high watermark covers it).
                    assert!(p.high_watermark() > out.last_offset);
                    let mut v = b.to_vec();
                    set_base_offset(&mut v, out.base_offset);
                    acked.push((out.base_offset, v));
                }
                acked
            })
        })
        .collect();
    let mut acked: Vec<(i64, Vec<u8>)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    acked.sort();
    let offsets: Vec<i64> = acked.iter().map(|a| a.0).collect();
    assert_eq!(offsets, (0..200).map(|i| i * 2).collect::<Vec<_>>());
    let expected: Vec<u8> = acked.into_iter().flat_map(|a| a.1).collect();
    let image = backend.crash_image();
    drop(store);
    let store = open(&image, FsyncPolicy::EveryBatch, 2_000);
    assert_eq!(whole_log(&store), expected);
}
