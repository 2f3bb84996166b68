//! rdkafka helpers: deterministic test records, an idempotent producer that records every
//! delivery report, and a reader (assign, no group) that reads partitions to their end.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// One test record as produced, for record-by-record comparison with what is read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRecord {
    /// Partition it was (or is to be) written to.
    pub partition: i32,
    /// Key bytes.
    pub key: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// CreateTime timestamp in ms.
    pub timestamp: i64,
}

impl TestRecord {
    /// A deterministic record number `i` of size about `value_len` for `partition`.
    pub fn numbered(partition: i32, i: u64, value_len: usize) -> Self {
        let key = format!("key-{partition}-{i}").into_bytes();
        let mut value = Vec::with_capacity(value_len);
        let seed = format!("value-{partition}-{i}-");
        while value.len() < value_len {
            value.extend_from_slice(seed.as_bytes());
        }
        value.truncate(value_len);
        let headers = vec![
            ("n".to_string(), i.to_be_bytes().to_vec()),
            ("p".to_string(), partition.to_be_bytes().to_vec()),
        ];
        Self {
            partition,
            key,
            value,
            headers,
            timestamp: 1_700_000_000_000 + i as i64,
        }
    }

    /// The headers in rdkafka form.
    pub fn owned_headers(&self) -> OwnedHeaders {
        let mut h = OwnedHeaders::new_with_capacity(self.headers.len());
        for (k, v) in &self.headers {
            h = h.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        h
    }
}

/// A record as read back by a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes (empty if null).
    pub key: Vec<u8>,
    /// Value bytes (empty if null).
    pub value: Vec<u8>,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Timestamp in ms, if any.
    pub timestamp: Option<i64>,
}

impl ReadRecord {
    /// True if key, value, headers and timestamp equal those of `r`.
    pub fn matches(&self, r: &TestRecord) -> bool {
        self.partition == r.partition
            && self.key == r.key
            && self.value == r.value
            && self.headers == r.headers
            && self.timestamp == Some(r.timestamp)
    }
}

/// A base client config: bootstrap, short socket/metadata timeouts suited to tests.
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("socket.timeout.ms", "10000")
        .set("topic.metadata.refresh.interval.ms", "2000")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "500");
    c
}

/// Reads every record of `topic` partitions `0..partitions` from the beginning until each
/// partition reached its high watermark as the broker reported it before the read,
/// or fails after `timeout`. Uses `assign`: no group is joined and nothing is committed.
pub fn read_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<Vec<ReadRecord>> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("enable.auto.commit", "false")
        // rdkafka polls through the group queue, which needs a group id even with assign().
        .set("group.id", "onceflow-conformance-reader")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .context("create consumer")?;
    let deadline = Instant::now() + timeout;
    // Watermarks come quickly from a healthy broker; do not spend the whole budget retrying.
    let watermark_deadline = deadline.min(Instant::now() + Duration::from_secs(10));
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                Ok(w) => break w,
                Err(e) if Instant::now() < watermark_deadline => {
                    eprintln!("fetch_watermarks {topic}/{p}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(anyhow!("fetch_watermarks {topic}/{p}: {e}")),
            }
        };
        if low != 0 {
            bail!("{topic}/{p} log start offset is {low}, expected 0");
        }
        ends.insert(p, high);
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    while next.iter().any(|(p, n)| *n < ends[p]) {
        if Instant::now() > deadline {
            bail!("timed out reading {topic}: positions {next:?}, ends {ends:?}");
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.map_err(|e| anyhow!("consumer error: {e}"))?;
        let p = msg.partition();
        let expected = next[&p];
        if msg.offset() < expected {
            bail!(
                "{topic}/{p}: offset {} went backwards (expected {expected})",
                msg.offset()
            );
        }
        next.insert(p, msg.offset() + 1);
        let headers = msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(ReadRecord {
            partition: p,
            offset: msg.offset(),
            key: msg.key().unwrap_or_default().to_vec(),
            value: msg.payload().unwrap_or_default().to_vec(),
            headers,
            timestamp: msg.timestamp().to_millis(),
        });
    }
    Ok(out)
}

