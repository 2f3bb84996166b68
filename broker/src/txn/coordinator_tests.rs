//! Unit tests of the coordinator state machine (in-memory log).

use super::*;

fn coordinator() -> Coordinator {
    Coordinator::open(
        CoordinatorConfig {
            max_transaction_timeout_ms: 10_000,
            transactional_id_expiration_ms: 100_000,
        },
        TxnLog::in_memory(),
        LogImage {
            coordinator_epoch: -1,
            ..LogImage::default()
        },
        Arc::new(CountingProducerIds::default()),
    )
    .expect("open")
}

fn tp(t: &str, p: i32) -> TopicPartition {
    (t.to_string(), p)
}

#[test]
fn commit_flow_and_retried_end_txn() {
    let mut c = coordinator();
    let (pid, epoch) = c
        .init_producer_id("t", 5000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    assert_eq!(epoch, 0);
    assert_eq!(
        c.check_produce("t", pid, epoch, "a", 0),
        Err(ResponseError::InvalidTxnState)
    );
    c.add_to_txn("t", pid, epoch, &[tp("a", 0), tp("b", 1)], &[], 10)
        .unwrap()
        .unwrap();
    assert_eq!(c.check_produce("t", pid, epoch, "a", 0), Ok(()));
    assert_eq!(
        c.check_produce("t", pid, epoch, "a", 1),
        Err(ResponseError::InvalidTxnState)
    );
    let step = c.end_txn("t", pid, epoch, true, 20).unwrap();
    assert_eq!(step.answer, Ok(()));
    let job = step.job.expect("markers");
    assert_eq!(job.kind, MarkerKind::Commit);
    assert_eq!(job.partitions, vec![tp("a", 0), tp("b", 1)]);
    // While markers are written the transaction is busy.
    assert_eq!(
        c.add_to_txn("t", pid, epoch, &[tp("a", 0)], &[], 21)
            .unwrap(),
        Err(ResponseError::ConcurrentTransactions)
    );
    assert_eq!(c.pending_jobs(), vec![job.clone()]);
    assert_eq!(c.complete(&job, 30).unwrap(), Some(20));
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteCommit);
    // A retried EndTxn after completion answers success; the opposite is refused.
    assert_eq!(c.end_txn("t", pid, epoch, true, 31).unwrap().answer, Ok(()));
    assert_eq!(
        c.end_txn("t", pid, epoch, false, 31).unwrap().answer,
        Err(ResponseError::InvalidTxnState)
    );
}

#[test]
fn new_producer_fences_the_open_transaction() {
    let mut c = coordinator();
    let (pid, e0) = c
        .init_producer_id("t", 5000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    c.add_to_txn("t", pid, e0, &[tp("a", 0)], &[], 1)
        .unwrap()
        .unwrap();
    let step = c.init_producer_id("t", 5000, None, 2).unwrap();
    assert_eq!(step.answer, Err(ResponseError::ConcurrentTransactions));
    let job = step.job.expect("abort markers");
    assert_eq!((job.kind, job.producer_epoch), (MarkerKind::Abort, e0 + 1));
    // The old producer is fenced at once.
    assert_eq!(
        c.check_produce("t", pid, e0, "a", 0),
        Err(ResponseError::InvalidProducerEpoch)
    );
    assert_eq!(
        c.end_txn("t", pid, e0, true, 3).unwrap().answer,
        Err(ResponseError::ProducerFenced)
    );
    c.complete(&job, 4).unwrap();
    let (pid2, e2) = c
        .init_producer_id("t", 5000, None, 5)
        .unwrap()
        .answer
        .unwrap();
    assert_eq!((pid2, e2), (pid, e0 + 2));
}

#[test]
fn timeout_aborts_and_fences_the_late_commit() {
    let mut c = coordinator();
    let (pid, e) = c
        .init_producer_id("t", 1000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    c.add_to_txn("t", pid, e, &[tp("a", 0)], &[], 100)
        .unwrap()
        .unwrap();
    assert!(c.expire(1100).unwrap().is_empty());
    let jobs = c.expire(1101).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].producer_epoch, e + 1);
    c.complete(&jobs[0], 1102).unwrap();
    assert_eq!(
        c.end_txn("t", pid, e, true, 1200).unwrap().answer,
        Err(ResponseError::ProducerFenced)
    );
}

