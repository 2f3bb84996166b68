//! CreateTopics validates config entries as Kafka does (librdkafka test 0081): an unknown
//! config name, a null value or a bad value is INVALID_CONFIG (40) for that topic only, also
//! with validate_only; the topic configs clients commonly send are accepted.

use std::time::Duration;

use anyhow::{ensure, Result};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::{CreateTopicsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use onceflow_testkit::raw::RawClient;
use onceflow_testkit::records::client_config;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

const INVALID_CONFIG: i16 = 40;

fn broker() -> Result<InProcessBroker> {
    InProcessBroker::start(BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    })
}

fn topic_exists(bootstrap: &str, topic: &str) -> Result<bool> {
    let consumer: BaseConsumer = client_config(bootstrap).create()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(md.topics().iter().any(|t| t.name() == topic))
}

#[test]
fn rdkafka_create_topics_refuses_invalid_configs_per_topic() -> Result<()> {
    let broker = broker()?;
    let admin: AdminClient<DefaultClientContext> = client_config(&broker.bootstrap()).create()?;
    let good = NewTopic::new("cfg-good", 2, TopicReplication::Fixed(3))
        .set("compression.type", "lz4")
        .set("delete.retention.ms", "900")
        .set("cleanup.policy", "compact,delete")
        .set("retention.ms", "604800000")
        .set("retention.bytes", "-1")
        .set("segment.bytes", "1048576")
        .set("min.insync.replicas", "2")
        .set("max.message.bytes", "1048588")
        .set("message.timestamp.type", "CreateTime");
    let unknown = NewTopic::new("cfg-unknown", 1, TopicReplication::Fixed(1))
        .set("compression.type", "lz4")
        .set("dummy.doesntexist", "broker is verifying this");
    let bad_number =
        NewTopic::new("cfg-bad-number", 1, TopicReplication::Fixed(1)).set("retention.ms", "soon");
    let bad_choice = NewTopic::new("cfg-bad-choice", 1, TopicReplication::Fixed(1))
        .set("message.timestamp.type", "WallClock");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results =
        block_on(admin.create_topics([&good, &unknown, &bad_number, &bad_choice], &opts))?;
    let outcome: Vec<(String, Option<RDKafkaErrorCode>)> = results
        .into_iter()
        .map(|r| match r {
            Ok(name) => (name, None),
            Err((name, code)) => (name, Some(code)),
        })
        .collect();
    let want = vec![
        ("cfg-good".to_string(), None),
        (
            "cfg-unknown".to_string(),
            Some(RDKafkaErrorCode::InvalidConfig),
        ),
        (
            "cfg-bad-number".to_string(),
            Some(RDKafkaErrorCode::InvalidConfig),
        ),
        (
            "cfg-bad-choice".to_string(),
            Some(RDKafkaErrorCode::InvalidConfig),
        ),
    ];
    ensure!(outcome == want, "CreateTopics answered {outcome:?}");
    ensure!(
        topic_exists(&broker.bootstrap(), "cfg-good")?,
        "cfg-good was not created"
    );
    for refused in ["cfg-unknown", "cfg-bad-number", "cfg-bad-choice"] {
        ensure!(
            !topic_exists(&broker.bootstrap(), refused)?,
            "{refused} was created despite INVALID_CONFIG"
        );
    }

    // validate_only checks configs too.
    let opts = opts.validate_only(true);
    let probe = NewTopic::new("cfg-probe", 1, TopicReplication::Fixed(1))
        .set("segment.bytes", "not-a-number");
    let results = block_on(admin.create_topics([&probe], &opts))?;
    ensure!(
        matches!(&results[..], [Err((_, RDKafkaErrorCode::InvalidConfig))]),
        "validate_only answered {results:?}"
    );
    Ok(())
}

#[test]
fn raw_create_topics_refuses_a_null_config_value() -> Result<()> {
    let broker = broker()?;
    let mut raw = RawClient::connect(broker.addr())?;
    let topic = |name: &'static str, value: Option<&'static str>| {
        CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(name)))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("retention.ms"))
                .with_value(value.map(StrBytes::from_static_str))])
    };
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            topic("cfg-null", None),
            topic("cfg-set", Some("1000")),
        ]);
    let resp = raw.request(&req, 7)?;
    let codes: Vec<(String, i16)> = resp
        .topics
        .iter()
        .map(|t| (t.name.0.to_string(), t.error_code))
        .collect();
    ensure!(
        codes
            == [
                ("cfg-null".to_string(), INVALID_CONFIG),
                ("cfg-set".to_string(), 0)
            ],
        "CreateTopics answered {codes:?}"
    );
    let msg = resp.topics[0].error_message.as_ref().map(|m| m.to_string());
    ensure!(
        msg.as_deref().is_some_and(|m| m.contains("retention.ms")),
        "error message {msg:?}"
    );
    Ok(())
}
