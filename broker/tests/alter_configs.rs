//! AlterConfigs and IncrementalAlterConfigs over TCP: rdkafka's `AdminClient::alter_configs`
//! and raw requests at every advertised version change a topic's configs, DescribeConfigs
//! shows them as DYNAMIC_TOPIC_CONFIG, bad types, unknown policies and unknown names are
//! INVALID_CONFIG with nothing changed, `validate_only` changes nothing, unknown topics and
//! broker resources are refused, the changes survive a restart, and max.message.bytes applies
//! to the next Produce.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::incremental_alter_configs_request as incremental;
use kafka_protocol::messages::{AlterConfigsRequest, IncrementalAlterConfigsRequest};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::storage::StorageConfig;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::{block_on, InProcessBroker};
use onceflow_testkit::raw::RawClient;
use onceflow_testkit::records::client_config;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const TOPIC: i8 = 2;
const BROKER: i8 = 4;

fn broker(data_dir: Option<std::path::PathBuf>) -> Result<InProcessBroker> {
    InProcessBroker::start(BrokerConfig {
        auto_create_topics: false,
        storage: StorageConfig {
            data_dir,
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

fn create(bootstrap: &str, topic: &str) -> Result<()> {
    let t = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for r in block_on(admin(bootstrap)?.create_topics([&t], &opts()))? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }
    Ok(())
}

/// The topic's configs set on it (source DYNAMIC_TOPIC_CONFIG), name -> value.
fn dynamic_configs(bootstrap: &str, topic: &str) -> Result<BTreeMap<String, String>> {
    let described =
        block_on(admin(bootstrap)?.describe_configs([&ResourceSpecifier::Topic(topic)], &opts()))?;
    let resource = described
        .into_iter()
        .next()
        .context("no resource")?
        .map_err(|e| anyhow::anyhow!("describe {topic}: {e}"))?;
    resource
        .entries
        .into_iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic)
        .map(|e| {
            ensure!(!e.is_read_only, "{e:?} is read-only");
            Ok((e.name, e.value.unwrap_or_default()))
        })
        .collect::<Result<_>>()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Alters through rdkafka. Its `AlterConfigsFuture` (rdkafka 0.39, admin.rs) reports every
/// resource as `Ok` whatever error code the broker answered, so the refusals' codes are
/// checked with raw requests below and here only that nothing changed.
fn rdkafka_alter(
    bootstrap: &str,
    topic: &str,
    pairs: &[(&str, &str)],
    opts: &AdminOptions,
) -> Result<Option<RDKafkaErrorCode>> {
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in pairs {
        alter = alter.set(k, v);
    }
    let results = block_on(admin(bootstrap)?.alter_configs([&alter], opts))?;
    let r = results.into_iter().next().context("no result")?;
    Ok(r.err().map(|(_, code)| code))
}

#[test]
fn rdkafka_alter_configs_changes_and_refuses_as_kafka() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let topic = "altered";
    let wanted = map(&[
        ("retention.ms", "3600000"),
        ("cleanup.policy", "compact,delete"),
        ("compression.type", "zstd"),
    ]);
    {
        let broker = broker(Some(dir.path().to_path_buf()))?;
        let b = broker.bootstrap();
        create(&b, topic)?;
        let pairs: Vec<(&str, &str)> = wanted.iter().map(|(k, v)| (&**k, &**v)).collect();
        ensure!(rdkafka_alter(&b, topic, &pairs, &opts())?.is_none());
        ensure!(dynamic_configs(&b, topic)? == wanted);
        for bad in [
            vec![("retention.ms", "soon")],
            vec![("cleanup.policy", "shred")],
            vec![("retention.ms", "1000"), ("dummy.doesntexist", "1")],
            vec![("segment.bytes", "99999999999")],
        ] {
            rdkafka_alter(&b, topic, &bad, &opts())?;
            ensure!(
                dynamic_configs(&b, topic)? == wanted,
                "{bad:?} changed something"
            );
        }
        let validate_only = opts().validate_only(true);
        ensure!(rdkafka_alter(&b, topic, &[("retention.ms", "1")], &validate_only)?.is_none());
        ensure!(
            dynamic_configs(&b, topic)? == wanted,
            "validate_only changed something"
        );
        let mut raw = RawClient::connect(broker.addr())?;
        for (bad, want) in [
            (vec![("retention.ms", Some("soon"))], INVALID_CONFIG),
            (vec![("cleanup.policy", Some("shred"))], INVALID_CONFIG),
            (
                vec![
                    ("retention.ms", Some("1000")),
                    ("dummy.doesntexist", Some("1")),
                ],
                INVALID_CONFIG,
            ),
        ] {
            let code = alter_raw(&mut raw, 1, TOPIC, "altered", &bad)?;
            ensure!(code == want, "{bad:?}: {code}");
        }
        ensure!(
            dynamic_configs(&b, topic)? == wanted,
            "a refused change changed something"
        );
    }
    let broker = broker(Some(dir.path().to_path_buf()))?;
    ensure!(
        dynamic_configs(&broker.bootstrap(), topic)? == wanted,
        "configs lost in the restart"
    );
    Ok(())
}

fn alter_raw(
    raw: &mut RawClient,
    version: i16,
    resource_type: i8,
    name: &'static str,
    pairs: &[(&'static str, Option<&'static str>)],
) -> Result<i16> {
    let req = AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_static_str(name))
        .with_configs(
            pairs
                .iter()
                .map(|(k, v)| {
                    AlterableConfig::default()
                        .with_name(StrBytes::from_static_str(k))
                        .with_value(v.map(StrBytes::from_static_str))
                })
                .collect(),
        )]);
    let resp = raw.request(&req, version)?;
    Ok(resp.responses.first().context("no response")?.error_code)
}

