//! rdkafka clients of the tests: transactional and plain producers, a paced idempotent
//! producer on a thread, assigned consumers with a chosen isolation level, readers of a topic
//! from the beginning up to its end (the last stable offset under read_committed), and topic
//! creation.

use std::collections::HashSet;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, ToBytes};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// Generous bound for client calls in tests: only a stuck call reaches it, not a loaded machine.
pub const T: Duration = Duration::from_secs(60);

/// How long [`read_topic`] may go without any record or partition end before it fails.
pub const READ_SILENCE_LIMIT: Duration = Duration::from_secs(120);

/// A consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Value (UTF-8, lossy).
    pub value: String,
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

/// Enqueues one record with `value` as key and value (retrying while the local queue is full).
pub fn send(p: &BaseProducer, topic: &str, partition: i32, value: &str) {
    send_retrying(
        p,
        BaseRecord::<str, str>::to(topic)
            .partition(partition)
            .key(value)
            .payload(value),
    );
}

/// Enqueues `rec`, polling and retrying while the local queue is full; panics on any other
/// error.
pub fn send_retrying<K, V, C>(p: &BaseProducer<C>, mut rec: BaseRecord<'_, K, V, C::DeliveryOpaque>)
where
    K: ToBytes + ?Sized,
    V: ToBytes + ?Sized,
    C: ProducerContext,
{
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                p.poll(Duration::from_millis(10));
                rec = back;
            }
            Err((e, _)) => panic!("send failed: {e}"),
        }
    }
}

/// Writes `values` with an idempotent producer (keyless, round-robin over partitions
/// `0..partitions`) and waits until they are acknowledged.
pub fn produce_values(bootstrap: &str, topic: &str, partitions: i32, values: &[String]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (i, v) in values.iter().enumerate() {
        send_retrying(
            &p,
            BaseRecord::<(), str>::to(topic)
                .payload(v.as_str())
                .partition(i as i32 % partitions),
        );
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// One record to produce: its partition (`None`: librdkafka's partitioner over the key), key
/// and value.
pub type Produced = (Option<i32>, String, Vec<u8>);

/// Produces `records` to `topic` with an idempotent producer in `chunks` chunks with `pause`
/// between them, on a thread, so that input keeps arriving while a test acts.
pub fn produce_records_paced(
    bootstrap: &str,
    topic: &str,
    records: Vec<Produced>,
    chunks: usize,
    pause: Duration,
) -> JoinHandle<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "300000")
        .create()
        .expect("input producer");
    let topic = topic.to_string();
    std::thread::spawn(move || {
        let per = records.len().div_ceil(chunks.max(1)).max(1);
        for (i, chunk) in records.chunks(per).enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            for (partition, key, value) in chunk {
                let mut rec = BaseRecord::to(&topic)
                    .key(key.as_bytes())
                    .payload(&value[..]);
                if let Some(p) = partition {
                    rec = rec.partition(*p);
                }
                send_retrying(&producer, rec);
            }
            producer.poll(Duration::ZERO);
        }
        producer
            .flush(Duration::from_secs(300))
            .expect("flush input");
    })
}

/// Delivers everything queued (drains delivery reports first, then flushes).
pub fn flush(p: &BaseProducer) {
    p.poll(Duration::from_millis(0));
    p.flush(T).expect("flush");
}

/// A consumer of a group of its own (nothing committed) with the given isolation level that
/// reports the end of each partition as an error if `eof`; assign it with [`assign`].
pub fn consumer_with(bootstrap: &str, read_committed: bool, eof: bool) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", if eof { "true" } else { "false" })
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
        .expect("consumer")
}

/// Assigns `parts` to `c` from the beginning.
pub fn assign(c: &BaseConsumer, parts: &[(&str, i32)]) {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition_offset(t, *p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
}

/// A consumer assigned to `parts` from the beginning with the given isolation level.
pub fn consumer(bootstrap: &str, read_committed: bool, parts: &[(&str, i32)]) -> BaseConsumer {
    let c = consumer_with(bootstrap, read_committed, false);
    assign(&c, parts);
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
            out.push(got(&r.expect("consume")));
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
            out.push(got(&r.expect("consume")));
        }
    }
    out
}

fn got(m: &impl Message) -> Got {
    Got {
        topic: m.topic().to_string(),
        partition: m.partition(),
        offset: m.offset(),
        value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
    }
}

/// A record read by [`read_topic`].
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes (empty if null).
    pub key: Vec<u8>,
    /// Value bytes (empty if null).
    pub value: Vec<u8>,
}

impl Consumed {
    /// The key as UTF-8 (lossy).
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    /// The value as UTF-8 (lossy).
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(&self.value).into_owned()
    }
}

/// The partitions of `topic` the broker reports (none if it does not exist).
pub fn partitions_of(c: &BaseConsumer, topic: &str) -> Vec<i32> {
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(120))
        .expect("metadata");
    md.topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect()
}

/// Reads every partition of `topic` from the beginning to its end (the last stable offset
/// under read_committed): the broker says where the end is, so the result does not depend on
/// how fast this machine is. Panics on a consumer error and after [`READ_SILENCE_LIMIT`]
/// without any record or partition end (a bound on silence, not on the whole read: a big
/// topic on a loaded machine takes long).
pub fn read_topic(bootstrap: &str, topic: &str, read_committed: bool) -> Vec<Consumed> {
    let c = consumer_with(bootstrap, read_committed, true);
    let parts = partitions_of(&c, topic);
    if parts.is_empty() {
        return Vec::new();
    }
    assign(&c, &parts.iter().map(|p| (topic, *p)).collect::<Vec<_>>());
    let mut at_end: HashSet<i32> = HashSet::new();
    let mut out = Vec::new();
    let mut progressed = Instant::now();
    while at_end.len() < parts.len() {
        assert!(
            progressed.elapsed() < READ_SILENCE_LIMIT,
            "reading {topic} got nothing for {READ_SILENCE_LIMIT:?} before the end of partitions \
             {:?}",
            parts
                .iter()
                .filter(|p| !at_end.contains(p))
                .collect::<Vec<_>>()
        );
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                progressed = Instant::now();
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            Some(Ok(m)) => {
                progressed = Instant::now();
                at_end.remove(&m.partition());
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().unwrap_or_default().to_vec(),
                    value: m.payload().unwrap_or_default().to_vec(),
                });
            }
        }
    }
    out
}

/// The values of `topic` visible to read_committed, from the beginning to the end
/// ([`read_topic`]), as UTF-8 (lossy).
pub fn read_committed_values(bootstrap: &str, topic: &str) -> Vec<String> {
    read_topic(bootstrap, topic, true)
        .iter()
        .map(Consumed::value_str)
        .collect()
}

/// Creates `topics` with `partitions` partitions each (already existing is fine).
pub fn create_topics(bootstrap: &str, topics: &[&str], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(120)));
    let results = futures::executor::block_on(admin.create_topics(&new, &opts))
        .expect("CreateTopics request");
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("create topic {t}: {e}"),
        }
    }
}

/// The offsets `group` committed for partitions `0..partitions` of `topic` (partitions
/// without a committed offset are left out).
pub fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> std::collections::BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    c.committed_offsets(tpl, Duration::from_secs(30))
        .expect("committed offsets")
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}
