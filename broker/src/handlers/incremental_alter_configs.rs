//! IncrementalAlterConfigs (v0..=1) for TOPIC resources: SET (0), DELETE (1, back to the
//! default), APPEND (2) and SUBTRACT (3, list configs only) applied to the topic's current
//! configs. Every operation is checked and the resulting configs validated before anything
//! changes; one bad entry is INVALID_CONFIG for that resource and nothing changes. Resource
//! checks, persistence and `validate_only` as in AlterConfigs.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use super::alter_configs::{admit, apply_topic, refused, Refusal};
use super::{topic_configs, RequestContext};
use crate::state::BrokerState;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// Answers IncrementalAlterConfigs.
pub async fn handle(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut seen = HashSet::new();
    let mut responses = Vec::with_capacity(req.resources.len());
    for resource in req.resources {
        let name = resource.resource_name.to_string();
        let outcome = match admit(state, ctx, &mut seen, resource.resource_type, &name) {
            Err(refusal) => Err(refusal),
            Ok(()) => {
                let current = state.store.topic_configs(&name).unwrap_or_default();
                let default_policy = state.store.default_log_config().cleanup_policy;
                let ops: Vec<Op> = resource
                    .configs
                    .iter()
                    .map(|c| Op {
                        name: c.name.to_string(),
                        operation: c.config_operation,
                        value: c.value.as_ref().map(|v| v.to_string()),
                    })
                    .collect();
                match apply_ops(current, &ops, &default_policy.to_string()) {
                    Ok(configs) => apply_topic(state, &name, configs, req.validate_only).await,
                    Err(refusal) => Err(refusal),
                }
            }
        };
        let response = AlterConfigsResourceResponse::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err((error, message)) => {
                refused("IncrementalAlterConfigs", &name, error, &message);
                response
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message)))
            }
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// One config operation of a resource.
struct Op {
    name: String,
    operation: i8,
    value: Option<String>,
}

/// Applies `ops` to `configs` (a topic's current configs); `default_policy` is the
/// `cleanup.policy` an APPEND or SUBTRACT starts from when the topic does not set it.
fn apply_ops(
    mut configs: BTreeMap<String, String>,
    ops: &[Op],
    default_policy: &str,
) -> Result<BTreeMap<String, String>, Refusal> {
    let invalid = |m: String| (ResponseError::InvalidConfig, m);
    let mut names = HashSet::new();
    for op in ops {
        if !names.insert(op.name.as_str()) {
            return Err((
                ResponseError::InvalidRequest,
                format!("config {:?} listed twice for one resource", op.name),
            ));
        }
        if topic_configs::config_type(&op.name).is_none() {
            return Err(invalid(format!("Unknown topic config name: {}", op.name)));
        }
        match op.operation {
            OP_SET => {
                topic_configs::validate(&op.name, op.value.as_deref())
                    .map_err(|e| invalid(e.to_string()))?;
                configs.insert(op.name.clone(), op.value.clone().unwrap_or_default());
            }
            OP_DELETE => {
                configs.remove(&op.name);
            }
            OP_APPEND | OP_SUBTRACT => {
                if !topic_configs::is_list(&op.name) {
                    let verb = if op.operation == OP_APPEND {
                        "append"
                    } else {
                        "subtract"
                    };
                    return Err(invalid(format!(
                        "Config value {verb} is not allowed for config key: {}",
                        op.name
                    )));
                }
                let Some(value) = &op.value else {
                    return Err(invalid(format!("Null value for config {}", op.name)));
                };
                let base = configs.get(&op.name).cloned().unwrap_or_else(|| {
                    if op.name == "cleanup.policy" {
                        default_policy.to_string()
                    } else {
                        String::new()
                    }
                });
                let mut items: Vec<String> = split_list(&base);
                for item in split_list(value) {
                    if op.operation == OP_APPEND {
                        if !items.contains(&item) {
                            items.push(item);
                        }
                    } else {
                        items.retain(|i| *i != item);
                    }
                }
                let joined = items.join(",");
                topic_configs::validate(&op.name, Some(&joined))
                    .map_err(|e| invalid(e.to_string()))?;
                configs.insert(op.name.clone(), joined);
            }
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {other} for {}", op.name),
                ))
            }
        }
    }
    Ok(configs)
}

fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, operation: i8, value: Option<&str>) -> Op {
        Op {
            name: name.into(),
            operation,
            value: value.map(str::to_string),
        }
    }

    #[test]
    fn set_delete_append_subtract() {
        let mut current = BTreeMap::new();
        current.insert("retention.ms".to_string(), "1000".to_string());
        current.insert("segment.bytes".to_string(), "4096".to_string());
        let out = apply_ops(
            current,
            &[
                op("retention.ms", OP_SET, Some("2000")),
                op("segment.bytes", OP_DELETE, None),
                op("cleanup.policy", OP_APPEND, Some("compact")),
            ],
            "delete",
        )
        .expect("applies");
        assert_eq!(out.get("retention.ms").map(String::as_str), Some("2000"));
        assert_eq!(out.get("segment.bytes"), None);
        assert_eq!(
            out.get("cleanup.policy").map(String::as_str),
            Some("delete,compact")
        );
        let out = apply_ops(
            out,
            &[op("cleanup.policy", OP_SUBTRACT, Some("delete"))],
            "delete",
        )
        .expect("applies");
        assert_eq!(
            out.get("cleanup.policy").map(String::as_str),
            Some("compact")
        );
    }

    #[test]
    fn bad_operations_are_refused() {
        for (ops, code) in [
            (
                vec![op("retention.ms", OP_SET, Some("x"))],
                ResponseError::InvalidConfig,
            ),
            (
                vec![op("nope", OP_SET, Some("1"))],
                ResponseError::InvalidConfig,
            ),
            (
                vec![op("nope", OP_DELETE, None)],
                ResponseError::InvalidConfig,
            ),
            (
                vec![op("retention.ms", OP_APPEND, Some("1"))],
                ResponseError::InvalidConfig,
            ),
            (
                vec![op("cleanup.policy", OP_APPEND, Some("shred"))],
                ResponseError::InvalidConfig,
            ),
            (
                vec![op("retention.ms", 9, Some("1"))],
                ResponseError::InvalidRequest,
            ),
            (
                vec![
                    op("retention.ms", OP_SET, Some("1")),
                    op("retention.ms", OP_DELETE, None),
                ],
                ResponseError::InvalidRequest,
            ),
        ] {
            assert_eq!(
                apply_ops(BTreeMap::new(), &ops, "delete").map_err(|e| e.0),
                Err(code)
            );
        }
    }
}