fn incremental_raw(
    raw: &mut RawClient,
    version: i16,
    resource_type: i8,
    name: &'static str,
    ops: &[(&'static str, i8, Option<&'static str>)],
) -> Result<i16> {
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental::AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_static_str(name))
            .with_configs(
                ops.iter()
                    .map(|(k, op, v)| {
                        incremental::AlterableConfig::default()
                            .with_name(StrBytes::from_static_str(k))
                            .with_config_operation(*op)
                            .with_value(v.map(StrBytes::from_static_str))
                    })
                    .collect(),
            ),
    ]);
    let resp = raw.request(&req, version)?;
    Ok(resp.responses.first().context("no response")?.error_code)
}

#[test]
fn raw_alter_and_incremental_alter_at_every_version() -> Result<()> {
    let broker = broker(None)?;
    let b = broker.bootstrap();
    create(&b, "raw")?;
    let mut raw = RawClient::connect(broker.addr())?;
    for version in 0..=2 {
        let code = alter_raw(
            &mut raw,
            version,
            TOPIC,
            "raw",
            &[("retention.bytes", Some("5000"))],
        )?;
        ensure!(code == 0, "AlterConfigs v{version}: {code}");
        ensure!(dynamic_configs(&b, "raw")? == map(&[("retention.bytes", "5000")]));
        for (bad, want) in [
            (vec![("retention.bytes", None)], INVALID_CONFIG),
            (vec![("nope", Some("1"))], INVALID_CONFIG),
        ] {
            let code = alter_raw(&mut raw, version, TOPIC, "raw", &bad)?;
            ensure!(code == want, "AlterConfigs v{version} {bad:?}: {code}");
        }
        let code = alter_raw(
            &mut raw,
            version,
            TOPIC,
            "nope",
            &[("retention.ms", Some("1"))],
        )?;
        ensure!(code == UNKNOWN_TOPIC_OR_PARTITION, "v{version}: {code}");
        let code = alter_raw(
            &mut raw,
            version,
            BROKER,
            "0",
            &[("log.retention.ms", Some("1"))],
        )?;
        ensure!(code == INVALID_REQUEST, "v{version} broker: {code}");
        ensure!(dynamic_configs(&b, "raw")? == map(&[("retention.bytes", "5000")]));
    }
    for version in 0..=1 {
        let reset = alter_raw(
            &mut raw,
            0,
            TOPIC,
            "raw",
            &[("retention.bytes", Some("5000"))],
        )?;
        ensure!(reset == 0);
        let code = incremental_raw(
            &mut raw,
            version,
            TOPIC,
            "raw",
            &[
                ("retention.ms", 0, Some("60000")),
                ("cleanup.policy", 2, Some("compact")),
                ("retention.bytes", 1, None),
            ],
        )?;
        ensure!(code == 0, "IncrementalAlterConfigs v{version}: {code}");
        let want = map(&[
            ("cleanup.policy", "delete,compact"),
            ("retention.ms", "60000"),
        ]);
        ensure!(dynamic_configs(&b, "raw")? == want, "v{version}");
        let code = incremental_raw(
            &mut raw,
            version,
            TOPIC,
            "raw",
            &[("cleanup.policy", 3, Some("delete"))],
        )?;
        ensure!(code == 0);
        let want = map(&[("cleanup.policy", "compact"), ("retention.ms", "60000")]);
        ensure!(dynamic_configs(&b, "raw")? == want, "v{version} subtract");
        for ops in [
            vec![("retention.ms", 2, Some("5"))],
            vec![("cleanup.policy", 2, Some("shred"))],
            vec![
                ("retention.ms", 0, Some("x")),
                ("segment.bytes", 0, Some("1024")),
            ],
            vec![("no.such.config", 1, None)],
        ] {
            let code = incremental_raw(&mut raw, version, TOPIC, "raw", &ops)?;
            ensure!(code == INVALID_CONFIG, "v{version} {ops:?}: {code}");
            ensure!(
                dynamic_configs(&b, "raw")? == want,
                "v{version} {ops:?} changed something"
            );
        }
        let code = incremental_raw(
            &mut raw,
            version,
            TOPIC,
            "gone",
            &[("retention.ms", 0, Some("1"))],
        )?;
        ensure!(code == UNKNOWN_TOPIC_OR_PARTITION);
        let code = incremental_raw(
            &mut raw,
            version,
            BROKER,
            "0",
            &[("log.retention.ms", 0, Some("1"))],
        )?;
        ensure!(code == INVALID_REQUEST);
    }
    Ok(())
}

