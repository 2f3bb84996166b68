//! Retention over TCP with the real rdkafka client, in memory and durable: a small
//! retention.bytes with small segments deletes old segments, the log start moves,
//! ListOffsets(earliest) follows, and a consumer positioned below it is reset by
//! `auto.offset.reset`; a roll past retention.bytes trims without waiting for the check
//! interval; retention never passes an open transaction's first offset; configs
//! and the log start survive a restart. Every wait polls a condition with a generous bound.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use onceflow_broker::storage::StorageConfig;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use onceflow_testkit::records::{client_config, produce_acked, TestRecord};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// Bound of every wait: only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(60);

fn broker(data_dir: Option<PathBuf>) -> Result<InProcessBroker> {
    broker_checking_every(data_dir, Duration::from_millis(50))
}

/// A broker whose retention pass runs every `interval` (and whenever a roll takes a
/// partition past `retention.bytes`).
fn broker_checking_every(data_dir: Option<PathBuf>, interval: Duration) -> Result<InProcessBroker> {
    InProcessBroker::start(BrokerConfig {
        storage: StorageConfig {
            data_dir,
            retention_check_interval: Some(interval),
            ..StorageConfig::default()
        },
        ..BrokerConfig::default()
    })
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(client_config(bootstrap).create()?)
}

fn opts() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

fn create_topic(bootstrap: &str, name: &str, configs: &[(&str, &str)]) -> Result<()> {
    let mut topic = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    for r in block_on(admin(bootstrap)?.create_topics([&topic], &opts()))? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }
    Ok(())
}

fn alter(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) -> Result<()> {
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in configs {
        alter = alter.set(k, v);
    }
    for r in block_on(admin(bootstrap)?.alter_configs([&alter], &opts()))? {
        r.map_err(|(t, e)| anyhow::anyhow!("alter {t:?}: {e}"))?;
    }
    Ok(())
}

/// Produces `rounds` separately flushed rounds of `per_round` records (so at least `rounds`
/// batches, each filling a small segment).
fn produce_rounds(bootstrap: &str, topic: &str, rounds: u64, per_round: u64) -> Result<()> {
    for round in 0..rounds {
        let records: Vec<TestRecord> = (0..per_round)
            .map(|i| TestRecord::numbered(0, round * per_round + i, 100))
            .collect();
        produce_acked(bootstrap, topic, &records)?;
    }
    Ok(())
}

/// (log start, high watermark): read_uncommitted, so an open transaction does not lower the
/// high end to the last stable offset.
fn watermarks(bootstrap: &str, topic: &str) -> Result<(i64, i64)> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("isolation.level", "read_uncommitted")
        .create()?;
    Ok(consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?)
}

/// Polls the watermarks until `done` holds for them.
fn wait_for_watermarks(
    bootstrap: &str,
    topic: &str,
    what: &str,
    done: impl Fn(i64, i64) -> bool,
) -> Result<(i64, i64)> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (low, high) = watermarks(bootstrap, topic)?;
        if done(low, high) {
            return Ok((low, high));
        }
        if Instant::now() > deadline {
            bail!("{topic}: waited {PATIENCE:?} for {what}; watermarks ({low}, {high})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A consumer assigned at offset 0 with `auto.offset.reset=earliest`: returns the offsets it
/// reads until `end`.
fn consume_from_zero(bootstrap: &str, topic: &str, end: i64) -> Result<Vec<i64>> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "retention-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(0))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + PATIENCE;
    let mut offsets = Vec::new();
    while offsets.last().is_none_or(|o| o + 1 < end) {
        ensure!(
            Instant::now() < deadline,
            "read {offsets:?} of {topic} by now"
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => offsets.push(m.offset()),
            Some(Err(e)) => eprintln!("consumer error (expected once for the reset): {e}"),
            None => {}
        }
    }
    Ok(offsets)
}

fn retention_deletes_old_segments(data_dir: Option<PathBuf>) -> Result<()> {
    retention_deletes_old_segments_of(broker(data_dir)?)
}

fn retention_deletes_old_segments_of(broker: InProcessBroker) -> Result<()> {
    let bootstrap = broker.bootstrap();
    let topic = "retained";
    create_topic(
        &bootstrap,
        topic,
        &[("segment.bytes", "1024"), ("retention.bytes", "4096")],
    )?;
    produce_rounds(&bootstrap, topic, 20, 5)?;
    let (low, high) =
        wait_for_watermarks(&bootstrap, topic, "the log start to move", |l, _| l > 0)?;
    ensure!(high == 100, "high watermark {high}");
    ensure!(low < high, "log start {low} reached the high watermark");
    // The consumer asked for offset 0, got OFFSET_OUT_OF_RANGE and was reset to the (possibly
    // later) log start: it reads a contiguous run from there to the end.
    let offsets = consume_from_zero(&bootstrap, topic, high)?;
    let first = *offsets.first().context("read nothing")?;
    ensure!(
        first >= low,
        "read offset {first} below the log start {low}"
    );
    ensure!(
        offsets == (first..high).collect::<Vec<_>>(),
        "offsets not contiguous from {first}: {offsets:?}"
    );
    Ok(())
}

#[test]
fn retention_bytes_deletes_old_segments_in_memory() -> Result<()> {
    retention_deletes_old_segments(None)
}

#[test]
fn retention_bytes_deletes_old_segments_durable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    retention_deletes_old_segments(Some(dir.path().to_path_buf()))
}

