//! The hold-back of records written during a drain, checked against the in-process broker
//! behind a proxy that is paused, so that the drain is still running, by construction, when
//! the next checkpoint's records arrive.

use std::time::Duration;

use onceflow_broker::BrokerConfig;
use onceflow_testkit::clients::read_committed_values;
use onceflow_testkit::inproc::{start_with, subtask_info};
use onceflow_testkit::proxy::Proxy;

use super::super::{KafkaSink, SinkRecord};
use super::*;
use crate::kafka::config::KafkaSinkConfig;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_during_a_drain_wait_until_it_ended() {
    let mut proxy = Proxy::bind();
    let broker = start_with(BrokerConfig {
        default_partitions: 2,
        advertised_listener: Some(proxy.addr()),
        ..BrokerConfig::default()
    })
    .await;
    proxy.start(&broker.local_addr().to_string());
    let bootstrap = proxy.addr();
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(&bootstrap, "out-hold")
            .transactional_id_prefix("hold")
            .transaction_timeout(Duration::from_secs(60))
            .checkpoint_interval(Duration::from_secs(1))
            .recovery_allowance(Duration::from_secs(10)),
    )
    .without_seal();
    let mut w = TwoPhaseWriter::new(&sink, &subtask_info(0, 1, 0));
    w.recover(Vec::new()).await.expect("recover");
    // every producer of the ring is made before the network stalls
    for s in &mut w.slots {
        if let Some(h) = s.warming.take() {
            s.producer = Some(h.await.expect("join").expect("producer made ahead"));
        }
    }
    proxy.pause();
    w.write_batch(records(0, 300)).await.expect("write");
    let PreCommit::Flushing(done) = w.start_pre_commit(1).await.expect("start 1") else {
        panic!("a pre-commit with records drains in the background");
    };
    // the drain cannot end while the proxy holds its records: these belong to the next
    // transaction and must not be handed to its producer yet
    w.write_batch(records(300, 100))
        .await
        .expect("write while draining");
    assert_eq!(w.held.len(), 100, "held back during the drain");
    // nothing was handed to the next transaction's producer (`send_open` counts every record
    // it hands over; the producer's own queue length also counts its statistics events)
    let next = w.current.expect("the next transaction is open");
    assert!(
        matches!(w.slots[next].state, SlotState::Open { records: 0, .. }),
        "the next transaction's producer got records while the previous one drained"
    );
    proxy.resume();
    done.await;
    let p1 = w.finish_pre_commit(1).await.expect("finish 1");
    assert!(w.held.is_empty(), "the held records follow the drain");
    w.commit(1, p1).await.expect("commit 1");
    let p2 = w.pre_commit(2).await.expect("pre-commit 2");
    w.commit(2, p2).await.expect("commit 2");
    let seen = read_committed_values(&bootstrap, "out-hold");
    assert_eq!(seen.len(), 400, "every record once: {seen:?}");
    // one key's records are in one partition: in offset order their numbers rise
    let mut last: [Option<usize>; 3] = [None; 3];
    for v in &seen {
        let i: usize = v[1..].parse().expect("r<number>");
        if let Some(prev) = last[i % 3] {
            assert!(prev < i, "key k{}: r{i} after r{prev}", i % 3);
        }
        last[i % 3] = Some(i);
    }
    drop(proxy);
    broker.shutdown().await;
}

/// An abort may bump a producer's epoch, and a sink knows a producer's epoch only from its
/// init_transactions: the aborted slot's next transaction runs on a fresh producer, and its
/// pending names the epoch the recovery commit needs. Checked with the ids learned from the
/// coordinator (DescribeTransactions), from librdkafka's statistics, and from the statistics
/// after the cluster refused DescribeTransactions.
#[derive(Clone, Copy, PartialEq)]
enum Ids {
    Coordinator,
    Statistics,
    /// A proxy between the sink and the broker closes the connection on DescribeTransactions,
    /// as a Kafka before 3.0 does: the sink must fall back to the statistics.
    CoordinatorRefuses,
}

