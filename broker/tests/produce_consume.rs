//! End to end over TCP with the real rdkafka client against an in-process broker on port 0:
//! idempotent produce of 100k records with lz4 and with zstd, read back record by record;
//! Metadata auto-creation, DescribeConfigs and CreateTopics through the admin client; the
//! Prometheus endpoint.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const RECORDS: usize = 100_000;
const PARTITIONS: i32 = 4;
const BASE_TIMESTAMP: i64 = 1_700_000_000_000;

/// Collects librdkafka's warnings and errors (protocol parse failures, unexpected
/// disconnects, "invalid MessageSetSize" and the like) so a test can require there are none.
#[derive(Default, Clone)]
struct Complaints(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Complaints {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl rdkafka::ClientContext for Complaints {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        ) {
            let line = format!("{level:?} {fac}: {message}");
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    }
}

impl rdkafka::producer::ProducerContext for Complaints {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

impl rdkafka::consumer::ConsumerContext for Complaints {}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?)
}

fn create_topics(bootstrap: &str, names: &[&str], partitions: i32) -> Result<()> {
    let admin = admin(bootstrap)?;
    // Clients ask for replication factor 3; the single node accepts it.
    let topics: Vec<NewTopic> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(3)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in block_on(admin.create_topics(&topics, &opts))? {
        result.map_err(|(topic, code)| anyhow::anyhow!("creating {topic}: {code:?}"))?;
    }
    Ok(())
}

fn key(topic: &str, partition: i32, i: usize) -> String {
    format!("{topic}/{partition}/{i}")
}

fn value(i: usize) -> Vec<u8> {
    // 100 bytes, compressible but not constant.
    (0..100)
        .map(|j| b'a' + ((i * 7 + j * 13) % 26) as u8)
        .collect()
}

fn produce_all(
    bootstrap: &str,
    topics: &[&str],
    compression: &str,
    complaints: &Complaints,
) -> Result<()> {
    let producer: BaseProducer<Complaints> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("compression.type", compression)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "200000")
        .create_with_context(complaints.clone())?;
    let targets: Vec<(&str, i32)> = topics
        .iter()
        .flat_map(|t| (0..PARTITIONS).map(move |p| (*t, p)))
        .collect();
    let mut sent = vec![0usize; targets.len()];
    for n in 0..RECORDS {
        let slot = n % targets.len();
        let (topic, partition) = targets[slot];
        let i = sent[slot];
        sent[slot] += 1;
        let key = key(topic, partition, i);
        let value = value(i);
        let index = i.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "index",
                value: Some(&index),
            })
            .insert(Header {
                key: "codec",
                value: Some(compression),
            });
        let mut record = BaseRecord::to(topic)
            .partition(partition)
            .key(&key)
            .payload(&value)
            .headers(headers)
            .timestamp(BASE_TIMESTAMP + i as i64);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => bail!("send failed: {e}"),
            }
        }
        if n % 1000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(60)).context("flush")?;
    ensure!(producer.in_flight_count() == 0, "records left in flight");
    Ok(())
}

