//! Produce never creates a topic, as in Kafka (only Metadata may auto-create one, with Create
//! permission): a Produce to a topic that does not exist gets UNKNOWN_TOPIC_OR_PARTITION and
//! leaves it missing, while a broker with auto-creation on still creates it for Metadata.

use anyhow::{ensure, Context as _, Result};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::MetadataRequest;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{error_code, idempotent_batch, topic_name, RawClient};

/// The error code Metadata v9 answers for `topic`, without asking for auto-creation.
fn topic_error(client: &mut RawClient, topic: &str) -> Result<i16> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic_name(topic)))
        ]))
        .with_allow_auto_topic_creation(false);
    let resp = client.request(&req, 9)?;
    Ok(resp
        .topics
        .first()
        .context("Metadata without the topic")?
        .error_code)
}

#[test]
fn produce_to_a_missing_topic_does_not_create_it() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut client = RawClient::connect(broker.addr())?;
    let topic = "never-created-by-produce";
    let batch = || idempotent_batch(-1, -1, -1, &["v"]);

    let resp = client.produce(9, topic, 0, batch()?)?;
    ensure!(
        resp.error_code == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Produce to a missing topic: {resp:?}"
    );
    let after = topic_error(&mut client, topic)?;
    ensure!(
        after == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "the topic exists after the Produce (Metadata error {after})"
    );

    // Metadata with auto-creation asked for creates it; then Produce appends.
    let md = client.metadata(9, &[topic])?;
    ensure!(
        md.topics[0].error_code == error_code::NONE,
        "{:?}",
        md.topics[0]
    );
    let resp = client.produce(9, topic, 0, batch()?)?;
    ensure!(
        resp.error_code == error_code::NONE,
        "Produce after Metadata: {resp:?}"
    );
    Ok(())
}
