//! DeleteRecords over TCP: rdkafka's `AdminClient::delete_records` moves the log start and
//! the offsets below it become unreadable (Fetch: OFFSET_OUT_OF_RANGE, ListOffsets earliest
//! follows); raw requests at every version cover -1 (the high watermark), an offset beyond
//! the high watermark (OFFSET_OUT_OF_RANGE), unknown topics and partitions
//! (UNKNOWN_TOPIC_OR_PARTITION) and compacted topics (POLICY_VIOLATION). The new log start
//! survives a restart.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use onceflow_broker::storage::StorageConfig;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use onceflow_testkit::raw::{error_code, topic_name, RawClient};
use onceflow_testkit::records::{client_config, produce_acked, TestRecord};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

const POLICY_VIOLATION: i16 = 44;

fn broker(data_dir: Option<std::path::PathBuf>) -> Result<InProcessBroker> {
    InProcessBroker::start(BrokerConfig {
        auto_create_topics: false,
        storage: StorageConfig {
            data_dir,
            // Small segments, so DeleteRecords also removes whole segments.
            segment_bytes: 1024,
            ..StorageConfig::default()
        },
        ..BrokerConfig::default()
    })
}

fn create(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(bootstrap).create()?;
    let mut t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in block_on(admin.create_topics([&t], &opts))? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }
    Ok(())
}

/// Produces `n` records to partition 0 in rounds of 5 (several batches and segments).
fn produce(bootstrap: &str, topic: &str, n: u64) -> Result<()> {
    for round in (0..n).step_by(5) {
        let records: Vec<TestRecord> = (round..(round + 5).min(n))
            .map(|i| TestRecord::numbered(0, i, 100))
            .collect();
        produce_acked(bootstrap, topic, &records)?;
    }
    Ok(())
}

fn low_watermark(bootstrap: &str, topic: &str) -> Result<i64> {
    let consumer: BaseConsumer = client_config(bootstrap).create()?;
    Ok(consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))?
        .0)
}

fn delete_raw(
    client: &mut RawClient,
    version: i16,
    topic: &str,
    partitions: &[(i32, i64)],
) -> Result<DeleteRecordsResponse> {
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&(p, o)| {
                        DeleteRecordsPartition::default()
                            .with_partition_index(p)
                            .with_offset(o)
                    })
                    .collect(),
            )]);
    client.request(&req, version)
}

/// (error code, low watermark) per partition of the only topic of `resp`.
fn results(resp: &DeleteRecordsResponse) -> Vec<(i16, i64)> {
    resp.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.error_code, p.low_watermark))
        .collect()
}

#[test]
fn rdkafka_delete_records_makes_lower_offsets_unreadable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let topic = "deleted";
    {
        let broker = broker(Some(dir.path().to_path_buf()))?;
        let bootstrap = broker.bootstrap();
        create(&bootstrap, topic, 1, &[])?;
        produce(&bootstrap, topic, 40)?;
        let admin: AdminClient<DefaultClientContext> = client_config(&bootstrap).create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Offset(23))?;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let result = block_on(admin.delete_records(&tpl, &opts))?;
        let elem = result.find_partition(topic, 0).context("no result")?;
        elem.error()?;
        ensure!(
            elem.offset() == Offset::Offset(23),
            "low watermark {:?}",
            elem.offset()
        );
        ensure!(low_watermark(&bootstrap, topic)? == 23);
        let mut raw = RawClient::connect(broker.addr())?;
        let (code, _, _) = raw.fetch(11, topic, 0, 22)?;
        ensure!(code == error_code::OFFSET_OUT_OF_RANGE, "fetch 22: {code}");
        let (code, hw, records) = raw.fetch(11, topic, 0, 23)?;
        ensure!(code == error_code::NONE && hw == 40 && !records.is_empty());
        let values = onceflow_testkit::raw::decode_values(records)?;
        ensure!(values.iter().any(|(o, _)| *o == 23), "{values:?}");
    }
    let broker = broker(Some(dir.path().to_path_buf()))?;
    ensure!(
        low_watermark(&broker.bootstrap(), topic)? == 23,
        "log start lost in the restart"
    );
    Ok(())
}

#[test]
fn raw_delete_records_edges_at_every_version() -> Result<()> {
    let broker = broker(None)?;
    let bootstrap = broker.bootstrap();
    create(&bootstrap, "edges", 2, &[])?;
    create(&bootstrap, "compacted", 1, &[("cleanup.policy", "compact")])?;
    produce(&bootstrap, "edges", 20)?;
    let mut raw = RawClient::connect(broker.addr())?;
    for version in 0..=2 {
        // Partition 1 is empty: -1 leaves it at 0; partition 0 goes to 5 + version.
        let resp = delete_raw(
            &mut raw,
            version,
            "edges",
            &[(0, 5 + i64::from(version)), (1, -1)],
        )?;
        ensure!(
            results(&resp) == vec![(0, 5 + i64::from(version)), (0, 0)],
            "v{version}: {:?}",
            results(&resp)
        );
        let resp = delete_raw(&mut raw, version, "edges", &[(0, 21), (0, -7), (9, 1)])?;
        ensure!(
            results(&resp)
                == vec![
                    (error_code::OFFSET_OUT_OF_RANGE, -1),
                    (error_code::OFFSET_OUT_OF_RANGE, -1),
                    (error_code::UNKNOWN_TOPIC_OR_PARTITION, -1)
                ],
            "v{version}: {:?}",
            results(&resp)
        );
        let resp = delete_raw(&mut raw, version, "nope", &[(0, 1)])?;
        ensure!(results(&resp) == vec![(error_code::UNKNOWN_TOPIC_OR_PARTITION, -1)]);
        let resp = delete_raw(&mut raw, version, "compacted", &[(0, 0)])?;
        ensure!(results(&resp) == vec![(POLICY_VIOLATION, -1)]);
    }
    ensure!(low_watermark(&bootstrap, "edges")? == 7);
    let resp = delete_raw(&mut raw, 2, "edges", &[(0, -1)])?;
    ensure!(results(&resp) == vec![(0, 20)], "{:?}", results(&resp));
    let (code, hw, records) = raw.fetch(11, "edges", 0, 20)?;
    ensure!(code == error_code::NONE && hw == 20 && records.is_empty());
    Ok(())
}
