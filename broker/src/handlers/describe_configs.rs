//! DescribeConfigs for topic and broker resources. A topic reports every config it was
//! created with or given by AlterConfigs (source DYNAMIC_TOPIC_CONFIG, including those that
//! are accepted but do not change storage) and the defaults it runs with otherwise (source
//! DEFAULT_CONFIG, or STATIC_BROKER_CONFIG where a broker flag sets them), as Kafka does.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use super::{topic_configs, RequestContext};
use crate::metrics;
use crate::security::AclOperation;
use crate::state::{BrokerState, NODE_ID};

/// Resource type code of a topic.
pub const RESOURCE_TOPIC: i8 = 2;
/// Resource type code of a broker.
pub const RESOURCE_BROKER: i8 = 4;

/// ConfigSource: a config set on the topic.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
/// ConfigSource: a static broker config.
const SOURCE_STATIC_BROKER: i8 = 4;
/// ConfigSource: the default.
const SOURCE_DEFAULT: i8 = 5;

/// ConfigType codes (v3+).
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_DOUBLE: i8 = 6;
const TYPE_LIST: i8 = 7;

struct Entry {
    name: String,
    value: String,
    config_type: i8,
    source: i8,
    read_only: bool,
    doc: &'static str,
    /// The value and source a topic's own setting replaced (its broker-level default).
    replaced: Option<(String, i8)>,
}

fn entry(
    name: &'static str,
    value: impl ToString,
    config_type: i8,
    source: i8,
    doc: &'static str,
) -> Entry {
    Entry {
        name: name.to_string(),
        value: value.to_string(),
        config_type,
        source,
        read_only: true,
        doc,
        replaced: None,
    }
}

/// Broker configs that give a topic config its default, as Kafka lists them among the
/// synonyms of a topic's own setting. retention.ms and retention.bytes have one only when a
/// broker flag sets it: Kafka lists no default synonym for them.
fn broker_synonym(topic_config: &str, default_source: i8) -> Option<&'static str> {
    match topic_config {
        "cleanup.policy" => Some("log.cleanup.policy"),
        "max.message.bytes" => Some("message.max.bytes"),
        "segment.bytes" => Some("log.segment.bytes"),
        "retention.ms" if default_source == SOURCE_STATIC_BROKER => Some("log.retention.ms"),
        "retention.bytes" if default_source == SOURCE_STATIC_BROKER => Some("log.retention.bytes"),
        _ => None,
    }
}

/// The synonyms of `e` (DescribeConfigs v1+ with `include_synonyms`), in Kafka's order of
/// precedence: the topic's own setting, then the broker default it overrides.
fn synonyms(e: &Entry) -> Vec<DescribeConfigsSynonym> {
    let synonym = |name: &str, value: &str, source: i8| {
        DescribeConfigsSynonym::default()
            .with_name(StrBytes::from_string(name.to_string()))
            .with_value(Some(StrBytes::from_string(value.to_string())))
            .with_source(source)
    };
    let mut out = Vec::new();
    if e.source == SOURCE_DYNAMIC_TOPIC {
        out.push(synonym(&e.name, &e.value, SOURCE_DYNAMIC_TOPIC));
    }
    let (value, source) = match &e.replaced {
        Some((value, source)) => (value.as_str(), *source),
        None if e.source != SOURCE_DYNAMIC_TOPIC => (e.value.as_str(), e.source),
        None => return out,
    };
    if let Some(broker_name) = broker_synonym(&e.name, source) {
        out.push(synonym(broker_name, value, source));
    }
    out
}

/// Kafka's defaults of the topic configs this broker accepts and reports without acting on
/// them (so DescribeConfigs lists every topic config, as Kafka does).
const OTHER_TOPIC_DEFAULTS: &[(&str, &str)] = &[
    ("compression.gzip.level", "-1"),
    ("compression.lz4.level", "9"),
    ("compression.zstd.level", "3"),
    ("file.delete.delay.ms", "60000"),
    ("flush.messages", "9223372036854775807"),
    ("flush.ms", "9223372036854775807"),
    ("follower.replication.throttled.replicas", ""),
    ("index.interval.bytes", "4096"),
    ("leader.replication.throttled.replicas", ""),
    ("local.retention.bytes", "-2"),
    ("local.retention.ms", "-2"),
    ("max.compaction.lag.ms", "9223372036854775807"),
    ("message.downconversion.enable", "true"),
    ("message.format.version", "3.0-IV1"),
    ("message.timestamp.after.max.ms", "9223372036854775807"),
    ("message.timestamp.before.max.ms", "9223372036854775807"),
    ("message.timestamp.difference.max.ms", "9223372036854775807"),
    ("min.compaction.lag.ms", "0"),
    ("preallocate", "false"),
    ("remote.log.copy.disable", "false"),
    ("remote.log.delete.on.disable", "false"),
    ("remote.storage.enable", "false"),
    ("segment.index.bytes", "10485760"),
    ("segment.jitter.ms", "0"),
    ("unclean.leader.election.enable", "false"),
];