/// Delivery reports: record index -> (partition, offset), and the failures.
#[derive(Default)]
pub struct Acks {
    /// Successful deliveries.
    pub delivered: Mutex<HashMap<usize, (i32, i64)>>,
    /// Failed deliveries with the error.
    pub failed: Mutex<Vec<(usize, String)>>,
    /// Number of reports seen.
    pub reported: AtomicUsize,
}

/// Producer context that records delivery reports into [`Acks`].
pub struct AckContext(pub Arc<Acks>);

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, index: Box<usize>) {
        match result {
            Ok(msg) => {
                self.0
                    .delivered
                    .lock()
                    .unwrap()
                    .insert(*index, (msg.partition(), msg.offset()));
            }
            Err((err, _)) => self
                .0
                .failed
                .lock()
                .unwrap()
                .push((*index, err.to_string())),
        }
        self.0.reported.fetch_add(1, Ordering::SeqCst);
    }
}

/// An idempotent producer with small batches and a long message timeout.
pub fn idempotent_producer(bootstrap: &str, acks: &Arc<Acks>) -> Result<BaseProducer<AckContext>> {
    idempotent_producer_with(bootstrap, acks, "none")
}

/// [`idempotent_producer`] with `compression.type` set to `compression`.
pub fn idempotent_producer_with(
    bootstrap: &str,
    acks: &Arc<Acks>,
    compression: &str,
) -> Result<BaseProducer<AckContext>> {
    let producer = client_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("compression.type", compression)
        .set("linger.ms", "2")
        .set("batch.num.messages", "200")
        .set("message.timeout.ms", "90000")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "300")
        .create_with_context(AckContext(acks.clone()))
        .context("create idempotent producer")?;
    Ok(producer)
}

/// Sends `records` (record index = position) paced at about `per_sec`, polling for reports.
pub fn send_all(
    producer: &BaseProducer<AckContext>,
    topic: &str,
    records: &[TestRecord],
    per_sec: usize,
) -> Result<()> {
    let start = Instant::now();
    for (i, r) in records.iter().enumerate() {
        let due = start + Duration::from_secs_f64(i as f64 / per_sec as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            producer.poll(wait);
        }
        let mut opaque = Box::new(i);
        let send_deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let rec = BaseRecord::with_opaque_to(topic, opaque)
                .partition(r.partition)
                .key(&r.key)
                .payload(&r.value)
                .headers(r.owned_headers())
                .timestamp(r.timestamp);
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    ensure!(
                        Instant::now() < send_deadline,
                        "producer queue full for 60 s"
                    );
                    opaque = rec.delivery_opaque;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => bail!("send record {i}: {e}"),
            }
        }
        producer.poll(Duration::ZERO);
    }
    Ok(())
}

/// Produces `records` with an idempotent producer, waits for every report, and returns each
/// record's (partition, offset); fails if any delivery failed.
pub fn produce_acked(
    bootstrap: &str,
    topic: &str,
    records: &[TestRecord],
) -> Result<Vec<(i32, i64)>> {
    let acks = Arc::new(Acks::default());
    let producer = idempotent_producer(bootstrap, &acks)?;
    send_all(&producer, topic, records, 1_000_000)?;
    producer.flush(Duration::from_secs(30)).context("flush")?;
    let failed = acks.failed.lock().unwrap();
    ensure!(
        failed.is_empty(),
        "deliveries failed: {:?}",
        &failed[..failed.len().min(5)]
    );
    let delivered = acks.delivered.lock().unwrap();
    (0..records.len())
        .map(|i| {
            delivered
                .get(&i)
                .copied()
                .with_context(|| format!("no report for {i}"))
        })
        .collect()
}
