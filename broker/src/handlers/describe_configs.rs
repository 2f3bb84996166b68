//! DescribeConfigs for topic and broker resources: the static configuration this broker
//! actually runs with, enough for kcat and admin clients.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metrics;
use crate::state::{BrokerState, NODE_ID};

/// Resource type code of a topic.
pub const RESOURCE_TOPIC: i8 = 2;
/// Resource type code of a broker.
pub const RESOURCE_BROKER: i8 = 4;

/// ConfigSource: a static broker config.
const SOURCE_STATIC_BROKER: i8 = 4;
/// ConfigSource: the default.
const SOURCE_DEFAULT: i8 = 5;

/// ConfigType codes (v3+).
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;

struct Entry {
    name: &'static str,
    value: String,
    config_type: i8,
    source: i8,
    doc: &'static str,
}

fn entry(
    name: &'static str,
    value: impl ToString,
    config_type: i8,
    source: i8,
    doc: &'static str,
) -> Entry {
    Entry {
        name,
        value: value.to_string(),
        config_type,
        source,
        doc,
    }
}

fn topic_configs(state: &BrokerState) -> Vec<Entry> {
    let segment = state.config.storage.segment_bytes;
    let max_message = state.config.max_request_bytes;
    vec![
        entry(
            "cleanup.policy",
            "delete",
            TYPE_LIST,
            SOURCE_DEFAULT,
            "Only deletion-free append is implemented.",
        ),
        entry(
            "compression.type",
            "producer",
            TYPE_STRING,
            SOURCE_DEFAULT,
            "Batches are stored as the producer compressed them.",
        ),
        entry(
            "max.message.bytes",
            max_message,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Bounded by the broker's max request size.",
        ),
        entry(
            "message.timestamp.type",
            "CreateTime",
            TYPE_STRING,
            SOURCE_DEFAULT,
            "Timestamps are the producer's.",
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
            -1,
            TYPE_LONG,
            SOURCE_DEFAULT,
            "No retention: logs are kept.",
        ),
        entry(
            "retention.ms",
            -1,
            TYPE_LONG,
            SOURCE_DEFAULT,
            "No retention: logs are kept.",
        ),
        entry(
            "segment.bytes",
            segment,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Segment roll size.",
        ),
    ]
}

fn broker_configs(state: &BrokerState) -> Vec<Entry> {
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
            "message.max.bytes",
            state.config.max_request_bytes,
            TYPE_INT,
            SOURCE_STATIC_BROKER,
            "Largest accepted request.",
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
            let configs = match resource.resource_type {
                RESOURCE_TOPIC if state.partition_count(name).is_some() => Ok(topic_configs(state)),
                RESOURCE_TOPIC => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("unknown topic {name:?}"),
                )),
                RESOURCE_BROKER if name.is_empty() || name == NODE_ID.to_string() => {
                    Ok(broker_configs(state))
                }
                RESOURCE_BROKER => Err((
                    ResponseError::InvalidRequest,
                    format!("unknown broker {name:?}"),
                )),
                other => Err((
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
                            resource
                                .configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name))
                        })
                        .map(|e| {
                            DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_static_str(e.name))
                                .with_value(Some(StrBytes::from_string(e.value)))
                                .with_read_only(true)
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
