//! Consume-transform-produce with send_offsets_to_transaction (rdkafka): the group's
//! committed offsets move only with committed transactions.

use std::time::{Duration, Instant};

use onceflow_testkit::clients::*;
use onceflow_testkit::inproc::start_broker;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

fn committed(c: &BaseConsumer, topic: &str) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = c.committed_offsets(tpl, T).expect("committed offsets");
    match got.find_partition(topic, 0).map(|e| e.offset()) {
        Some(Offset::Offset(o)) => Some(o),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_offsets_move_only_with_committed_transactions() {
    let broker = start_broker(1).await;
    let bs = broker.bootstrap_servers();
    let outcome = tokio::task::spawn_blocking(move || {
        let plain = plain_producer(&bs);
        for i in 0..12 {
            send(&plain, "ctp-in", 0, &format!("in-{i}"));
        }
        flush(&plain);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("group.id", "ctp-group")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("session.timeout.ms", "6000")
            .create()
            .expect("consumer");
        consumer.subscribe(&["ctp-in"]).expect("subscribe");
        let producer = txn_producer(&bs, "tx-ctp", 30_000);
        let mut pos = 0i64;
        let mut history = Vec::new();
        // Three rounds of 4 records: commit, abort, commit.
        for (round, commit) in [(0, true), (1, false), (2, true)] {
            let mut batch = Vec::new();
            let deadline = Instant::now() + T;
            while batch.len() < 4 && Instant::now() < deadline {
                if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                    let m = m.expect("message");
                    batch.push((
                        m.offset(),
                        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    ));
                }
            }
            assert_eq!(batch.len(), 4, "round {round} consumed {batch:?}");
            producer.begin_transaction().expect("begin");
            for (_, v) in &batch {
                send(&producer, "ctp-out", 0, &format!("out-{v}"));
            }
            flush(&producer);
            let next = batch.last().map(|(o, _)| o + 1).unwrap_or(pos);
            let mut offsets = TopicPartitionList::new();
            offsets
                .add_partition_offset("ctp-in", 0, Offset::Offset(next))
                .expect("tpl");
            let meta = consumer.group_metadata().expect("group metadata");
            producer
                .send_offsets_to_transaction(&offsets, &meta, T)
                .expect("send offsets");
            if commit {
                producer.commit_transaction(T).expect("commit");
                pos = next;
            } else {
                producer.abort_transaction(T).expect("abort");
                // Rewind the consumer to the last committed position, as an EOS app does.
                consumer
                    .seek("ctp-in", 0, Offset::Offset(pos), T)
                    .expect("seek");
            }
            history.push((round, commit, committed(&consumer, "ctp-in")));
        }
        let rc = consumer_for(&bs, "ctp-out");
        let out = poll_records(&rc, 8, Duration::from_millis(700));
        (history, values(&out))
    })
    .await
    .expect("client thread");
    let (history, out) = outcome;
    assert_eq!(
        history,
        vec![(0, true, Some(4)), (1, false, Some(4)), (2, true, Some(8))],
        "committed offsets per round"
    );
    let expected: Vec<String> = (0..8).map(|i| format!("out-in-{i}")).collect();
    assert_eq!(out, expected, "read_committed output");
    broker.shutdown().await;
}

fn consumer_for(bs: &str, topic: &str) -> BaseConsumer {
    consumer(bs, true, &[(topic, 0)])
}
