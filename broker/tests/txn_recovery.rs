//! Recovery of the coordinator with the storage's transaction state from a durable data dir,
//! without a clean shutdown: open transactions, the LSO and the aborted-transaction index
//! are back, the open transaction can still be committed, and marker jobs are idempotent.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use onceflow_broker::storage::batch::{encode_batch, BatchSpec, RecordSpec, ATTR_TRANSACTIONAL};
use onceflow_broker::storage::{FsyncPolicy, StorageConfig, Store};
use onceflow_broker::txn::{
    CountingProducerIds, MarkerJob, MarkerKind, TxnConfig, TxnManager, TxnProduceError, TxnState,
};

fn open(dir: &std::path::Path) -> (Store, Arc<TxnManager>) {
    let store = Store::open(StorageConfig {
        data_dir: Some(dir.to_path_buf()),
        fsync: FsyncPolicy::EveryBatch,
        ..StorageConfig::default()
    })
    .expect("store");
    let mgr = TxnManager::open(
        store.clone(),
        TxnConfig {
            data_dir: Some(dir.to_path_buf()),
            ..TxnConfig::default()
        },
        Arc::new(CountingProducerIds::default()),
    )
    .expect("txn manager");
    mgr.complete_pending();
    (store, mgr)
}

fn txn_batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> Bytes {
    let recs: Vec<RecordSpec<'_>> = values
        .iter()
        .map(|v| RecordSpec {
            timestamp: 1,
            value: Some(v.as_bytes()),
            ..RecordSpec::default()
        })
        .collect();
    encode_batch(
        BatchSpec {
            attributes: ATTR_TRANSACTIONAL,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            ..BatchSpec::default()
        },
        &recs,
    )
    .freeze()
}

fn plain_batch(value: &str) -> Bytes {
    encode_batch(
        BatchSpec::default(),
        &[RecordSpec {
            timestamp: 1,
            value: Some(value.as_bytes()),
            ..RecordSpec::default()
        }],
    )
    .freeze()
}

#[test]
fn open_transactions_lso_and_aborted_index_survive_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tp = || vec![("t".to_string(), 0)];
    {
        let (store, mgr) = open(dir.path());
        store.create_topic("t", 1).expect("topic");
        let p = store.partition("t", 0).expect("partition");
        // Transaction a: aborted. Transaction b: open at the crash.
        let (pa, ea) = mgr.init_producer_id("a", 60_000, None).unwrap().unwrap();
        let (pb, eb) = mgr.init_producer_id("b", 60_000, None).unwrap().unwrap();
        mgr.add_partitions("a", pa, ea, &tp()).unwrap().unwrap();
        mgr.add_partitions("b", pb, eb, &tp()).unwrap().unwrap();
        mgr.append(&p, None, plain_batch("plain-0")).expect("plain"); // 0
                                                                      // A transactional batch for a partition not in the producer's transaction is refused.
        let (pc, ec) = mgr.init_producer_id("c", 60_000, None).unwrap().unwrap();
        assert!(matches!(
            mgr.append(&p, Some("c"), txn_batch(pc, ec, 0, &["c0"])),
            Err(TxnProduceError::Refused(ResponseError::InvalidTxnState))
        ));
        mgr.append(&p, Some("a"), txn_batch(pa, ea, 0, &["a0", "a1"]))
            .expect("a"); // 1..2
        mgr.append(&p, Some("b"), txn_batch(pb, eb, 0, &["b0"]))
            .expect("b"); // 3
        mgr.end_txn("a", pa, ea, false).unwrap().unwrap(); // abort marker at 4
        mgr.append(&p, None, plain_batch("plain-1")).expect("plain"); // 5
        assert_eq!(p.last_stable_offset(), 3);
        // Crash: dropped without snapshots.
    }
    let (store, mgr) = open(dir.path());
    let p = store.partition("t", 0).expect("partition");
    assert_eq!(p.high_watermark(), 6);
    assert_eq!(p.last_stable_offset(), 3, "b is still open");
    let read = p.read_committed(0, 1 << 20).expect("read");
    assert_eq!(read.last_stable_offset, 3);
    let aborted: Vec<(i64, i64, i64)> = read
        .aborted
        .iter()
        .map(|a| (a.producer_id, a.first_offset, a.last_offset))
        .collect();
    assert_eq!(aborted.len(), 1);
    assert_eq!((aborted[0].1, aborted[0].2), (1, 4));
    // b commits after the restart: the LSO moves to the high watermark.
    let b = mgr.describe("b").expect("b known");
    assert_eq!(b.state, TxnState::Ongoing);
    mgr.end_txn("b", b.producer_id, b.producer_epoch, true)
        .unwrap()
        .unwrap();
    assert_eq!(
        mgr.describe("b").expect("b").state,
        TxnState::CompleteCommit
    );
    assert_eq!(p.last_stable_offset(), p.high_watermark());
    // Running the same markers again (as recovery does) writes nothing more.
    let hw = p.high_watermark();
    let job = MarkerJob {
        transactional_id: "b".into(),
        producer_id: b.producer_id,
        producer_epoch: b.producer_epoch,
        coordinator_epoch: 0,
        kind: MarkerKind::Commit,
        partitions: tp(),
        groups: Vec::new(),
    };
    mgr.run_job(&job).expect("re-run");
    assert_eq!(p.high_watermark(), hw);
}

/// InitProducerId over an open transaction fences and aborts it, and answers with the new
/// epoch once the abort's markers are written, as the client's retry after
/// CONCURRENT_TRANSACTIONS would get it (librdkafka waits 500 ms before that retry).
#[test]
fn init_producer_id_over_an_open_transaction_answers_after_aborting_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, mgr) = open(dir.path());
    store.create_topic("t", 1).expect("topic");
    let p = store.partition("t", 0).expect("partition");
    let tp = vec![("t".to_string(), 0)];
    let (pid, epoch) = mgr.init_producer_id("f", 60_000, None).unwrap().unwrap();
    mgr.add_partitions("f", pid, epoch, &tp).unwrap().unwrap();
    mgr.append(&p, Some("f"), txn_batch(pid, epoch, 0, &["f0", "f1"]))
        .expect("open transaction"); // 0..1
    assert_eq!(p.last_stable_offset(), 0, "the transaction is open");

    // the fencing abort bumps the epoch once, the answer to the (implicit) retry once more
    let again = mgr.init_producer_id("f", 60_000, None).unwrap();
    assert_eq!(again, Ok((pid, epoch + 2)));
    let m = mgr.describe("f").expect("f known");
    assert_eq!(
        m.state,
        TxnState::Empty,
        "ready for the new producer's transactions"
    );
    assert_eq!(p.high_watermark(), 3, "two records and the abort marker");
    assert_eq!(p.last_stable_offset(), p.high_watermark());
    let read = p.read_committed(0, 1 << 20).expect("read");
    assert_eq!(read.aborted.len(), 1, "the open transaction was aborted");

    // the old epoch is fenced; the new one starts a transaction
    assert!(mgr.add_partitions("f", pid, epoch, &tp).unwrap().is_err());
    mgr.add_partitions("f", pid, epoch + 2, &tp)
        .unwrap()
        .unwrap();
}