#[test]
fn max_message_bytes_applies_to_produce_at_once() -> Result<()> {
    const MESSAGE_TOO_LARGE: i16 = 10;
    let broker = broker(None)?;
    let b = broker.bootstrap();
    create(&b, "sized")?;
    let mut raw = RawClient::connect(broker.addr())?;
    let big = "x".repeat(2000);
    let batch = onceflow_testkit::raw::idempotent_batch(-1, -1, -1, &[big.as_str()])?;
    ensure!(raw.produce(9, "sized", 0, batch.clone())?.error_code == 0);
    let code = alter_raw(
        &mut raw,
        1,
        TOPIC,
        "sized",
        &[("max.message.bytes", Some("1000"))],
    )?;
    ensure!(code == 0);
    let refused = raw.produce(9, "sized", 0, batch.clone())?;
    ensure!(refused.error_code == MESSAGE_TOO_LARGE, "{refused:?}");
    let small = onceflow_testkit::raw::idempotent_batch(-1, -1, -1, &["small"])?;
    ensure!(raw.produce(9, "sized", 0, small)?.error_code == 0);
    let code = incremental_raw(
        &mut raw,
        1,
        TOPIC,
        "sized",
        &[("max.message.bytes", 1, None)],
    )?;
    ensure!(code == 0);
    let accepted = raw.produce(9, "sized", 0, batch)?;
    ensure!(
        accepted.error_code == 0 && accepted.base_offset == 2,
        "{accepted:?}"
    );
    Ok(())
}
