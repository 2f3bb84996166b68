//! Validation of the topic configs that CreateTopics, AlterConfigs and
//! IncrementalAlterConfigs carry, as Kafka's `LogConfig` does: an unknown name, a null value
//! or a value of the wrong type or range is INVALID_CONFIG for that topic. Every accepted
//! config is persisted with the topic and reported by DescribeConfigs; those that change the
//! log (`LogConfig::apply`) are applied to the topic's partitions, the others only reported.

/// Why a topic config entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicConfigError {
    /// Not a Kafka topic config.
    #[error("Unknown topic config name: {0}")]
    Unknown(String),
    /// Kafka refuses null values in CreateTopics.
    #[error("Null value not supported for topic configs: {0}")]
    Null(String),
    /// Known name, bad value.
    #[error("Invalid value {value} for configuration {name}: {reason}")]
    Invalid {
        /// Config name.
        name: String,
        /// Value as sent.
        value: String,
        /// What is expected.
        reason: String,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, TopicConfigError>;

/// How a config's value is checked.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// 32-bit integer at least the bound.
    Int(i32),
    /// 64-bit integer at least the bound.
    Long(i64),
    /// `true` or `false` (any case).
    Bool,
    /// A number in the closed range.
    Double(f64, f64),
    /// One of these (case-sensitive, as Kafka's validators).
    OneOf(&'static [&'static str]),
    /// A comma-separated list of these (an empty value is the empty list).
    ListOf(&'static [&'static str]),
    /// Any string.
    Any,
}

/// Kafka's topic configs (`TopicConfig`, Kafka 3.x/4.x) with their validators.
const TOPIC_CONFIGS: &[(&str, Kind)] = &[
    ("cleanup.policy", Kind::ListOf(&["delete", "compact"])),
    (
        "compression.type",
        Kind::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
    ),
    ("compression.gzip.level", Kind::Int(-1)),
    ("compression.lz4.level", Kind::Int(1)),
    ("compression.zstd.level", Kind::Int(i32::MIN)),
    ("delete.retention.ms", Kind::Long(0)),
    ("file.delete.delay.ms", Kind::Long(0)),
    ("flush.messages", Kind::Long(1)),
    ("flush.ms", Kind::Long(0)),
    ("follower.replication.throttled.replicas", Kind::Any),
    ("index.interval.bytes", Kind::Int(0)),
    ("leader.replication.throttled.replicas", Kind::Any),
    ("local.retention.bytes", Kind::Long(-2)),
    ("local.retention.ms", Kind::Long(-2)),
    ("max.compaction.lag.ms", Kind::Long(1)),
    ("max.message.bytes", Kind::Int(0)),
    ("message.downconversion.enable", Kind::Bool),
    ("message.format.version", Kind::Any),
    ("message.timestamp.after.max.ms", Kind::Long(0)),
    ("message.timestamp.before.max.ms", Kind::Long(0)),
    ("message.timestamp.difference.max.ms", Kind::Long(0)),
    (
        "message.timestamp.type",
        Kind::OneOf(&["CreateTime", "LogAppendTime"]),
    ),
    ("min.cleanable.dirty.ratio", Kind::Double(0.0, 1.0)),
    ("min.compaction.lag.ms", Kind::Long(0)),
    ("min.insync.replicas", Kind::Int(1)),
    ("preallocate", Kind::Bool),
    ("remote.log.copy.disable", Kind::Bool),
    ("remote.log.delete.on.disable", Kind::Bool),
    ("remote.storage.enable", Kind::Bool),
    ("retention.bytes", Kind::Long(i64::MIN)),
    ("retention.ms", Kind::Long(-1)),
    ("segment.bytes", Kind::Int(14)),
    ("segment.index.bytes", Kind::Int(4)),
    ("segment.jitter.ms", Kind::Long(0)),
    ("segment.ms", Kind::Long(1)),
    ("unclean.leader.election.enable", Kind::Bool),
];

/// DescribeConfigs' ConfigType code of a known topic config (BOOLEAN 1, STRING 2, INT 3,
/// LONG 5, DOUBLE 6, LIST 7), or `None` for an unknown name.
pub fn config_type(name: &str) -> Option<i8> {
    let kind = TOPIC_CONFIGS.iter().find(|(n, _)| *n == name)?.1;
    Some(match kind {
        Kind::Bool => 1,
        Kind::OneOf(_) | Kind::Any => 2,
        Kind::Int(_) => 3,
        Kind::Long(_) => 5,
        Kind::Double(..) => 6,
        Kind::ListOf(_) => 7,
    })
}

