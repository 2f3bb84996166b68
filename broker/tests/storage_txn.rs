//! Storage side of transactions: transactional batches open a producer's transaction on the
//! partition, control batches (markers) appended through `append_control` close it, skip
//! sequence checks, fence older epochs and survive reopen with or without snapshots.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{
    encode_batch, BatchSpec, RecordSpec, ATTR_CONTROL, ATTR_TRANSACTIONAL,
};
use onceflow_broker::storage::{
    AppendError, FsyncPolicy, MemBackend, StorageBackend, StorageConfig, Store,
};

fn open(backend: &MemBackend) -> Store {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes: 400,
        fsync: FsyncPolicy::EveryBatch,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new("/txn")).unwrap()
}

fn data(pid: i64, epoch: i16, seq: i32, n: usize, transactional: bool) -> Bytes {
    let attributes = if transactional { ATTR_TRANSACTIONAL } else { 0 };
    encode_batch(
        BatchSpec {
            attributes,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            ..BatchSpec::default()
        },
        &vec![
            RecordSpec {
                timestamp: 1,
                value: Some(b"v"),
                ..RecordSpec::default()
            };
            n
        ],
    )
    .freeze()
}

/// A COMMIT (type 1) or ABORT (type 0) marker as Kafka lays it out.
fn marker(pid: i64, epoch: i16, commit: bool) -> Bytes {
    let key = [0, 0, 0, u8::from(commit)];
    let value = [0, 0, 0, 0, 0, 7];
    encode_batch(
        BatchSpec {
            attributes: ATTR_CONTROL | ATTR_TRANSACTIONAL,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: -1,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            timestamp: 2,
            key: Some(&key),
            value: Some(&value),
            headers: vec![],
        }],
    )
    .freeze()
}

#[test]
fn markers_only_through_append_control() {
    let store = open(&MemBackend::new());
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    assert!(matches!(
        p.append(marker(1, 0, true)),
        Err(AppendError::InvalidRecord(_))
    ));
    assert!(matches!(
        p.append_control(data(1, 0, 0, 1, true)),
        Err(AppendError::InvalidRecord(_))
    ));
    assert_eq!(p.high_watermark(), 0);
}

#[test]
fn transactions_open_close_and_fence() {
    let backend = MemBackend::new();
    let store = open(&backend);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    p.append(data(-1, -1, -1, 2, false)).unwrap();
    assert_eq!(p.append(data(9, 0, 0, 3, true)).unwrap().base_offset, 2);
    p.append(data(9, 0, 3, 1, true)).unwrap();
    p.append(data(4, 0, 0, 1, true)).unwrap();
    assert_eq!(p.open_transactions(), vec![(9, 2), (4, 6)]);
    // Markers carry sequence -1 and do not disturb the sequence of the next transaction.
    let commit = p.append_control(marker(9, 0, true)).unwrap();
    assert_eq!(commit.base_offset, 7);
    assert_eq!(p.open_transactions(), vec![(4, 6)]);
    assert_eq!(p.append(data(9, 0, 4, 1, true)).unwrap().base_offset, 8);
    assert!(p.append(data(9, 0, 4, 1, true)).unwrap().duplicate);
    // The coordinator aborts with a bumped epoch: the old epoch is fenced.
    p.append_control(marker(9, 1, false)).unwrap();
    assert!(matches!(
        p.append(data(9, 0, 5, 1, true)),
        Err(AppendError::InvalidProducerEpoch { current: 1, got: 0 })
    ));
    assert!(matches!(
        p.append_control(marker(9, 0, true)),
        Err(AppendError::InvalidProducerEpoch { current: 1, got: 0 })
    ));
    assert!(matches!(
        p.append(data(9, 1, 5, 1, true)),
        Err(AppendError::OutOfOrderSequence {
            expected: 0,
            got: 5
        })
    ));
    assert_eq!(p.append(data(9, 1, 0, 1, true)).unwrap().base_offset, 10);
    assert_eq!(p.open_transactions(), vec![(4, 6), (9, 10)]);
    let before = (
        p.open_transactions(),
        p.producer_state(9),
        p.producer_state(4),
    );
    // A crash (no snapshot since the last roll) and a clean reopen both restore it.
    let image = backend.crash_image();
    drop(store);
    for b in [image, backend] {
        let store = open(&b);
        let p = store.partition("t", 0).unwrap();
        assert_eq!(
            (
                p.open_transactions(),
                p.producer_state(9),
                p.producer_state(4)
            ),
            before
        );
        assert_eq!(p.high_watermark(), 11);
        // The marker is in the log at its offset, as written.
        let got = p.read(7, 1).unwrap();
        assert_eq!(i64::from_be_bytes(got[..8].try_into().unwrap()), 7);
        assert_eq!(
            i16::from_be_bytes([got[21], got[22]]) & ATTR_CONTROL,
            ATTR_CONTROL
        );
    }
}