/// The source of a default that a broker flag may set.
fn broker_source(flag_set: bool) -> i8 {
    if flag_set {
        SOURCE_STATIC_BROKER
    } else {
        SOURCE_DEFAULT
    }
}

/// The configs of `topic`: the defaults it runs with, overridden (and extended) by those set
/// on it.
fn topic_configs(state: &BrokerState, topic: &str) -> Vec<Entry> {
    let defaults = state.store.default_log_config();
    let storage = &state.config.storage;
    let limit = |v: Option<i64>| v.unwrap_or(-1);
    let mut entries = vec![
        entry(
            "cleanup.policy",
            defaults.cleanup_policy,
            TYPE_LIST,
            SOURCE_DEFAULT,
            "delete: retention deletes old segments; compact: the log cleaner compacts.",
        ),
        entry(
            "compression.type",
            "producer",
            TYPE_STRING,
            SOURCE_DEFAULT,
            "Batches are stored as the producer compressed them.",
        ),
        entry(
            "delete.retention.ms",
            defaults.delete_retention_ms,
            TYPE_LONG,
            SOURCE_DEFAULT,
            "How long the cleaner keeps tombstones.",
        ),
        entry(
            "max.message.bytes",
            defaults.max_message_bytes,
            TYPE_INT,
            SOURCE_DEFAULT,
            "Largest record batch Produce accepts (MESSAGE_TOO_LARGE above it).",
        ),
        entry(
            "message.timestamp.type",
            "CreateTime",
            TYPE_STRING,
            SOURCE_DEFAULT,
            "Timestamps are the producer's.",
        ),
        entry(
            "min.cleanable.dirty.ratio",
            defaults.min_cleanable_dirty_ratio,
            TYPE_DOUBLE,
            SOURCE_DEFAULT,
            "The cleaner runs once this share of the log is uncleaned.",
        ),
        entry(
            "min.insync.replicas",
            1,
            TYPE_INT,
            SOURCE_DEFAULT,
            "Single node.",
        ),
        entry(
            "retention.bytes",
            limit(defaults.retention_bytes),
            TYPE_LONG,
            broker_source(storage.retention_bytes.is_some()),
            "Oldest closed segments are deleted while the partition is larger (-1: no limit).",
        ),
        entry(
            "retention.ms",
            limit(defaults.retention_ms),
            TYPE_LONG,
            broker_source(storage.retention_ms.is_some()),
            "Closed segments whose newest record is older are deleted (-1: no limit).",
        ),
        entry(
            "segment.bytes",
            defaults.segment_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Segment roll size.",
        ),
    ];
    entries.push(entry(
        "segment.ms",
        defaults.segment_ms.unwrap_or(i64::MAX),
        TYPE_LONG,
        SOURCE_DEFAULT,
        "Roll a non-empty active segment older than this.",
    ));
    for (name, value) in OTHER_TOPIC_DEFAULTS {
        let config_type = topic_configs::config_type(name).unwrap_or(TYPE_STRING);
        entries.push(entry(
            name,
            value,
            config_type,
            SOURCE_DEFAULT,
            "Accepted and reported; this broker does not act on it.",
        ));
    }
    // Every topic config may be altered (Kafka reports none of them read-only).
    for e in &mut entries {
        e.read_only = false;
    }
    for (name, value) in state.store.topic_configs(topic).unwrap_or_default() {
        let config_type = topic_configs::config_type(&name).unwrap_or(TYPE_STRING);
        match entries.iter_mut().find(|e| e.name == name) {
            Some(e) => {
                let default = std::mem::replace(&mut e.value, value);
                e.replaced = Some((default, e.source));
                e.source = SOURCE_DYNAMIC_TOPIC;
                e.read_only = false;
            }
            None => entries.push(Entry {
                name,
                value,
                config_type,
                source: SOURCE_DYNAMIC_TOPIC,
                read_only: false,
                doc: "Set on the topic; accepted and reported.",
                replaced: None,
            }),
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

fn broker_configs(state: &BrokerState) -> Vec<Entry> {
    let limits = &state.config.connections;
    let listener = format!(
        "PLAINTEXT://{}:{}",
        state.advertised_host, state.advertised_port
    );
    vec![
        entry(
            "advertised.listeners",
            listener,
            TYPE_LIST,
            SOURCE_STATIC_BROKER,
            "What Metadata returns.",
        ),
        entry(
            "auto.create.topics.enable",
            state.config.auto_create_topics,
            TYPE_BOOLEAN,
            SOURCE_STATIC_BROKER,
            "Create topics named by Metadata/Produce.",
        ),
        entry(
            "broker.id",
            NODE_ID,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "The single node.",
        ),
        entry(
            "log.segment.bytes",
            state.config.storage.segment_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Segment roll size.",
        ),
        entry(
            "log.retention.bytes",
            state.config.storage.retention_bytes.unwrap_or(-1),
            TYPE_LONG,
            SOURCE_STATIC_BROKER,
            "Default retention.bytes of topics (--log-retention-bytes).",
        ),
        entry(
            "log.retention.check.interval.ms",
            state
                .config
                .storage
                .retention_check_interval
                .map_or(-1, |d| d.as_millis() as i64),
            TYPE_LONG,
            SOURCE_STATIC_BROKER,
            "How often retention runs (--log-retention-check-interval-ms).",
        ),
        entry(
            "log.retention.ms",
            state.config.storage.retention_ms.unwrap_or(-1),
            TYPE_LONG,
            SOURCE_STATIC_BROKER,
            "Default retention.ms of topics (--log-retention-ms).",
        ),
        entry(
            "message.max.bytes",
            state.config.max_request_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Largest accepted request.",
        ),
        entry(
            "fetch.max.bytes",
            state.config.fetch_max_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Most record bytes one Fetch answer carries (--fetch-max-bytes).",
        ),
        entry(
            "connections.max.idle.ms",
            limits.max_idle.map_or(-1, |d| d.as_millis() as i64),
            TYPE_LONG,
            SOURCE_STATIC_BROKER,
            "Idle connections are closed after this long (--connections-max-idle-ms).",
        ),
        entry(
            "max.connections",
            limits.max_connections,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Connections held at once over all listeners (--max-connections).",
        ),
        entry(
            "max.connections.per.ip",
            limits.max_connections_per_ip,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Connections held at once from one address (--max-connections-per-ip).",
        ),
        entry(
            "sasl.server.max.receive.size",
            limits.sasl_max_receive_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Largest frame before SASL authentication (--sasl-max-receive-bytes).",
        ),
        entry(
            "num.partitions",
            state.config.default_partitions,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Partitions of auto-created topics.",
        ),
        entry(
            "transaction.max.timeout.ms",
            state.config.transactions.max_transaction_timeout_ms,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Largest transaction.timeout.ms a client may ask for.",
        ),
        entry(
            "transactional.id.expiration.ms",
            state.config.transactions.transactional_id_expiration_ms,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Idle transactional ids are forgotten after this long.",
        ),
        entry(
            "socket.request.max.bytes",
            state.config.max_request_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Largest accepted request.",
        ),
    ]
}

/// Answers DescribeConfigs.
pub fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let results = req
        .resources
        .into_iter()
        .map(|resource| {
            let name = resource.resource_name.as_str();
            let access = super::alter_configs::check_config_access(
                state,
                ctx,
                resource.resource_type,
                name,
                AclOperation::DescribeConfigs,
            );
            let configs = match (access, resource.resource_type) {
                (Err(refusal), _) => Err(refusal),
                (Ok(()), RESOURCE_TOPIC) if state.partition_count(name).is_some() => {
                    Ok(topic_configs(state, name))
                }
                (Ok(()), RESOURCE_TOPIC) => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("unknown topic {name:?}"),
                )),
                (Ok(()), RESOURCE_BROKER) if name.is_empty() || name == NODE_ID.to_string() => {
                    Ok(broker_configs(state))
                }
                (Ok(()), RESOURCE_BROKER) => Err((
                    ResponseError::InvalidRequest,
                    format!("unknown broker {name:?}"),
                )),
                (Ok(()), other) => Err((
                    ResponseError::InvalidRequest,
                    format!("resource type {other} is not supported"),
                )),
            };
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            match configs {
                Ok(entries) => result.with_configs(
                    entries
                        .into_iter()
                        .filter(|e| {
                            resource.configuration_keys.as_ref().is_none_or(|keys| {
                                keys.iter().any(|k| k.as_str() == e.name.as_str())
                            })
                        })
                        .map(|e| {
                            let synonyms = if ctx.version >= 1 && req.include_synonyms {
                                synonyms(&e)
                            } else {
                                Vec::new()
                            };
                            DescribeConfigsResourceResult::default()
                                .with_synonyms(synonyms)
                                .with_name(StrBytes::from_string(e.name))
                                .with_value(Some(StrBytes::from_string(e.value)))
                                .with_read_only(e.read_only)
                                .with_config_source(e.source)
                                .with_config_type(e.config_type)
                                .with_documentation(
                                    (ctx.version >= 3 && req.include_documentation)
                                        .then(|| StrBytes::from_static_str(e.doc)),
                                )
                        })
                        .collect(),
                ),
                Err((error, message)) => {
                    metrics::partition_error("DescribeConfigs", error.code());
                    result
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                }
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