/// The retention interval is an hour here, longer than the test can run: only the rolls past
/// `retention.bytes` can start the passes that move the log start.
#[test]
fn a_roll_past_retention_bytes_trims_without_waiting_for_the_interval_in_memory() -> Result<()> {
    retention_deletes_old_segments_of(broker_checking_every(None, Duration::from_secs(3600))?)
}

#[test]
fn a_roll_past_retention_bytes_trims_without_waiting_for_the_interval_durable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let broker = broker_checking_every(Some(dir.path().to_path_buf()), Duration::from_secs(3600))?;
    retention_deletes_old_segments_of(broker)
}

fn transactional_producer(bootstrap: &str) -> Result<BaseProducer> {
    let producer: BaseProducer = client_config(bootstrap)
        .set("transactional.id", "retention-open-txn")
        .set("transaction.timeout.ms", "600000")
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    Ok(producer)
}

fn retention_stops_at_an_open_transaction(data_dir: Option<PathBuf>) -> Result<()> {
    let broker = broker(data_dir)?;
    let bootstrap = broker.bootstrap();
    let topic = "txn-retained";
    // No retention while the data is written: the first pass after the AlterConfigs below
    // then deletes everything it may in one go.
    create_topic(&bootstrap, topic, &[("segment.bytes", "512")])?;
    produce_rounds(&bootstrap, topic, 5, 3)?;
    let txn = transactional_producer(&bootstrap)?;
    txn.begin_transaction()?;
    txn.send(BaseRecord::to(topic).partition(0).key("t").payload("open"))
        .map_err(|(e, _)| e)?;
    txn.flush(Duration::from_secs(30))?;
    let (_, txn_first) = watermarks(&bootstrap, topic)?;
    let txn_first = txn_first - 1;
    ensure!(txn_first == 15, "transactional record at {txn_first}");
    let records: Vec<TestRecord> = (0..3)
        .map(|i| TestRecord::numbered(0, 100 + i, 100))
        .collect();
    for r in records.chunks(1) {
        produce_acked(&bootstrap, topic, r)?;
    }
    alter(
        &bootstrap,
        topic,
        &[("segment.bytes", "512"), ("retention.bytes", "1")],
    )?;
    let (low, _) =
        wait_for_watermarks(&bootstrap, topic, "retention before the txn", |l, _| l > 0)?;
    ensure!(
        low <= txn_first,
        "log start {low} passed the open transaction at {txn_first}"
    );
    txn.commit_transaction(Duration::from_secs(30))?;
    wait_for_watermarks(
        &bootstrap,
        topic,
        "retention past the committed txn",
        |l, _| l > txn_first,
    )?;
    Ok(())
}

#[test]
fn retention_never_passes_an_open_transaction_in_memory() -> Result<()> {
    retention_stops_at_an_open_transaction(None)
}

#[test]
fn retention_never_passes_an_open_transaction_durable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    retention_stops_at_an_open_transaction(Some(dir.path().to_path_buf()))
}

#[test]
fn configs_and_log_start_survive_a_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let topic = "kept";
    let (low, high) = {
        let broker = broker(Some(dir.path().to_path_buf()))?;
        let bootstrap = broker.bootstrap();
        create_topic(
            &bootstrap,
            topic,
            &[
                ("segment.bytes", "1024"),
                ("retention.bytes", "3000"),
                ("compression.type", "lz4"),
            ],
        )?;
        produce_rounds(&bootstrap, topic, 12, 5)?;
        let w = wait_for_watermarks(&bootstrap, topic, "the log start to move", |l, _| l > 0)?;
        // The only retention after a restart would come from retention.bytes: stop it so the
        // log start after the restart is the one reached here.
        alter(
            &bootstrap,
            topic,
            &[("segment.bytes", "1024"), ("compression.type", "lz4")],
        )?;
        w
    };
    let broker = broker(Some(dir.path().to_path_buf()))?;
    let bootstrap = broker.bootstrap();
    let (low_after, high_after) = watermarks(&bootstrap, topic)?;
    ensure!(
        (low_after, high_after) == (low, high),
        "watermarks ({low}, {high}) became ({low_after}, {high_after}) across the restart"
    );
    let described =
        block_on(admin(&bootstrap)?.describe_configs([&ResourceSpecifier::Topic(topic)], &opts()))?;
    let resource = described
        .into_iter()
        .next()
        .context("no resource")?
        .map_err(|e| anyhow::anyhow!("describe: {e}"))?;
    let entry = |name: &str| resource.entries.iter().find(|e| e.name == name);
    let compression = entry("compression.type").context("compression.type")?;
    ensure!(
        compression.value.as_deref() == Some("lz4")
            && compression.source == ConfigSource::DynamicTopic,
        "{compression:?}"
    );
    let retention = entry("retention.bytes").context("retention.bytes")?;
    ensure!(
        retention.value.as_deref() == Some("-1") && retention.source == ConfigSource::Default,
        "{retention:?}"
    );
    Ok(())
}
