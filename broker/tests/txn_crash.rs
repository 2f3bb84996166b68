//! kill -9 of the broker binary while one transaction is open and another is right after
//! PrepareCommit: after a restart on the same data dir the prepared one is complete and
//! visible, the open one is aborted at its timeout, and group offsets are intact.

use std::time::Duration;

use onceflow_testkit::broker_process::BrokerProcess;
use onceflow_testkit::clients::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

fn group_consumer(bs: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer")
}

#[test]
fn kill9_after_prepare_commit_and_with_an_open_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // Failpoint: every commit's markers wait 8 s after its PrepareCommit is durable (and the
    // broker logs that moment), so the kill below lands between the two.
    let mut broker = BrokerProcess::durable_txn_debug(&data, &["--txn-marker-delay-ms", "8000"]);
    let bs = broker.bootstrap().to_string();

    // A committed transaction carrying group offsets (survives the crash).
    let plain = plain_producer(&bs);
    for i in 0..5 {
        send(&plain, "crash-in", 0, &format!("in-{i}"));
    }
    flush(&plain);
    let group = group_consumer(&bs, "crash-group");
    let offsets_producer = txn_producer(&bs, "tx-crash-offsets", 30_000);
    offsets_producer.begin_transaction().expect("begin");
    send(&offsets_producer, "crash-out", 0, "with-offsets");
    flush(&offsets_producer);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("crash-in", 0, Offset::Offset(5))
        .expect("tpl");
    offsets_producer
        .send_offsets_to_transaction(&tpl, &group.group_metadata().expect("metadata"), T)
        .expect("send offsets");
    offsets_producer.commit_transaction(T).expect("commit");

    // The prepared transaction: its data first, then an open one behind it.
    let prepared = txn_producer(&bs, "tx-crash-prepared", 60_000);
    prepared.begin_transaction().expect("begin");
    for i in 0..3 {
        send(&prepared, "crash", 0, &format!("prep-{i}"));
    }
    flush(&prepared);
    let open = txn_producer(&bs, "tx-crash-open", 6_000);
    open.begin_transaction().expect("begin");
    send(&open, "crash", 0, "open-0");
    flush(&open);
    let committer = std::thread::spawn(move || {
        let r = prepared.commit_transaction(Duration::from_secs(8));
        (r.is_ok(), prepared)
    });
    // The second commit's PrepareCommit is durable once the broker logs the failpoint for the
    // second time (the first was the offsets transaction's): kill it there.
    broker.wait_for_log(
        "test failpoint: delaying markers",
        2,
        Duration::from_secs(120),
    );
    broker.kill9().expect("kill -9 the broker");

    let restarted = BrokerProcess::durable_txn_debug(&data, &[]);
    let bs = restarted.bootstrap().to_string();
    let rc = consumer(&bs, true, &[("crash", 0)]);
    let first = poll_records(&rc, 3, Duration::from_millis(300));
    assert_eq!(
        values(&first),
        vec!["prep-0", "prep-1", "prep-2"],
        "the prepared transaction is complete and visible after restart"
    );
    // The open transaction holds back later records until its timeout aborts it.
    let plain = plain_producer(&bs);
    send(&plain, "crash", 0, "after");
    flush(&plain);
    let rest = poll_records(&rc, 1, Duration::from_millis(500));
    assert_eq!(
        values(&rest),
        vec!["after"],
        "open transaction aborted at its timeout"
    );
    let ru = consumer(&bs, false, &[("crash", 0)]);
    let all = poll_records(&ru, 5, Duration::from_millis(300));
    assert!(values(&all).contains(&"open-0".to_string()), "{all:?}");

    // Group offsets of the committed transaction are intact.
    let group = group_consumer(&bs, "crash-group");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("crash-in", 0);
    let got = group.committed_offsets(tpl, T).expect("committed");
    assert_eq!(
        got.find_partition("crash-in", 0).map(|e| e.offset()),
        Some(Offset::Offset(5))
    );
    let out = consumer(&bs, true, &[("crash-out", 0)]);
    assert_eq!(
        values(&poll_records(&out, 1, Duration::from_millis(300))),
        vec!["with-offsets"]
    );

    // Clients of the killed broker are dropped on a side thread (their destructors may wait
    // for the dead broker).
    let _ = std::thread::spawn(move || {
        drop(open);
        drop(offsets_producer);
        drop(committer.join());
    });
}