async fn slot_reused_after_an_abort(ids: Ids, tag: &str) {
    let mut proxy = Proxy::bind();
    let broker = start_with(BrokerConfig {
        default_partitions: 2,
        advertised_listener: (ids == Ids::CoordinatorRefuses).then(|| proxy.addr()),
        ..BrokerConfig::default()
    })
    .await;
    let bootstrap = if ids == Ids::CoordinatorRefuses {
        proxy.start(&broker.local_addr().to_string());
        // DescribeTransactions
        proxy.refuse_api(65);
        proxy.addr()
    } else {
        broker.local_addr().to_string()
    };
    let topic = format!("out-{tag}");
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(&bootstrap, &topic)
            .transactional_id_prefix(tag)
            .transaction_timeout(Duration::from_secs(60))
            .checkpoint_interval(Duration::from_secs(1))
            .recovery_allowance(Duration::from_secs(10)),
    )
    .without_seal();
    let mut w = TwoPhaseWriter::new(&sink, &subtask_info(0, 1, 0));
    w.ids_from_statistics
        .store(ids == Ids::Statistics, std::sync::atomic::Ordering::Relaxed);
    w.recover(Vec::new()).await.expect("recover");
    w.write_batch(records(0, 50)).await.expect("write 1");
    let p1 = w.pre_commit(1).await.expect("pre-commit 1");
    let KafkaPending::TwoPhase(TwoPhasePending { txn: Some(h1), .. }) = &p1 else {
        panic!("checkpoint 1 pre-committed a transaction: {p1:?}");
    };
    let h1 = h1.clone();
    w.abort(p1).await.expect("abort 1");
    w.write_batch(records(50, 50)).await.expect("write 2");
    let p2 = w.pre_commit(2).await.expect("pre-commit 2");
    w.write_batch(records(100, 50)).await.expect("write 3");
    let p3 = w.pre_commit(3).await.expect("pre-commit 3");
    let KafkaPending::TwoPhase(TwoPhasePending { txn: Some(h3), .. }) = &p3 else {
        panic!("checkpoint 3 pre-committed a transaction: {p3:?}");
    };
    assert_eq!(
        h3.transactional_id, h1.transactional_id,
        "the aborted slot is the next free one"
    );
    assert!(
        h3.epoch > h1.epoch,
        "a fresh producer's init_transactions bumps the epoch: {h1:?} then {h3:?}"
    );
    assert_eq!(
        w.ids_from_statistics
            .load(std::sync::atomic::Ordering::Relaxed),
        ids != Ids::Coordinator,
        "the statistics are used exactly when DescribeTransactions is not answered"
    );
    // a restart from checkpoint 3: the recovery commits 2 and 3 with the recorded ids (a
    // stale epoch would be refused as fenced, and the job would fail with data loss)
    drop(w);
    let mut w = TwoPhaseWriter::new(&sink, &subtask_info(0, 1, 3));
    w.recover(vec![p2, p3])
        .await
        .expect("recovery commits 2 and 3");
    let mut seen = read_committed_values(&bootstrap, &topic);
    seen.sort();
    let mut want: Vec<String> = (50..150).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(seen, want, "checkpoints 2 and 3 once, the aborted 1 never");
    drop(w);
    drop(proxy);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reused_after_an_abort_records_the_epoch_recovery_commits_with() {
    slot_reused_after_an_abort(Ids::Coordinator, "reuse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ids_from_statistics_a_reused_slot_records_the_epoch_recovery_commits_with() {
    slot_reused_after_an_abort(Ids::Statistics, "reuse-stats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_describe_transactions_the_sink_learns_ids_from_the_statistics() {
    slot_reused_after_an_abort(Ids::CoordinatorRefuses, "reuse-refused").await;
}

/// The coordinator's answer to DescribeTransactions right after init_transactions is what
/// librdkafka's statistics report for the producer, and a later init_transactions of the id
/// (a fencing one) moves it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_transactions_names_the_ids_the_statistics_report() {
    let broker = start_with(BrokerConfig::default()).await;
    let bootstrap = broker.local_addr().to_string();
    let cfg = KafkaSinkConfig::new(&bootstrap, "out-describe")
        .transactional_id_prefix("describe")
        .transaction_timeout(Duration::from_secs(60));
    let security = ClientSecurity::default();
    let learn = producer::Kind::Transactional {
        id: "describe-0-0",
        learn_ids: true,
    };
    let mut seen = Vec::new();
    let mut producers = Vec::new();
    for _ in 0..2 {
        let (p, ctx) = producer::create(&cfg, learn).expect("producer");
        let c = cfg.clone();
        let (p, from_stats) = tokio::task::spawn_blocking(move || {
            let ids = producer::init_and_learn(
                &p,
                &ctx,
                "describe-0-0",
                &c.default_topic,
                TXN_CALL_TIMEOUT,
            );
            (p, ids)
        })
        .await
        .expect("join");
        let from_stats = from_stats.expect("ids from the statistics");
        let described = committer::describe_producer(
            &bootstrap,
            &security,
            "describe-0-0",
            Duration::from_secs(10),
        )
        .await
        .expect("DescribeTransactions");
        assert_eq!(described, from_stats, "coordinator and librdkafka agree");
        seen.push(described);
        producers.push(p);
    }
    assert_eq!(seen[1].0, seen[0].0, "one producer id per transactional id");
    assert!(
        seen[1].1 > seen[0].1,
        "the second init bumped the epoch: {seen:?}"
    );
    let unknown =
        committer::describe_producer(&bootstrap, &security, "never-used", Duration::from_secs(2))
            .await;
    assert!(unknown.is_err(), "an unknown id has no ids: {unknown:?}");
    tokio::task::spawn_blocking(move || drop(producers))
        .await
        .expect("join");
    broker.shutdown().await;
}

/// A commit that failed at completion is retried by the next pre-commit while the runtime
/// still holds its pending, so the next checkpoint's snapshot names the transaction again.
/// Its slot must not be reused until a checkpoint whose snapshot does not name it completed:
/// a recovery from that snapshot sends EndTxn(commit) with the recorded producer id and
/// epoch, which on a reused slot (same producer, same epoch) commits the slot's later,
/// partial transaction, and the replay writes those records a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_a_restorable_checkpoint_names_is_not_reused() {
    let broker = start_with(BrokerConfig {
        default_partitions: 2,
        ..BrokerConfig::default()
    })
    .await;
    let bootstrap = broker.local_addr().to_string();
    let topic = "out-named";
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(&bootstrap, topic)
            .transactional_id_prefix("named")
            .transaction_timeout(Duration::from_secs(60))
            .checkpoint_interval(Duration::from_secs(1))
            .recovery_allowance(Duration::from_secs(10)),
    )
    .without_seal();
    let mut w = TwoPhaseWriter::new(&sink, &subtask_info(0, 1, 0));
    w.recover(Vec::new()).await.expect("recover");
    // checkpoint 1 completes, and its commit fails with a retriable error: the runtime keeps
    // its pending for the next snapshot and the next completion
    w.write_batch(records(0, 50)).await.expect("write 1");
    let p1 = w.pre_commit(1).await.expect("pre-commit 1");
    w.inject_commit_failures = 1;
    w.commit(1, p1.clone())
        .await
        .expect_err("the injected commit failure");
    // pre-commit 2 commits 1 on its retry; checkpoint 2's snapshot still lists 1
    w.write_batch(records(50, 50)).await.expect("write 2");
    let p2 = w.pre_commit(2).await.expect("pre-commit 2");
    let snapshot_2 = vec![p1.clone(), p2.clone()];
    // checkpoint 2 completes: the runtime commits 1 (again) and 2
    w.commit(1, p1).await.expect("commit 1 once more");
    w.commit(2, p2).await.expect("commit 2");
    // checkpoint 3's transaction is sealed, and the next one gets records
    w.write_batch(records(100, 50)).await.expect("write 3");
    let p3 = w.pre_commit(3).await.expect("pre-commit 3");
    let KafkaPending::TwoPhase(TwoPhasePending { ring_slots, .. }) = &p3 else {
        panic!("a two-phase pending: {p3:?}");
    };
    assert!(
        *ring_slots > 3,
        "the ring grew instead of reusing a named slot: {p3:?}"
    );
    w.write_batch(records(150, 50)).await.expect("write 4");
    // those records reach the broker, in the open transaction
    let open = w.current.expect("an open transaction");
    let (p, _, _) = w.slots[open].producer.clone().expect("its producer");
    tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(10)))
        .await
        .expect("join")
        .expect("flush");
    // the process dies here: nothing is cleaned up, its open transactions stay open
    std::mem::forget(w);
    let mut w = TwoPhaseWriter::new(&sink, &subtask_info(0, 1, 2));
    w.recover(snapshot_2)
        .await
        .expect("recovery from checkpoint 2");
    let mut seen = read_committed_values(&bootstrap, topic);
    seen.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(
        seen, want,
        "checkpoints 1 and 2 once; nothing written after checkpoint 2"
    );
    drop(w);
    broker.shutdown().await;
}