#[test]
fn last_stable_offset_and_read_committed() {
    let store = open(&MemBackend::new());
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    p.append(data(-1, -1, -1, 1, false)).unwrap(); // offset 0: visible at once
    assert_eq!(p.last_stable_offset(), 1);
    p.append(data(5, 0, 0, 2, true)).unwrap(); // 1..=2: open transaction of 5
    p.append(data(-1, -1, -1, 1, false)).unwrap(); // 3: held back behind it
    assert_eq!((p.last_stable_offset(), p.high_watermark()), (1, 4));
    let r = p.read_committed(0, usize::MAX).unwrap();
    assert_eq!(r.last_stable_offset, 1);
    assert_eq!(i64::from_be_bytes(r.records[..8].try_into().unwrap()), 0);
    assert_eq!(
        r.records.len(),
        p.read(0, 1).unwrap().len(),
        "only the batch below the LSO"
    );
    assert!(p.read_committed(1, usize::MAX).unwrap().records.is_empty());
    assert!(
        p.read_committed(5, 10).is_err(),
        "range is checked against the high watermark"
    );
    // Commit: everything up to the marker becomes stable, in offset order.
    p.append_marker(5, 0, true, 0, 10).unwrap(); // 4
    assert_eq!(p.last_stable_offset(), 5);
    let r = p.read_committed(1, usize::MAX).unwrap();
    assert_eq!(r.records, p.read(1, usize::MAX).unwrap());
    assert!(r.aborted.is_empty());
}

#[test]
fn aborted_index_is_persisted_and_rebuilt() {
    let backend = MemBackend::new();
    let store = open(&backend);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    p.append(data(1, 0, 0, 2, true)).unwrap(); // 0..=1 txn of 1
    p.append(data(2, 0, 0, 1, true)).unwrap(); // 2 txn of 2
    p.append_marker(1, 0, false, 3, 10).unwrap(); // 3 ABORT of 1
    let first = onceflow_broker::storage::AbortedTxn {
        producer_id: 1,
        first_offset: 0,
        last_offset: 3,
        last_stable_offset: 2,
    };
    assert_eq!(p.aborted_transactions(0, 10), vec![first]);
    assert_eq!(p.last_stable_offset(), 2);
    store.flush_all().unwrap(); // snapshot at 4: the entry above must be durable now
    p.append_marker(2, 0, false, 3, 10).unwrap(); // 4 ABORT of 2
    p.append_marker(2, 0, false, 3, 10).unwrap(); // 5: nothing open, no entry
    p.append(data(1, 0, 2, 1, true)).unwrap(); // 6 new txn of 1
    let second = onceflow_broker::storage::AbortedTxn {
        producer_id: 2,
        first_offset: 2,
        last_offset: 4,
        last_stable_offset: 5,
    };
    assert_eq!(p.aborted_transactions(0, 10), vec![first, second]);
    assert_eq!(p.aborted_transactions(4, 10), vec![second]);
    assert_eq!(p.aborted_transactions(0, 1), vec![first]);
    let r = p.read_committed(0, usize::MAX).unwrap();
    assert_eq!(r.last_stable_offset, 6);
    assert_eq!(r.aborted, vec![first, second]);
    let expected = (p.aborted_transactions(0, 100), p.last_stable_offset());
    let image = backend.crash_image();
    drop(store);
    // Crash image: the second entry was never fsynced; replay after the snapshot re-derives it.
    let store = open(&image);
    let p = store.partition("t", 0).unwrap();
    assert_eq!(
        (p.aborted_transactions(0, 100), p.last_stable_offset()),
        expected
    );
    drop(store);
    // A damaged index file is rebuilt from the whole log.
    let path = Path::new("/txn/t-0/aborted.txnindex");
    let mut bytes = image.read_file(path).unwrap().unwrap();
    bytes[10] ^= 0xff;
    image.write_file_atomic(path, &bytes).unwrap();
    let store = open(&image);
    let p = store.partition("t", 0).unwrap();
    assert_eq!(
        (p.aborted_transactions(0, 100), p.last_stable_offset()),
        expected
    );
    drop(store);
    image.remove_file(path).unwrap();
    let store = open(&image);
    let p = store.partition("t", 0).unwrap();
    assert_eq!(
        (p.aborted_transactions(0, 100), p.last_stable_offset()),
        expected
    );
}
