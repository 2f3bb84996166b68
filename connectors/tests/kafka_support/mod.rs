//! Shared helpers of the Kafka connector tests: an in-process broker, a producer of plain
//! records and a read_committed reader.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use onceflow_runtime::SubtaskInfo;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Starts a broker on port 0 with `partitions` per auto-created topic.
pub async fn broker(partitions: i32) -> onceflow_broker::BrokerHandle {
    let cfg = onceflow_broker::BrokerConfig {
        default_partitions: partitions,
        ..Default::default()
    };
    onceflow_broker::start(cfg).await.expect("broker starts")
}

/// Subtask identity for connector tests.
pub fn info(index: usize, parallelism: usize, restored: u64) -> SubtaskInfo {
    SubtaskInfo {
        job_name: "test".into(),
        operator: "kafka".into(),
        node_uid: "n00-kafka".into(),
        index,
        parallelism,
        max_parallelism: 128,
        restored_checkpoint: restored,
    }
}

/// Writes `values` (non-transactional, keyless, round-robin over `partitions`).
pub fn produce(brokers: &str, topic: &str, partitions: i32, values: &[String]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (i, v) in values.iter().enumerate() {
        p.send(
            BaseRecord::<(), str>::to(topic)
                .payload(v.as_str())
                .partition(i as i32 % partitions),
        )
        .expect("send");
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// Reads every value of `topic` visible to read_committed, from the beginning up to the end
/// of every partition (its last stable offset): the broker says where the end is, so the
/// result does not depend on how fast this machine is. Panics if the end is not reached in 120 s.
pub fn read_committed(brokers: &str, topic: &str, partitions: i32) -> Vec<String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "reader")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let mut at_end = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while at_end.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "read_committed {topic}: the end of partitions {:?} not reached in 120 s",
            (0..partitions)
                .filter(|p| !at_end.contains(p))
                .collect::<Vec<_>>()
        );
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => eprintln!("read_committed {topic}: {e}"),
            None => {}
        }
    }
    out
}
