//! CreatePartitions over TCP with rdkafka's admin client: a topic grows, Metadata shows the
//! new partitions at once, records go to and come back from them (also through a subscribed
//! consumer, which finds them on its next metadata refresh), the error cases change nothing,
//! and a durable broker keeps the new count across a kill -9.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use onceflow_broker::BrokerConfig;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use onceflow_testkit::records::{client_config, produce_acked, read_all, TestRecord};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;

type Admin = AdminClient<DefaultClientContext>;

fn admin(bootstrap: &str) -> Result<Admin> {
    Ok(client_config(bootstrap).create()?)
}

fn opts() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

fn create_topic(admin: &Admin, topic: &str, partitions: i32) -> Result<()> {
    let results = block_on(admin.create_topics(
        [&NewTopic::new(
            topic,
            partitions,
            TopicReplication::Fixed(1),
        )],
        &opts(),
    ))?;
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e:?}"))?;
    }
    Ok(())
}

/// Grows topics with `requests`; returns each topic's error code (None on success).
fn grow(
    admin: &Admin,
    requests: &[NewPartitions<'_>],
    validate_only: bool,
) -> Result<Vec<Option<RDKafkaErrorCode>>> {
    let results =
        block_on(admin.create_partitions(requests.iter(), &opts().validate_only(validate_only)))?;
    Ok(results
        .into_iter()
        .map(|r| r.err().map(|(_, e)| e))
        .collect())
}

/// The partition count Metadata reports for `topic`.
fn partition_count(bootstrap: &str, topic: &str) -> Result<usize> {
    let consumer: BaseConsumer = client_config(bootstrap).create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .context("topic missing from metadata")?;
    ensure!(t.error().is_none(), "metadata error {:?}", t.error());
    Ok(t.partitions().len())
}

/// Writes `per_partition` records to each of `partitions` and reads the whole topic back,
/// record by record.
fn round_trip(bootstrap: &str, topic: &str, partitions: i32, per_partition: u64) -> Result<()> {
    let records: Vec<TestRecord> = (0..partitions)
        .flat_map(|p| (0..per_partition).map(move |i| TestRecord::numbered(p, i, 40)))
        .collect();
    let acked = produce_acked(bootstrap, topic, &records)?;
    for (r, (p, _)) in records.iter().zip(&acked) {
        ensure!(
            *p == r.partition,
            "record for {} landed on {p}",
            r.partition
        );
    }
    let read = read_all(bootstrap, topic, partitions, Duration::from_secs(60))?;
    for r in &records {
        ensure!(
            read.iter()
                .any(|got| got.partition == r.partition && got.matches(r)),
            "record {:?} not read back",
            String::from_utf8_lossy(&r.key)
        );
    }
    Ok(())
}

#[test]
fn rdkafka_create_partitions_grows_a_topic_that_serves_the_new_partitions() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    })?;
    let bs = broker.bootstrap();
    let admin = admin(&bs)?;
    create_topic(&admin, "grow", 2)?;
    round_trip(&bs, "grow", 2, 3)?;

    assert_eq!(
        grow(&admin, &[NewPartitions::new("grow", 5)], false)?,
        vec![None]
    );
    assert_eq!(partition_count(&bs, "grow")?, 5);
    // The old partitions keep their records; the new ones start empty and take writes.
    let read = read_all(&bs, "grow", 5, Duration::from_secs(60))?;
    assert_eq!(read.len(), 6, "{read:?}");
    round_trip(&bs, "grow", 5, 2)?;

    // Assignments naming this broker (node 0, as Metadata says) are accepted.
    let to_broker_0: &[&[i32]] = &[&[0]];
    assert_eq!(
        grow(
            &admin,
            &[NewPartitions::new("grow", 6).assign(to_broker_0)],
            false
        )?,
        vec![None]
    );
    assert_eq!(partition_count(&bs, "grow")?, 6);
    Ok(())
}