fn consume_and_check(
    bootstrap: &str,
    topics: &[&str],
    compression: &str,
    isolation: &str,
    complaints: &Complaints,
) -> Result<()> {
    let consumer: BaseConsumer<Complaints> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("group.id", "unused-assign-only")
        .create_with_context(complaints.clone())?;
    let mut assignment = TopicPartitionList::new();
    let mut expected_per_partition = HashMap::new();
    let per_partition = RECORDS / (topics.len() * PARTITIONS as usize);
    for (t, topic) in topics.iter().enumerate() {
        for p in 0..PARTITIONS {
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
            let slot = t * PARTITIONS as usize + p as usize;
            let extra = usize::from(slot < RECORDS % (topics.len() * PARTITIONS as usize));
            expected_per_partition.insert((topic.to_string(), p), per_partition + extra);
        }
    }
    consumer.assign(&assignment)?;
    let mut next: HashMap<(String, i32), usize> = HashMap::new();
    let mut seen = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen < RECORDS {
        ensure!(
            Instant::now() < deadline,
            "timed out after {seen} of {RECORDS} records"
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = message?;
        let slot = (m.topic().to_string(), m.partition());
        let i = next.entry(slot.clone()).or_insert(0);
        ensure!(
            m.offset() == *i as i64,
            "{slot:?}: offset {} where {} was expected",
            m.offset(),
            i
        );
        let want_key = key(m.topic(), m.partition(), *i);
        ensure!(
            m.key() == Some(want_key.as_bytes()),
            "{slot:?}@{i}: wrong key {:?}",
            m.key()
        );
        ensure!(
            m.payload() == Some(value(*i).as_slice()),
            "{slot:?}@{i}: wrong value"
        );
        ensure!(
            m.timestamp().to_millis() == Some(BASE_TIMESTAMP + *i as i64),
            "{slot:?}@{i}: wrong timestamp {:?}",
            m.timestamp()
        );
        let headers = m.headers().context("headers missing")?;
        ensure!(
            headers.count() == 2,
            "{slot:?}@{i}: {} headers",
            headers.count()
        );
        let h0 = headers.get(0);
        let h1 = headers.get(1);
        ensure!(
            h0.key == "index" && h0.value == Some(i.to_string().as_bytes()),
            "{slot:?}@{i}: header 0"
        );
        ensure!(
            h1.key == "codec" && h1.value == Some(compression.as_bytes()),
            "{slot:?}@{i}: header 1"
        );
        *i += 1;
        seen += 1;
    }
    for (slot, want) in expected_per_partition {
        let got = next.get(&slot).copied().unwrap_or(0);
        ensure!(got == want, "{slot:?}: read {got} records, expected {want}");
    }
    // Nothing beyond the produced records.
    if let Some(extra) = consumer.poll(Duration::from_millis(300)) {
        let m = extra?;
        bail!(
            "unexpected extra record {}-{}@{}",
            m.topic(),
            m.partition(),
            m.offset()
        );
    }
    Ok(())
}

/// ListOffsets through rdkafka: earliest/latest watermarks and the offset for a timestamp.
fn check_list_offsets(bootstrap: &str, topics: &[&str]) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused-list-offsets")
        .create()?;
    let per_partition = (RECORDS / (topics.len() * PARTITIONS as usize)) as i64;
    let (low, high) = consumer.fetch_watermarks(topics[0], 1, Duration::from_secs(10))?;
    ensure!(
        low == 0 && high >= per_partition,
        "watermarks {low}..{high}"
    );
    let mut query = TopicPartitionList::new();
    query.add_partition_offset(topics[0], 1, Offset::Offset(BASE_TIMESTAMP + 500))?;
    query.add_partition_offset(
        topics[0],
        2,
        Offset::Offset(BASE_TIMESTAMP + 10 * per_partition),
    )?;
    let found = consumer.offsets_for_times(query, Duration::from_secs(10))?;
    let at = |p: i32| found.find_partition(topics[0], p).map(|e| e.offset());
    // Batch-level precision: the batch holding record 500 starts at or before it.
    ensure!(
        matches!(at(1), Some(Offset::Offset(o)) if o <= 500),
        "offset for time {:?}",
        at(1)
    );
    ensure!(
        matches!(at(2), Some(Offset::End)),
        "offset after the last timestamp {:?}",
        at(2)
    );
    Ok(())
}

fn round_trip(compression: &str, data_dir: Option<&std::path::Path>) -> Result<()> {
    let mut config = BrokerConfig::default();
    config.storage.data_dir = data_dir.map(|d| d.to_path_buf());
    let broker = InProcessBroker::start(config)?;
    let bootstrap = broker.bootstrap();
    let a = format!("pc-{compression}-a");
    let b = format!("pc-{compression}-b");
    let topics = [a.as_str(), b.as_str()];
    create_topics(&bootstrap, &topics, PARTITIONS)?;
    let started = Instant::now();
    let complaints = Complaints::default();
    produce_all(&bootstrap, &topics, compression, &complaints)?;
    let produced = started.elapsed();
    // The durable run reads as a read_committed consumer (no transactions: everything is
    // stable), the in-memory run as read_uncommitted.
    let isolation = if data_dir.is_some() {
        "read_committed"
    } else {
        "read_uncommitted"
    };
    consume_and_check(&bootstrap, &topics, compression, isolation, &complaints)?;
    let complaints = complaints.take();
    ensure!(
        complaints.is_empty(),
        "librdkafka complained: {complaints:#?}"
    );
    check_list_offsets(&bootstrap, &topics)?;
    eprintln!(
        "{compression} (durable: {}): produced {RECORDS} in {produced:?}, produced+consumed in {:?}",
        data_dir.is_some(),
        started.elapsed()
    );
    Ok(())
}

#[test]
fn idempotent_lz4_records_come_back_in_order_in_memory() -> Result<()> {
    round_trip("lz4", None)
}

#[test]
fn idempotent_zstd_records_come_back_in_order_on_disk() -> Result<()> {
    // Durable log, fsync on every batch (the default policy).
    let dir = tempfile::tempdir()?;
    round_trip("zstd", Some(dir.path()))
}

