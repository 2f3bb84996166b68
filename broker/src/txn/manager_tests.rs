//! What a transactional Produce request waits for: neither the coordinator's lock (held
//! through transaction-log fsyncs) nor a marker's fsync on its partition.

use std::path::Path;
use std::sync::mpsc;

use super::*;
use crate::storage::batch::{encode_batch, BatchSpec, RecordSpec, ATTR_TRANSACTIONAL};
use crate::storage::{FsyncPolicy, MemBackend, StorageConfig};
use crate::txn::CountingProducerIds;

/// A cap on waits that only a deadlock reaches.
const STUCK: Duration = Duration::from_secs(30);

fn manager(backend: &MemBackend) -> Arc<TxnManager> {
    manager_in(backend, None)
}

/// A manager on `backend`'s store (topic `t` created if missing) whose transaction log is in
/// `txn_dir` (in memory if `None`).
fn manager_in(backend: &MemBackend, txn_dir: Option<&Path>) -> Arc<TxnManager> {
    let config = StorageConfig {
        data_dir: None,
        fsync: FsyncPolicy::EveryBatch,
        ..StorageConfig::default()
    };
    let store =
        Store::open_with_backend(config, Arc::new(backend.clone()), Path::new("/txn")).unwrap();
    if store.partition("t", 0).is_none() {
        store.create_topic("t", 1).unwrap();
    }
    TxnManager::open(
        store,
        TxnConfig {
            data_dir: txn_dir.map(Path::to_path_buf),
            coordinator: CoordinatorConfig::default(),
            marker_delay: Duration::ZERO,
            repair_corrupt_logs: false,
        },
        Arc::new(CountingProducerIds::default()),
    )
    .unwrap()
}

/// A producer of `id` with partition t-0 added to its open transaction.
fn open_txn(m: &TxnManager, id: &str) -> (i64, i16) {
    let (pid, epoch) = m.init_producer_id(id, 60_000, None).unwrap().unwrap();
    m.add_partitions(id, pid, epoch, &[("t".to_string(), 0)])
        .unwrap()
        .unwrap();
    (pid, epoch)
}

fn batch(pid: i64, epoch: i16, seq: i32) -> Bytes {
    encode_batch(
        BatchSpec {
            attributes: ATTR_TRANSACTIONAL,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            timestamp: 1,
            value: Some(b"v"),
            ..RecordSpec::default()
        }],
    )
    .freeze()
}

/// Runs `f` on a thread; its result, or `None` if it had not returned after [`STUCK`].
fn within_stuck<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(STUCK).ok()
}

#[test]
fn a_transactional_produce_does_not_take_the_coordinator_lock() {
    let m = manager(&MemBackend::new());
    let (pid, epoch) = open_txn(&m, "a");
    let partition = m.store.partition("t", 0).unwrap();
    // the coordinator busy with another transaction (as through a transaction-log fsync)
    let busy = m.coordinator();
    let written = {
        let (m, partition) = (Arc::clone(&m), Arc::clone(&partition));
        within_stuck(move || {
            let produced = ProducedBatches::parse(batch(pid, epoch, 0)).unwrap();
            m.append_produced_unsynced(&partition, Some("a"), &produced)
                .map(|p| p.outcome.base_offset)
        })
    };
    drop(busy);
    assert_eq!(
        written
            .expect("the produce waited for the coordinator's lock")
            .unwrap(),
        0
    );
    // and the checks still hold: a fenced epoch and a partition outside the transaction
    let refused = m.append(&partition, Some("a"), batch(pid, epoch + 1, 1));
    assert!(matches!(
        refused,
        Err(TxnProduceError::Refused(
            ResponseError::InvalidProducerEpoch
        ))
    ));
}

#[test]
fn a_marker_fsync_does_not_hold_up_produce_to_its_partition() {
    let backend = MemBackend::new();
    let m = manager(&backend);
    let partition = m.store.partition("t", 0).unwrap();
    let (a, a_epoch) = open_txn(&m, "a");
    let (b, b_epoch) = open_txn(&m, "b");
    m.append(&partition, Some("a"), batch(a, a_epoch, 0))
        .unwrap();
    m.append(&partition, Some("b"), batch(b, b_epoch, 0))
        .unwrap();

    // a's commit writes its marker and waits in the marker's fsync
    backend.hold_syncs();
    let committing = {
        let m = Arc::clone(&m);
        std::thread::spawn(move || m.end_txn("a", a, a_epoch, true))
    };
    assert!(
        backend.wait_for_held_syncs(1, STUCK),
        "the commit never reached the marker's fsync"
    );
    assert!(
        partition
            .producer_state(a)
            .is_some_and(|e| e.txn_first_offset.is_none()),
        "the held fsync is not the marker's"
    );

    // b's next batch is written (ordered after the marker) while that fsync is held
    let written = {
        let (m, partition) = (Arc::clone(&m), Arc::clone(&partition));
        within_stuck(move || {
            let produced = ProducedBatches::parse(batch(b, b_epoch, 1)).unwrap();
            m.append_produced_unsynced(&partition, Some("b"), &produced)
        })
    };
    backend.release_syncs();
    let pending = written
        .expect("the produce waited for the marker's fsync")
        .unwrap();
    assert_eq!(
        pending.outcome.base_offset, 3,
        "data a, data b, marker a, data b"
    );
    assert!(partition.finish(pending).is_ok());
    assert_eq!(committing.join().unwrap().unwrap(), Ok(()));
    assert_eq!(
        m.describe("a").unwrap().state,
        crate::txn::TxnState::CompleteCommit
    );
    // the marker and b's batch are durable, b's transaction still open
    assert_eq!(partition.high_watermark(), 4);
    assert_eq!(partition.last_stable_offset(), 1);
}

#[test]
fn a_lost_complete_commit_is_completed_again_without_a_second_marker() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MemBackend::new();
    let m = manager_in(&backend, Some(dir.path()));
    let (a, epoch) = open_txn(&m, "a");
    let partition = m.store.partition("t", 0).unwrap();
    m.append(&partition, Some("a"), batch(a, epoch, 0)).unwrap();
    assert_eq!(m.end_txn("a", a, epoch, true).unwrap(), Ok(()));
    assert_eq!(
        m.describe("a").unwrap().state,
        crate::txn::TxnState::CompleteCommit
    );
    assert_eq!(
        partition.high_watermark(),
        2,
        "data and its marker, durable"
    );
    drop((partition, m));

    // a crash before the kernel wrote CompleteCommit (appended last, without an fsync of its
    // own): its record is torn
    let log = dir.path().join(TXN_DIR).join(super::super::log::LOG_FILE);
    let len = std::fs::metadata(&log).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let m = manager_in(&backend.crash_image(), Some(dir.path()));
    assert_eq!(
        m.describe("a").unwrap().state,
        crate::txn::TxnState::PrepareCommit
    );
    m.complete_pending();
    assert_eq!(
        m.describe("a").unwrap().state,
        crate::txn::TxnState::CompleteCommit
    );
    let partition = m.store.partition("t", 0).unwrap();
    assert_eq!(partition.high_watermark(), 2, "no second marker");
    assert_eq!(partition.last_stable_offset(), 2);
}
