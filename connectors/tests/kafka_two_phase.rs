//! The two-phase-commit KafkaSink against the in-process broker: pre-committed output is
//! invisible to read_committed until commit; recovery commits a crashed sink's pre-committed
//! transaction exactly once (also when recovery runs twice); recovery of an aborted
//! transaction fails loudly naming the checkpoint; a too short transaction timeout is refused;
//! the next checkpoint's records are written while a pre-commit drains.

use std::time::Duration;

use onceflow_connectors::kafka::security::ClientSecurity;
use onceflow_connectors::kafka::{committer, KafkaPending, KafkaSink, KafkaSinkConfig, SinkRecord};
use onceflow_runtime::{PreCommit, Sink, SinkFactory};
use onceflow_testkit::clients::read_committed_values;
use onceflow_testkit::inproc::{start_broker, subtask_info};

fn records(from: usize, n: usize) -> Vec<SinkRecord> {
    (from..from + n)
        .map(|i| {
            SinkRecord::new(
                Some(format!("k{}", i % 3).into_bytes()),
                format!("r{i}").into_bytes(),
            )
        })
        .collect()
}

fn sink(brokers: &str, topic: &str, prefix: &str) -> KafkaSink {
    KafkaSink::new(
        KafkaSinkConfig::new(brokers, topic)
            .transactional_id_prefix(prefix)
            .transaction_timeout(Duration::from_secs(60))
            .checkpoint_interval(Duration::from_secs(1))
            .recovery_allowance(Duration::from_secs(10)),
    )
    // these tests drive one sink directly; no second instance of a job ever starts
    .without_seal()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_until_commit() {
    let b = start_broker(2).await;
    let brokers = b.bootstrap_servers();
    let factory = sink(&brokers, "out1", "t1");
    let mut w = factory.create(&subtask_info(0, 1, 0)).expect("create");
    w.recover(Vec::new()).await.expect("recover");
    w.write_batch(records(0, 50)).await.expect("write");
    let p = w.pre_commit(1).await.expect("pre_commit").expect("pending");
    let KafkaPending::TwoPhase(tp) = &p else {
        panic!("mode")
    };
    let t = tp.txn.as_ref().expect("a transaction");
    assert_eq!(t.records, 50);
    assert!(t.producer_id >= 0 && t.epoch >= 0);
    // written after the barrier: belongs to the next transaction
    w.write_batch(records(50, 10)).await.expect("write");
    assert!(
        read_committed_values(&brokers, "out1").is_empty(),
        "visible before commit"
    );
    w.commit(1, p).await.expect("commit");
    let seen = read_committed_values(&brokers, "out1");
    assert_eq!(seen.len(), 50, "exactly checkpoint 1's records");
    let p2 = w.pre_commit(2).await.expect("pre_commit").expect("pending");
    w.commit(2, p2).await.expect("commit");
    assert_eq!(read_committed_values(&brokers, "out1").len(), 60);
    b.shutdown().await;
}

fn txn_of(p: &KafkaPending) -> onceflow_connectors::kafka::sink::TxnHandle {
    let KafkaPending::TwoPhase(tp) = p else {
        panic!("mode")
    };
    tp.txn.clone().expect("a transaction")
}

/// Records of one key (`i % 3`) are in one partition: read in offset order, their numbers
/// must rise (the next transaction's records never overtake a draining one's).
fn assert_in_key_order(seen: &[String]) {
    let mut last: [Option<usize>; 3] = [None; 3];
    for v in seen {
        let i: usize = v[1..].parse().expect("r<number>");
        if let Some(prev) = last[i % 3] {
            assert!(prev < i, "key k{}: r{i} after r{prev}", i % 3);
        }
        last[i % 3] = Some(i);
    }
}

fn values(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("r{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_records_are_written_while_a_pre_commit_drains() {
    let b = start_broker(2).await;
    let brokers = b.bootstrap_servers();
    let factory = sink(&brokers, "out-drain", "td");
    let mut w = factory.create(&subtask_info(0, 1, 0)).expect("create");
    w.recover(Vec::new()).await.expect("recover");
    // nothing written: nothing to drain, no transaction to name
    match w.start_pre_commit(1).await.expect("start 1") {
        PreCommit::Done(Some(KafkaPending::TwoPhase(tp))) => assert!(tp.txn.is_none(), "{tp:?}"),
        other => panic!("an empty pre-commit finishes at once: {other:?}"),
    }
    w.write_batch(records(0, 500)).await.expect("write");
    let PreCommit::Flushing(done) = w.start_pre_commit(2).await.expect("start 2") else {
        panic!("a pre-commit with records drains in the background");
    };
    // written while checkpoint 2's transaction drains: the next transaction's records
    w.write_batch(records(500, 100))
        .await
        .expect("write while draining");
    done.await;
    let p2 = w
        .finish_pre_commit(2)
        .await
        .expect("finish 2")
        .expect("pending");
    let t2 = txn_of(&p2);
    assert_eq!(t2.records, 500);
    let PreCommit::Flushing(done) = w.start_pre_commit(3).await.expect("start 3") else {
        panic!("records were written since checkpoint 2");
    };
    w.commit(2, p2).await.expect("commit 2");
    let mut seen = read_committed_values(&brokers, "out-drain");
    seen.sort();
    let mut want = values(0, 500);
    want.sort();
    assert_eq!(seen, want, "exactly checkpoint 2's records");
    done.await;
    let p3 = w
        .finish_pre_commit(3)
        .await
        .expect("finish 3")
        .expect("pending");
    let t3 = txn_of(&p3);
    assert_eq!(t3.records, 100);
    assert_ne!(
        t3.transactional_id, t2.transactional_id,
        "another slot of the ring"
    );
    w.commit(3, p3).await.expect("commit 3");
    // the last commit has no next transaction to overlap with: done when commit returns
    let seen = read_committed_values(&brokers, "out-drain");
    assert_in_key_order(&seen);
    let mut seen = seen;
    seen.sort();
    let mut want = values(0, 600);
    want.sort();
    assert_eq!(seen, want, "every record once");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_commits_a_crashed_sinks_transaction_once() {
    let b = start_broker(2).await;
    let brokers = b.bootstrap_servers();
    let factory = sink(&brokers, "out2", "t2");
    let mut w = factory.create(&subtask_info(0, 1, 0)).expect("create");
    w.recover(Vec::new()).await.expect("recover");
    w.write_batch(records(0, 40)).await.expect("write");
    let p = w.pre_commit(1).await.expect("pre_commit").expect("pending");
    // more output after the barrier that must never become visible
    w.write_batch(records(1000, 5)).await.expect("write");
    w.pre_commit(2)
        .await
        .expect("pre_commit 2 (checkpoint 2 never completes)");
    w.write_batch(records(2000, 5)).await.expect("write");
    drop(w); // crash: checkpoint 1 complete, commit never ran

    // restart from checkpoint 1 (a new factory, as in a new process)
    let factory = sink(&brokers, "out2", "t2");
    let mut r = factory.create(&subtask_info(0, 1, 1)).expect("create");
    r.recover(vec![p.clone()]).await.expect("recovery commit");
    let seen = read_committed_values(&brokers, "out2");
    assert_eq!(
        seen.len(),
        40,
        "checkpoint 1's output once, nothing of the open transactions: {seen:?}"
    );
    drop(r);
    // crash again before any new checkpoint: recovery of the same checkpoint is idempotent
    let factory = sink(&brokers, "out2", "t2");
    let mut r = factory.create(&subtask_info(0, 1, 1)).expect("create");
    r.recover(vec![p]).await.expect("second recovery");
    r.write_batch(records(40, 10)).await.expect("write");
    let p3 = r.pre_commit(3).await.expect("pre_commit").expect("pending");
    r.commit(3, p3).await.expect("commit");
    let seen = read_committed_values(&brokers, "out2");
    assert_eq!(seen.len(), 50);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fences_a_live_zombie_and_aborts_its_open_transaction() {
    let b = start_broker(2).await;
    let brokers = b.bootstrap_servers();
    let factory = sink(&brokers, "out-zombie", "tz");
    let mut zombie = factory.create(&subtask_info(0, 1, 0)).expect("create");
    zombie.recover(Vec::new()).await.expect("recover");
    // two checkpoints, so that every slot of the zombie's ring has its producer (a producer
    // still being made when the ring is fenced would keep the test's runtime waiting for it)
    for (checkpoint, from) in [(1, 0), (2, 30)] {
        zombie.write_batch(records(from, 30)).await.expect("write");
        let p = zombie
            .pre_commit(checkpoint)
            .await
            .expect("pre_commit")
            .expect("pending");
        zombie.commit(checkpoint, p).await.expect("commit");
    }
    // the zombie goes on writing: an open transaction when its successor starts
    zombie.write_batch(records(1000, 20)).await.expect("write");

    // the successor restores checkpoint 2 and fences the ring (the zombie stays alive)
    let factory = sink(&brokers, "out-zombie", "tz");
    let mut next = factory.create(&subtask_info(0, 1, 2)).expect("create");
    next.recover(Vec::new())
        .await
        .expect("recover fences the ring");

    // the zombie can no longer finish its transaction; librdkafka reports the fencing in
    // whichever call meets it first (the epoch error of a delivery, or the purge of its queue
    // that follows), so only the refusal is checked
    let finished = async {
        let p = zombie.pre_commit(3).await?;
        match p {
            Some(p) => zombie.commit(3, p).await,
            None => Ok(()),
        }
    };
    finished
        .await
        .expect_err("a fenced zombie must not complete its transaction");
    next.write_batch(records(60, 10)).await.expect("write");
    let p3 = next
        .pre_commit(3)
        .await
        .expect("pre_commit")
        .expect("pending");
    next.commit(3, p3).await.expect("commit");
    let mut got = read_committed_values(&brokers, "out-zombie");
    got.sort_by_key(|v| v[1..].parse::<u32>().unwrap_or(u32::MAX));
    let expected: Vec<String> = (0..70).map(|i| format!("r{i}")).collect();
    assert_eq!(
        got, expected,
        "the zombie's open transaction must stay invisible"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_of_an_aborted_transaction_fails_loudly() {
    let b = start_broker(1).await;
    let brokers = b.bootstrap_servers();
    let factory = sink(&brokers, "out3", "t3");
    let mut w = factory.create(&subtask_info(0, 1, 0)).expect("create");
    w.recover(Vec::new()).await.expect("recover");
    w.write_batch(records(0, 10)).await.expect("write");
    let p = w.pre_commit(7).await.expect("pre_commit").expect("pending");
    let KafkaPending::TwoPhase(tp) = &p else {
        panic!("mode")
    };
    let t = tp.txn.clone().expect("txn");
    drop(w);
    // the broker aborts it (as a transaction timeout would)
    let code = committer::end_txn_once(
        &brokers,
        &ClientSecurity::plaintext(),
        &t.transactional_id,
        t.producer_id,
        t.epoch,
        false,
    )
    .await
    .expect("EndTxn abort");
    assert_eq!(code, 0);
    let factory = sink(&brokers, "out3", "t3");
    let mut r = factory.create(&subtask_info(0, 1, 7)).expect("create");
    let err = r.recover(vec![p]).await.expect_err("must fail").to_string();
    assert!(err.contains("DATA LOSS"), "{err}");
    assert!(err.contains("checkpoint 7"), "{err}");
    assert!(read_committed_values(&brokers, "out3").is_empty());
    b.shutdown().await;
}

#[test]
fn a_timeout_shorter_than_the_interval_is_refused() {
    let factory = KafkaSink::new(
        KafkaSinkConfig::new("127.0.0.1:1", "x")
            .transaction_timeout(Duration::from_millis(500))
            .checkpoint_interval(Duration::from_secs(1)),
    );
    let err = factory
        .create(&subtask_info(0, 1, 0))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("must exceed checkpoint interval"), "{err}");
    assert!(err.contains("raise --transaction-timeout-ms"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_committer_tries_every_bootstrap_server() {
    let b = start_broker(1).await;
    let brokers = b.bootstrap_servers();
    // port 1 on loopback refuses connections: a dead first server
    let dead = "127.0.0.1:1";
    let with_dead_first = format!("{dead},{brokers}");
    let coordinator =
        committer::find_txn_coordinator(&with_dead_first, &ClientSecurity::plaintext(), "t-any")
            .await
            .expect("the second server answers");
    assert!(coordinator.is_ok(), "{coordinator:?}");
    let max =
        committer::broker_max_transaction_timeout(&with_dead_first, &ClientSecurity::plaintext())
            .await
            .expect("the second server answers");
    assert!(max.is_some());
    let err = committer::broker_max_transaction_timeout(dead, &ClientSecurity::plaintext())
        .await
        .expect_err("no server reachable");
    assert!(err.to_string().contains(dead), "{err}");
    b.shutdown().await;
}

#[test]
fn two_phase_commit_without_a_seal_decision_is_refused() {
    let factory = KafkaSink::new(KafkaSinkConfig::new("127.0.0.1:1", "x"));
    let err = factory
        .create(&subtask_info(0, 1, 0))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("needs its checkpoints sealed"), "{err}");
    assert!(err.contains("KafkaJob"), "{err}");
    assert!(KafkaSink::new(KafkaSinkConfig::new("127.0.0.1:1", "x"))
        .without_seal()
        .create(&subtask_info(0, 1, 0))
        .is_ok());
}