#[test]
fn invalid_timeout_and_kip360_recovery() {
    let mut c = coordinator();
    assert_eq!(
        c.init_producer_id("t", 10_001, None, 0).unwrap().answer,
        Err(ResponseError::InvalidTransactionTimeout)
    );
    let (pid, e) = c
        .init_producer_id("t", 1000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    // Epoch-bump recovery with the current (pid, epoch).
    let (p1, e1) = c
        .init_producer_id("t", 1000, Some((pid, e)), 1)
        .unwrap()
        .answer
        .unwrap();
    assert_eq!((p1, e1), (pid, e + 1));
    // The same request retried (response lost) gets the same answer.
    assert_eq!(
        c.init_producer_id("t", 1000, Some((pid, e)), 2)
            .unwrap()
            .answer,
        Ok((pid, e + 1))
    );
    // A stale epoch is fenced.
    assert_eq!(
        c.init_producer_id("t", 1000, Some((pid, e + 7)), 3)
            .unwrap()
            .answer,
        Err(ResponseError::ProducerFenced)
    );
}

#[test]
fn producer_ids_are_unique_and_ids_expire() {
    let mut c = coordinator();
    let a = c.allocate_producer_id().unwrap();
    let (p, _) = c
        .init_producer_id("t", 1000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    assert_ne!(a, p);
    assert!(c.expire(100_001).unwrap().is_empty());
    assert!(c.get("t").is_none());
    assert!(c.transactional_id_of(p).is_none());
}

#[test]
fn offsets_need_add_offsets_first() {
    let mut c = coordinator();
    let (pid, e) = c
        .init_producer_id("t", 1000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    assert_eq!(
        c.check_offsets("t", pid, e, "g"),
        Err(ResponseError::InvalidTxnState)
    );
    c.add_to_txn("t", pid, e, &[], &["g".to_string()], 1)
        .unwrap()
        .unwrap();
    assert_eq!(c.check_offsets("t", pid, e, "g"), Ok(()));
    let job = c.end_txn("t", pid, e, true, 2).unwrap().job.unwrap();
    assert_eq!(job.groups, vec!["g".to_string()]);
}

#[test]
fn operator_abort_fences_and_aborts_every_partition() {
    let mut c = coordinator();
    let (pid, epoch) = c
        .init_producer_id("t", 5000, None, 0)
        .unwrap()
        .answer
        .unwrap();
    // Nothing open: nothing to abort, nothing claimed.
    assert_eq!(c.abort_by_admin(pid, epoch, 1).unwrap(), None);
    c.add_to_txn("t", pid, epoch, &[tp("a", 0), tp("b", 1)], &[], 10)
        .unwrap()
        .unwrap();
    assert_eq!(c.claims_partition(pid, "a", 0), Some(TxnState::Ongoing));
    assert_eq!(c.claims_partition(pid, "a", 1), None);
    assert_eq!(c.claims_partition(pid + 1, "a", 0), None);
    // Another epoch or producer id is not this coordinator's transaction.
    assert_eq!(c.abort_by_admin(pid, epoch + 1, 11).unwrap(), None);
    assert_eq!(c.abort_by_admin(pid + 1, epoch, 11).unwrap(), None);
    let job = c.abort_by_admin(pid, epoch, 12).unwrap().expect("markers");
    assert_eq!(job.kind, MarkerKind::Abort);
    assert_eq!(job.producer_epoch, epoch + 1, "the producer is fenced");
    assert_eq!(job.partitions, vec![tp("a", 0), tp("b", 1)]);
    assert_eq!(
        c.claims_partition(pid, "b", 1),
        Some(TxnState::PrepareAbort)
    );
    assert_eq!(
        c.check_produce("t", pid, epoch, "a", 0),
        Err(ResponseError::InvalidProducerEpoch)
    );
    assert_eq!(c.complete(&job, 13).unwrap(), Some(3));
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteAbort);
    assert_eq!(c.claims_partition(pid, "a", 0), None);
    assert_eq!(c.abort_by_admin(pid, epoch + 1, 14).unwrap(), None);
}
