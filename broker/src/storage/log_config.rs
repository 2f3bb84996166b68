//! A partition's log settings: the subset of Kafka's topic configs that changes what the
//! storage layer does (segment rolls, retention, compaction, record size). Every partition
//! holds one behind a lock, so a config change applies to the next append, roll or cleaner
//! pass without reopening the log.

use std::time::Duration;

/// What happens to old data (`cleanup.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanupPolicy {
    /// `delete`: whole segments past `retention.ms` / `retention.bytes` are deleted.
    pub delete: bool,
    /// `compact`: the cleaner keeps the latest record of each key in closed segments.
    pub compact: bool,
}

impl CleanupPolicy {
    /// Kafka's default, `delete`.
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };
    /// `compact`.
    pub const COMPACT: CleanupPolicy = CleanupPolicy {
        delete: false,
        compact: true,
    };

    /// Parses Kafka's comma-separated list (`delete`, `compact`, `compact,delete`; an empty
    /// value means neither). `None` for an unknown item.
    pub fn parse(value: &str) -> Option<CleanupPolicy> {
        let mut p = CleanupPolicy::default();
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "delete" => p.delete = true,
                "compact" => p.compact = true,
                _ => return None,
            }
        }
        Some(p)
    }
}

impl std::fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.compact, self.delete) {
            (true, true) => f.write_str("compact,delete"),
            (true, false) => f.write_str("compact"),
            (false, true) => f.write_str("delete"),
            (false, false) => Ok(()),
        }
    }
}

/// Kafka's default `delete.retention.ms`: one day.
pub const DEFAULT_DELETE_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Kafka's default `max.message.bytes` (1 MiB plus the batch overhead Kafka allows).
pub const DEFAULT_MAX_MESSAGE_BYTES: i32 = 1_048_588;
/// Kafka's default `min.cleanable.dirty.ratio`.
pub const DEFAULT_MIN_CLEANABLE_DIRTY_RATIO: f64 = 0.5;

/// The log settings of one partition (its topic's configs resolved against the broker's
/// defaults). `None` limits mean unlimited (Kafka's `-1`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `cleanup.policy`.
    pub cleanup_policy: CleanupPolicy,
    /// `retention.ms`: delete a closed segment once its newest record is older than this.
    pub retention_ms: Option<i64>,
    /// `retention.bytes`: delete the oldest closed segments while the log is larger.
    pub retention_bytes: Option<i64>,
    /// `segment.bytes`: roll once the active segment would grow past this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll a non-empty active segment older than this.
    pub segment_ms: Option<i64>,
    /// `delete.retention.ms`: how long the cleaner keeps tombstones (and the markers of
    /// transactions whose data it removed) after they are cleaned once.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`: clean only once this share of the log is uncleaned.
    pub min_cleanable_dirty_ratio: f64,
    /// `max.message.bytes`: largest record batch accepted.
    pub max_message_bytes: i32,
}

impl LogConfig {
    /// The defaults of a broker that rolls segments at `segment_bytes`.
    pub fn with_segment_bytes(segment_bytes: u64) -> LogConfig {
        LogConfig {
            cleanup_policy: CleanupPolicy::DELETE,
            retention_ms: None,
            retention_bytes: None,
            segment_bytes,
            segment_ms: None,
            delete_retention_ms: DEFAULT_DELETE_RETENTION.as_millis() as i64,
            min_cleanable_dirty_ratio: DEFAULT_MIN_CLEANABLE_DIRTY_RATIO,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl LogConfig {
    /// Sets the setting a Kafka topic config names, from a value already checked by the
    /// topic config validator. Returns false for configs that do not change the storage layer
    /// (they are accepted and reported, not applied) and for values that do not parse.
    pub fn apply(&mut self, name: &str, value: &str) -> bool {
        let v = value.trim();
        let long = || v.parse::<i64>().ok();
        let limit = |n: i64| (n >= 0).then_some(n);
        match name {
            "cleanup.policy" => CleanupPolicy::parse(v).map(|p| self.cleanup_policy = p),
            "retention.ms" => long().map(|n| self.retention_ms = limit(n)),
            "retention.bytes" => long().map(|n| self.retention_bytes = limit(n)),
            "segment.bytes" => long()
                .filter(|n| *n > 0)
                .map(|n| self.segment_bytes = n as u64),
            "segment.ms" => long().map(|n| self.segment_ms = limit(n)),
            "delete.retention.ms" => long().map(|n| self.delete_retention_ms = n),
            "min.cleanable.dirty.ratio" => v
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .map(|r| self.min_cleanable_dirty_ratio = r),
            "max.message.bytes" => v.parse::<i32>().ok().map(|n| self.max_message_bytes = n),
            _ => None,
        }
        .is_some()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig::with_segment_bytes(super::config::DEFAULT_SEGMENT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_policy_parses_kafka_lists() {
        assert_eq!(CleanupPolicy::parse("delete"), Some(CleanupPolicy::DELETE));
        assert_eq!(
            CleanupPolicy::parse("compact"),
            Some(CleanupPolicy::COMPACT)
        );
        let both = CleanupPolicy {
            delete: true,
            compact: true,
        };
        assert_eq!(CleanupPolicy::parse("compact,delete"), Some(both));
        assert_eq!(CleanupPolicy::parse("delete, compact"), Some(both));
        assert_eq!(CleanupPolicy::parse(""), Some(CleanupPolicy::default()));
        assert_eq!(CleanupPolicy::parse("compact,shred"), None);
        assert_eq!(both.to_string(), "compact,delete");
    }

    #[test]
    fn topic_configs_apply_to_the_log_settings() {
        let mut c = LogConfig::with_segment_bytes(1024);
        assert!(c.apply("cleanup.policy", "compact"));
        assert!(c.apply("retention.ms", "-1"));
        assert!(c.apply("retention.bytes", "4096"));
        assert!(c.apply("segment.ms", "100"));
        assert!(c.apply("min.cleanable.dirty.ratio", "0.1"));
        assert!(!c.apply("compression.type", "zstd"));
        assert!(!c.apply("retention.ms", "soon"));
        assert_eq!(c.cleanup_policy, CleanupPolicy::COMPACT);
        assert_eq!(c.retention_ms, None);
        assert_eq!(c.retention_bytes, Some(4096));
        assert_eq!(c.segment_ms, Some(100));
        assert_eq!(c.min_cleanable_dirty_ratio, 0.1);
        assert_eq!(c.segment_bytes, 1024);
    }
}