#[test]
fn rdkafka_create_partitions_errors_change_nothing() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    })?;
    let bs = broker.bootstrap();
    let admin = admin(&bs)?;
    create_topic(&admin, "fixed", 3)?;

    let other_broker: &[&[i32]] = &[&[1]];
    let too_few: &[&[i32]] = &[&[0]];
    let outcome = grow(
        &admin,
        &[
            NewPartitions::new("fixed", 2),
            NewPartitions::new("missing", 4),
        ],
        false,
    )?;
    assert_eq!(
        outcome,
        vec![
            Some(RDKafkaErrorCode::InvalidPartitions),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition)
        ]
    );
    for (request, want) in [
        (
            NewPartitions::new("fixed", 3),
            RDKafkaErrorCode::InvalidPartitions,
        ),
        (
            NewPartitions::new("fixed", 100_000),
            RDKafkaErrorCode::InvalidPartitions,
        ),
        (
            NewPartitions::new("fixed", 4).assign(other_broker),
            RDKafkaErrorCode::InvalidReplicaAssignment,
        ),
        (
            NewPartitions::new("fixed", 5).assign(too_few),
            RDKafkaErrorCode::InvalidReplicaAssignment,
        ),
    ] {
        assert_eq!(grow(&admin, &[request], false)?, vec![Some(want)]);
    }
    // validate_only answers success and grows nothing; errors still show.
    assert_eq!(
        grow(&admin, &[NewPartitions::new("fixed", 8)], true)?,
        vec![None]
    );
    assert_eq!(
        grow(&admin, &[NewPartitions::new("fixed", 1)], true)?,
        vec![Some(RDKafkaErrorCode::InvalidPartitions)]
    );
    assert_eq!(partition_count(&bs, "fixed")?, 3);
    round_trip(&bs, "fixed", 3, 1)?;
    Ok(())
}

#[test]
fn subscribed_consumer_reads_new_partitions_after_its_metadata_refresh() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    let bs = broker.bootstrap();
    let admin = admin(&bs)?;
    create_topic(&admin, "sub", 1)?;
    let consumer: BaseConsumer = client_config(&bs)
        .set("group.id", "grow-subscriber")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    consumer.subscribe(&["sub"])?;
    // First the group settles on the one partition and reads from it.
    let first = TestRecord::numbered(0, 0, 16);
    produce_acked(&bs, "sub", std::slice::from_ref(&first))?;
    poll_until_read(&consumer, &first)?;
    // Then the topic grows; the consumer finds partition 2 at a metadata refresh (every 2 s
    // in client_config), rebalances and reads the record written there.
    assert_eq!(
        grow(&admin, &[NewPartitions::new("sub", 3)], false)?,
        vec![None]
    );
    let record = TestRecord::numbered(2, 0, 16);
    produce_acked(&bs, "sub", std::slice::from_ref(&record))?;
    poll_until_read(&consumer, &record)
}

/// Polls `consumer` until it delivers `record` (by partition and key); the bound only stops a
/// hung test.
fn poll_until_read(consumer: &BaseConsumer, record: &TestRecord) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if Instant::now() > deadline {
            bail!(
                "the subscribed consumer never read the record of partition {}",
                record.partition
            );
        }
        if let Some(msg) = consumer.poll(Duration::from_millis(200)) {
            let msg = msg?;
            if msg.partition() == record.partition && msg.key() == Some(&record.key[..]) {
                return Ok(());
            }
        }
    }
}

#[test]
fn durable_broker_keeps_new_partitions_across_kill_9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut broker = BrokerProcess::spawn(
        Storage::Durable {
            dir: dir.path().to_path_buf(),
            fsync: "every-batch".into(),
        },
        &["--no-auto-create-topics"],
    )?;
    let bs = broker.bootstrap();
    let admin = admin(bs)?;
    create_topic(&admin, "kept", 1)?;
    assert_eq!(
        grow(&admin, &[NewPartitions::new("kept", 4)], false)?,
        vec![None]
    );
    let records: Vec<TestRecord> = (0..4).map(|p| TestRecord::numbered(p, 0, 32)).collect();
    produce_acked(bs, "kept", &records)?;
    drop(admin);

    broker.restart()?;
    let bs = broker.bootstrap();
    assert_eq!(partition_count(bs, "kept")?, 4);
    let read = read_all(bs, "kept", 4, Duration::from_secs(60))?;
    for r in &records {
        ensure!(
            read.iter()
                .any(|got| got.partition == r.partition && got.matches(r)),
            "record of partition {} lost across the restart: {read:?}",
            r.partition
        );
    }
    Ok(())
}
