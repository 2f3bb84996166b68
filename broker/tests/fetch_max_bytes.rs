//! The broker's `fetch.max.bytes` caps a Fetch answer whatever `max_bytes` the client asks
//! for (1 GiB here), as Kafka does, and DescribeConfigs reports it for the broker.

use anyhow::{ensure, Context as _, Result};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, DescribeConfigsRequest, FetchRequest};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::{decode_values, idempotent_batch, topic_name, RawClient};

const FETCH_MAX: usize = 64 << 10;

#[test]
fn a_one_gib_fetch_gets_at_most_fetch_max_bytes() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig {
        fetch_max_bytes: FETCH_MAX,
        ..BrokerConfig::default()
    })?;
    let mut client = RawClient::connect(broker.addr())?;
    client.metadata(9, &["big"])?;
    // 20 batches of 10 KiB: 200 KiB in the partition.
    let value = "x".repeat(10 << 10);
    for _ in 0..20 {
        let answer = client.produce(9, "big", 0, idempotent_batch(-1, -1, -1, &[&value])?)?;
        ensure!(answer.error_code == 0, "produce: {answer:?}");
    }
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 30)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name("big"))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 30)
                .with_log_start_offset(-1)
                .with_current_leader_epoch(-1)])]);
    let resp = client.request(&req, 11)?;
    let partition = &resp.responses[0].partitions[0];
    ensure!(partition.error_code == 0, "fetch: {}", partition.error_code);
    let records = partition.records.clone().unwrap_or_default();
    ensure!(
        !records.is_empty() && records.len() <= FETCH_MAX,
        "{} record bytes for fetch.max.bytes {FETCH_MAX}",
        records.len()
    );
    ensure!(!decode_values(records)?.is_empty());

    let describe =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_static_str("0"))
            .with_configuration_keys(None)]);
    let resp = client.request(&describe, 4)?;
    let reported = resp.results[0]
        .configs
        .iter()
        .find(|c| c.name.as_str() == "fetch.max.bytes")
        .and_then(|c| c.value.as_ref().map(|v| v.to_string()))
        .context("fetch.max.bytes not reported")?;
    ensure!(reported == FETCH_MAX.to_string(), "reported {reported}");
    Ok(())
}