#[test]
fn metadata_auto_creates_and_admin_paths_work() -> Result<()> {
    let config = BrokerConfig {
        default_partitions: 3,
        ..BrokerConfig::default()
    };
    let broker = InProcessBroker::start(config)?;
    let bootstrap = broker.bootstrap();
    let admin = admin(&bootstrap)?;

    // Metadata for an unknown topic creates it with the default partition count.
    let md = admin
        .inner()
        .fetch_metadata(Some("auto-created"), Duration::from_secs(10))?;
    let topic = &md.topics()[0];
    ensure!(
        topic.error().is_none(),
        "metadata error {:?}",
        topic.error()
    );
    ensure!(
        topic.partitions().len() == 3,
        "{} partitions",
        topic.partitions().len()
    );
    ensure!(topic
        .partitions()
        .iter()
        .all(|p| p.leader() == 0 && p.replicas() == [0]));
    ensure!(md.brokers().len() == 1 && md.brokers()[0].id() == 0);
    ensure!(md.brokers()[0].port() == i32::from(broker.addr().port()));

    // CreateTopics: a new topic, then the same again.
    create_topics(&bootstrap, &["created"], 5)?;
    let opts = AdminOptions::new();
    let again = block_on(admin.create_topics(
        &[NewTopic::new("created", 5, TopicReplication::Fixed(1))],
        &opts,
    ))?;
    ensure!(
        matches!(again[0], Err((_, RDKafkaErrorCode::TopicAlreadyExists))),
        "second create: {again:?}"
    );
    let bad = block_on(admin.create_topics(
        &[NewTopic::new("bad/name", 1, TopicReplication::Fixed(1))],
        &opts,
    ))?;
    ensure!(
        matches!(bad[0], Err((_, RDKafkaErrorCode::InvalidTopic))),
        "bad name: {bad:?}"
    );
    let all = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?;
    let mut names: Vec<&str> = all.topics().iter().map(|t| t.name()).collect();
    names.sort_unstable();
    ensure!(names == ["auto-created", "created"], "topics {names:?}");

    // DescribeConfigs for a topic and the broker.
    let configs = block_on(admin.describe_configs(
        &[
            ResourceSpecifier::Topic("created"),
            ResourceSpecifier::Broker(0),
        ],
        &opts,
    ))?;
    let topic_cfg = configs[0]
        .as_ref()
        .map_err(|e| anyhow::anyhow!("topic configs: {e:?}"))?;
    ensure!(
        topic_cfg
            .get("cleanup.policy")
            .and_then(|e| e.value.as_deref())
            == Some("delete")
    );
    ensure!(topic_cfg.get("segment.bytes").is_some());
    let broker_cfg = configs[1]
        .as_ref()
        .map_err(|e| anyhow::anyhow!("broker configs: {e:?}"))?;
    ensure!(
        broker_cfg
            .get("num.partitions")
            .and_then(|e| e.value.as_deref())
            == Some("3")
    );
    // rust-rdkafka drops per-resource error codes: an unknown topic shows as no entries.
    let missing =
        block_on(admin.describe_configs(&[ResourceSpecifier::Topic("no-such-topic")], &opts));
    let has_entries = matches!(missing.as_deref(), Ok([Ok(r)]) if !r.entries.is_empty());
    ensure!(!has_entries, "describe of a missing topic returned configs");

    // DeleteTopics.
    for r in block_on(admin.delete_topics(&["created"], &opts))? {
        r.map_err(|(t, c)| anyhow::anyhow!("delete {t}: {c:?}"))?;
    }
    let gone = block_on(admin.delete_topics(&["created"], &opts))?;
    ensure!(
        matches!(gone[0], Err((_, RDKafkaErrorCode::UnknownTopicOrPartition))),
        "{gone:?}"
    );
    Ok(())
}

#[test]
fn no_auto_create_refuses_unknown_topics() -> Result<()> {
    let config = BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    };
    let broker = InProcessBroker::start(config)?;
    let admin = admin(&broker.bootstrap())?;
    let md = admin
        .inner()
        .fetch_metadata(Some("missing"), Duration::from_secs(10))?;
    ensure!(
        md.topics()[0].error().is_some(),
        "metadata for a missing topic has no error"
    );
    ensure!(admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?
        .topics()
        .is_empty());
    Ok(())
}

#[test]
fn prometheus_endpoint_answers() -> Result<()> {
    let config = BrokerConfig {
        metrics_listen: Some("127.0.0.1:0".parse()?),
        ..BrokerConfig::default()
    };
    let broker = InProcessBroker::start(config)?;
    let admin = admin(&broker.bootstrap())?;
    admin
        .inner()
        .fetch_metadata(Some("metered"), Duration::from_secs(10))?;
    let addr = broker.handle().metrics_addr().context("metrics address")?;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    ensure!(text.starts_with("HTTP/1.1 200 OK"), "response: {text}");
    ensure!(
        text.contains("onceflow_broker_requests_total"),
        "no request counter in: {text}"
    );
    ensure!(
        text.contains("api=\"Metadata\""),
        "no Metadata label in: {text}"
    );
    Ok(())
}
