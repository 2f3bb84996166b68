//! Shared helpers of the transaction tests: an in-process broker, rdkafka transactional
//! producers and assign-based consumers with a chosen isolation level.

#![allow(dead_code)]

pub mod process;
pub mod raw;

use std::time::{Duration, Instant};

use onceflow_broker::{BrokerConfig, BrokerHandle};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Generous bound for client calls in tests: only a stuck call reaches it, not a loaded machine.
pub const T: Duration = Duration::from_secs(60);

/// A consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub value: String,
}

/// Starts an in-memory broker whose auto-created topics get `partitions` partitions.
pub async fn start_broker(partitions: i32) -> BrokerHandle {
    start_with(BrokerConfig {
        default_partitions: partitions,
        ..BrokerConfig::default()
    })
    .await
}

/// Starts a broker with `config`.
pub async fn start_with(config: BrokerConfig) -> BrokerHandle {
    onceflow_broker::start(config).await.expect("broker starts")
}

/// A transactional producer with `init_transactions` done.
pub fn txn_producer(bootstrap: &str, txn_id: &str, timeout_ms: u32) -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", txn_id)
        .set("transaction.timeout.ms", timeout_ms.to_string())
        .set("message.timeout.ms", timeout_ms.to_string())
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    p.init_transactions(T).expect("init_transactions");
    p
}

/// A plain (non-transactional) producer.
pub fn plain_producer(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("producer")
}

/// Enqueues one record (retrying while the local queue is full).
pub fn send(p: &BaseProducer, topic: &str, partition: i32, value: &str) {
    let mut rec = BaseRecord::<str, str>::to(topic)
        .partition(partition)
        .key(value)
        .payload(value);
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((e, r)) => {
                assert!(
                    matches!(
                        e,
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull
                        )
                    ),
                    "send failed: {e}"
                );
                p.poll(Duration::from_millis(10));
                rec = r;
            }
        }
    }
}

/// Delivers everything queued (drains delivery reports first, then flushes).
pub fn flush(p: &BaseProducer) {
    p.poll(Duration::from_millis(0));
    p.flush(T).expect("flush");
}

/// A consumer assigned to `parts` from the beginning with the given isolation level.
pub fn consumer(bootstrap: &str, read_committed: bool, parts: &[(&str, i32)]) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition_offset(t, *p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    c
}

/// Polls until `want` records arrived, then `settle` longer to catch extras, or until `T`.
pub fn poll_records(c: &BaseConsumer, want: usize, settle: Duration) -> Vec<Got> {
    let mut out = Vec::new();
    let deadline = Instant::now() + T;
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= deadline || settle_until.is_some_and(|s| now >= s) {
            return out;
        }
        if let Some(r) = c.poll(Duration::from_millis(50)) {
            let m = r.expect("consume");
            out.push(Got {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            });
        }
        if out.len() >= want && settle_until.is_none() {
            settle_until = Some(Instant::now() + settle);
        }
    }
}

/// The values of `got`, in arrival order.
pub fn values(got: &[Got]) -> Vec<String> {
    got.iter().map(|g| g.value.clone()).collect()
}

/// Polls for exactly `d` and returns whatever arrived (to show that nothing is visible).
pub fn poll_for(c: &BaseConsumer, d: Duration) -> Vec<Got> {
    let mut out = Vec::new();
    let end = Instant::now() + d;
    while Instant::now() < end {
        if let Some(r) = c.poll(Duration::from_millis(50)) {
            let m = r.expect("consume");
            out.push(Got {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            });
        }
    }
    out
}
