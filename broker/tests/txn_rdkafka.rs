//! Transactions end to end over TCP with rdkafka (librdkafka): commit and abort across
//! several partitions of two topics, the LSO experiment from the seed documents, fencing,
//! timeouts and a late commit.

use std::time::Duration;

use onceflow_testkit::clients::*;
use onceflow_testkit::inproc::{start_broker, start_with};
use rdkafka::producer::Producer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_visible_aborted_invisible_offsets_not_reused() {
    let broker = start_broker(2).await;
    let bs = broker.bootstrap_servers();
    let parts = [("txa", 0), ("txa", 1), ("txb", 0)];
    let got = tokio::task::spawn_blocking(move || {
        let p = txn_producer(&bs, "tx-commit-abort", 30_000);
        for (round, commit) in [("c1", true), ("a2", false), ("c3", true)] {
            p.begin_transaction().expect("begin");
            for (t, part) in parts {
                for i in 0..3 {
                    send(&p, t, part, &format!("{round}-{t}-{part}-{i}"));
                }
            }
            flush(&p);
            if commit {
                p.commit_transaction(T).expect("commit");
            } else {
                p.abort_transaction(T).expect("abort");
            }
        }
        let rc = consumer(&bs, true, &parts);
        let committed = poll_records(&rc, 18, Duration::from_millis(700));
        let ru = consumer(&bs, false, &parts);
        let uncommitted = poll_records(&ru, 27, Duration::from_millis(700));
        (committed, uncommitted)
    })
    .await
    .expect("client thread");
    let (committed, uncommitted) = got;
    let cv = values(&committed);
    assert_eq!(cv.len(), 18, "read_committed got {cv:?}");
    assert!(
        cv.iter()
            .all(|v| v.starts_with("c1") || v.starts_with("c3")),
        "{cv:?}"
    );
    assert_eq!(
        uncommitted.len(),
        27,
        "read_uncommitted got {:?}",
        values(&uncommitted)
    );
    assert_eq!(
        uncommitted
            .iter()
            .filter(|g| g.value.starts_with("a2"))
            .count(),
        9
    );
    // Per partition: offsets strictly increase, aborted data and markers keep their offsets,
    // so the second commit's records sit above the aborted ones.
    for (t, part) in parts {
        let offs = |pred: &dyn Fn(&Got) -> bool| -> Vec<i64> {
            uncommitted
                .iter()
                .filter(|g| g.topic == t && g.partition == part && pred(g))
                .map(|g| g.offset)
                .collect()
        };
        let a2 = offs(&|g| g.value.starts_with("a2"));
        let c1 = offs(&|g| g.value.starts_with("c1"));
        let c3 = offs(&|g| g.value.starts_with("c3"));
        assert_eq!(c1, vec![0, 1, 2], "{t}-{part}");
        // c1 marker at 3, a2 data at 4..6, a2 marker at 7, c3 at 8..10.
        assert_eq!(a2, vec![4, 5, 6], "{t}-{part}");
        assert_eq!(c3, vec![8, 9, 10], "{t}-{part}");
        let rc: Vec<i64> = committed
            .iter()
            .filter(|g| g.topic == t && g.partition == part)
            .map(|g| g.offset)
            .collect();
        assert_eq!(rc, vec![0, 1, 2, 8, 9, 10], "{t}-{part}");
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lso_holds_back_records_after_an_open_transaction() {
    let broker = start_broker(1).await;
    let bs = broker.bootstrap_servers();
    let got = tokio::task::spawn_blocking(move || {
        let plain = plain_producer(&bs);
        send(&plain, "lso", 0, "before");
        flush(&plain);
        let tp = txn_producer(&bs, "tx-lso", 30_000);
        tp.begin_transaction().expect("begin");
        send(&tp, "lso", 0, "txn-1");
        flush(&tp);
        send(&plain, "lso", 0, "after");
        flush(&plain);
        let rc = consumer(&bs, true, &[("lso", 0)]);
        // While the transaction is open only the record before it is visible.
        let while_open = poll_records(&rc, 1, Duration::from_millis(1500));
        send(&tp, "lso", 0, "txn-2");
        flush(&tp);
        tp.commit_transaction(T).expect("commit");
        let after_commit = poll_records(&rc, 3, Duration::from_millis(500));
        (while_open, after_commit)
    })
    .await
    .expect("client thread");
    let (while_open, after_commit) = got;
    assert_eq!(values(&while_open), vec!["before"]);
    assert_eq!(values(&after_commit), vec!["txn-1", "after", "txn-2"]);
    let offsets: Vec<i64> = after_commit.iter().map(|g| g.offset).collect();
    assert_eq!(
        offsets,
        vec![1, 2, 3],
        "order is by offset after the commit"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_producer_fences_the_first_and_its_data_stays_invisible() {
    let broker = start_broker(1).await;
    let bs = broker.bootstrap_servers();
    let (committed, uncommitted, zombie_commit) = tokio::task::spawn_blocking(move || {
        let p1 = txn_producer(&bs, "tx-fence", 30_000);
        p1.begin_transaction().expect("begin");
        send(&p1, "fence", 0, "zombie-1");
        flush(&p1);
        // Same transactional id: the broker aborts p1's transaction and bumps the epoch.
        let p2 = txn_producer(&bs, "tx-fence", 30_000);
        send(&p1, "fence", 0, "zombie-2");
        let _ = p1.flush(Duration::from_secs(5));
        let zombie_commit = p1.commit_transaction(Duration::from_secs(10));
        p2.begin_transaction().expect("begin p2");
        send(&p2, "fence", 0, "p2");
        flush(&p2);
        p2.commit_transaction(T).expect("p2 commit");
        let rc = consumer(&bs, true, &[("fence", 0)]);
        let committed = poll_records(&rc, 1, Duration::from_millis(1000));
        let ru = consumer(&bs, false, &[("fence", 0)]);
        let uncommitted = poll_records(&ru, 2, Duration::from_millis(1000));
        (
            committed,
            uncommitted,
            zombie_commit.map_err(|e| e.to_string()),
        )
    })
    .await
    .expect("client thread");
    assert!(zombie_commit.is_err(), "the fenced producer committed");
    assert_eq!(values(&committed), vec!["p2"]);
    let uv = values(&uncommitted);
    assert!(
        uv.contains(&"zombie-1".to_string()) && uv.contains(&"p2".to_string()),
        "{uv:?}"
    );
    assert!(
        !uv.contains(&"zombie-2".to_string()),
        "a fenced write landed: {uv:?}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_out_transaction_is_aborted_and_the_late_commit_fails() {
    let broker = start_broker(1).await;
    let bs = broker.bootstrap_servers();
    let (seen, late) = tokio::task::spawn_blocking(move || {
        let p = txn_producer(&bs, "tx-timeout", 1_000);
        p.begin_transaction().expect("begin");
        send(&p, "tmo", 0, "stuck");
        flush(&p);
        let plain = plain_producer(&bs);
        send(&plain, "tmo", 0, "after");
        flush(&plain);
        // The broker aborts the transaction after ~1 s; the reader then moves past it
        // without the producer doing anything.
        let rc = consumer(&bs, true, &[("tmo", 0)]);
        let seen = poll_records(&rc, 1, Duration::from_millis(500));
        let late = p.commit_transaction(Duration::from_secs(10));
        (seen, late.map_err(|e| e.to_string()))
    })
    .await
    .expect("client thread");
    assert_eq!(values(&seen), vec!["after"]);
    assert!(late.is_err(), "the late commit succeeded");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_timeout_above_the_broker_max_is_refused() {
    let mut config = onceflow_broker::BrokerConfig::default();
    config.transactions.max_transaction_timeout_ms = 5_000;
    let broker = start_with(config).await;
    let bs = broker.bootstrap_servers();
    let res = tokio::task::spawn_blocking(move || {
        let p: rdkafka::producer::BaseProducer = rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("transactional.id", "tx-too-long")
            .set("transaction.timeout.ms", "10000")
            .create()
            .expect("producer");
        p.init_transactions(Duration::from_secs(10))
            .map_err(|e| e.to_string())
    })
    .await
    .expect("client thread");
    let err = res.expect_err("init_transactions must fail");
    assert!(err.to_lowercase().contains("timeout"), "{err}");
    broker.shutdown().await;
}
