//! Storage side of transactions: transactional batches open a producer's transaction on the
//! partition, control batches (markers) appended through `append_control` close it, skip
//! sequence checks, fence older epochs and survive reopen with or without snapshots.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use onceflow_broker::storage::batch::{
    encode_batch, BatchSpec, RecordSpec, ATTR_CONTROL, ATTR_TRANSACTIONAL,
};
use onceflow_broker::storage::{AppendError, FsyncPolicy, MemBackend, StorageConfig, Store};

fn open(backend: &MemBackend) -> Store {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes: 400,
        fsync: FsyncPolicy::EveryBatch,
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