/// Whether the config's value is a comma-separated list (IncrementalAlterConfigs' APPEND and
/// SUBTRACT apply only to those).
pub fn is_list(name: &str) -> bool {
    config_type(name) == Some(7)
}

/// Checks one config entry.
pub fn validate(name: &str, value: Option<&str>) -> Result<()> {
    let kind = TOPIC_CONFIGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
        .ok_or_else(|| TopicConfigError::Unknown(name.to_string()))?;
    let value = value.ok_or_else(|| TopicConfigError::Null(name.to_string()))?;
    let invalid = |reason: String| TopicConfigError::Invalid {
        name: name.to_string(),
        value: value.to_string(),
        reason,
    };
    let v = value.trim();
    match kind {
        Kind::Int(min) => match v.parse::<i32>() {
            Ok(n) if n >= min => Ok(()),
            Ok(_) => Err(invalid(format!("Value must be at least {min}"))),
            Err(_) => Err(invalid("Expected value to be a 32-bit integer".into())),
        },
        Kind::Long(min) => match v.parse::<i64>() {
            Ok(n) if n >= min => Ok(()),
            Ok(_) => Err(invalid(format!("Value must be at least {min}"))),
            Err(_) => Err(invalid("Expected value to be a 64-bit integer".into())),
        },
        Kind::Bool if v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("false") => Ok(()),
        Kind::Bool => Err(invalid("Expected value to be either true or false".into())),
        Kind::Double(lo, hi) => match v.parse::<f64>() {
            Ok(x) if (lo..=hi).contains(&x) => Ok(()),
            _ => Err(invalid(format!("Value must be a number in [{lo}, {hi}]"))),
        },
        Kind::OneOf(allowed) if allowed.contains(&v) => Ok(()),
        Kind::OneOf(allowed) => Err(invalid(format!(
            "String must be one of: {}",
            allowed.join(", ")
        ))),
        Kind::ListOf(allowed) => {
            let ok = v.is_empty()
                || v.split(',')
                    .map(str::trim)
                    .all(|item| allowed.contains(&item));
            if ok {
                Ok(())
            } else {
                Err(invalid(format!(
                    "Each item must be one of: {}",
                    allowed.join(", ")
                )))
            }
        }
        Kind::Any => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_configs_with_good_values_pass() {
        for (n, v) in [
            ("cleanup.policy", "compact,delete"),
            ("cleanup.policy", "delete"),
            ("cleanup.policy", ""),
            ("retention.ms", "-1"),
            ("retention.bytes", "1073741824"),
            ("segment.bytes", "1048576"),
            ("min.insync.replicas", "2"),
            ("compression.type", "lz4"),
            ("max.message.bytes", "1048588"),
            ("message.timestamp.type", "LogAppendTime"),
            ("delete.retention.ms", "900"),
            ("preallocate", "TRUE"),
            ("min.cleanable.dirty.ratio", "0.5"),
        ] {
            assert_eq!(validate(n, Some(v)), Ok(()), "{n}={v}");
        }
    }

    #[test]
    fn unknown_null_and_bad_values_are_refused() {
        assert_eq!(
            validate("dummy.doesntexist", Some("x")),
            Err(TopicConfigError::Unknown("dummy.doesntexist".into()))
        );
        assert_eq!(
            validate("retention.ms", None),
            Err(TopicConfigError::Null("retention.ms".into()))
        );
        for (n, v) in [
            ("retention.ms", "soon"),
            ("retention.ms", "-2"),
            ("min.insync.replicas", "0"),
            ("segment.bytes", "99999999999"),
            ("compression.type", "brotli"),
            ("cleanup.policy", "delete,shred"),
            ("message.timestamp.type", "createtime"),
            ("preallocate", "yes"),
            ("min.cleanable.dirty.ratio", "1.5"),
        ] {
            assert!(
                matches!(validate(n, Some(v)), Err(TopicConfigError::Invalid { .. })),
                "{n}={v}"
            );
        }
    }
}
