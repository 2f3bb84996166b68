//! Storage configuration: where the log lives, when segments roll and when data is fsynced.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// When appended data is forced to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// fsync the segment before `Partition::append` returns: every acknowledged batch survives
    /// a kill -9 or power loss.
    #[default]
    EveryBatch,
    /// A background thread started by `Store::open` calls `Store::sync_data` at this interval:
    /// it fsyncs the segments sealed since the last call and the active one, without holding
    /// the partition's lock, so appends never wait for the disk; after a roll it also syncs
    /// the directory and writes the producer-state snapshot the roll left to it.
    Interval(Duration),
    /// Never fsync log data on the append path, not even when a segment is sealed: only
    /// `Store::sync_data` and `Store::flush_all` (shutdown) sync it.
    Never,
}

/// The reason a `--fsync` value was refused (the operator's input error; retrying will not help).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fsync policy {0:?}: expected every-batch, interval-ms:N (N >= 1) or never")]
pub struct ParseFsyncPolicyError(pub String);

impl FromStr for FsyncPolicy {
    type Err = ParseFsyncPolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "every-batch" => Ok(FsyncPolicy::EveryBatch),
            "never" => Ok(FsyncPolicy::Never),
            other => {
                let ms = other
                    .strip_prefix("interval-ms:")
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| ParseFsyncPolicyError(other.to_string()))?;
                Ok(FsyncPolicy::Interval(Duration::from_millis(ms)))
            }
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::EveryBatch => f.write_str("every-batch"),
            FsyncPolicy::Interval(d) => write!(f, "interval-ms:{}", d.as_millis()),
            FsyncPolicy::Never => f.write_str("never"),
        }
    }
}

/// Kafka's default `log.retention.check.interval.ms`: five minutes.
pub const DEFAULT_RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// Default segment size: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Default pause between log-cleaner ticks.
pub const DEFAULT_CLEANER_INTERVAL: Duration = Duration::from_secs(1);

/// Configuration of a [`Store`](super::Store).
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Directory holding the log. `None` selects the in-memory backend, which runs the same
    /// code above the storage seam but keeps nothing across processes.
    pub data_dir: Option<PathBuf>,
    /// Roll to a new segment once the active one would grow past this many bytes.
    pub segment_bytes: u64,
    /// When appended data is fsynced.
    pub fsync: FsyncPolicy,
    /// At open, truncate a partition at an invalid batch that valid data follows (reporting
    /// what is dropped) instead of refusing to open. A torn tail is cut either way.
    pub repair_corrupt_logs: bool,
    /// Broker-wide `retention.ms` of topics that do not set it (`--log-retention-ms`); `None`
    /// keeps records regardless of age (Kafka's -1).
    pub retention_ms: Option<i64>,
    /// Broker-wide `retention.bytes` per partition (`--log-retention-bytes`); `None` keeps
    /// records regardless of size (Kafka's -1, the default).
    pub retention_bytes: Option<i64>,
    /// How often the retention task looks for segments to delete
    /// (`--log-retention-check-interval-ms`, Kafka's `log.retention.check.interval.ms`);
    /// `None` runs no task (callers may call `Store::enforce_retention` themselves).
    pub retention_check_interval: Option<Duration>,
    /// How often the log cleaner looks for partitions to compact and active segments to roll
    /// by `segment.ms`; `None` runs no cleaner (Kafka's `log.cleaner.backoff.ms`).
    pub cleaner_interval: Option<Duration>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: None,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            fsync: FsyncPolicy::default(),
            repair_corrupt_logs: false,
            retention_ms: None,
            retention_bytes: None,
            retention_check_interval: Some(DEFAULT_RETENTION_CHECK_INTERVAL),
            cleaner_interval: Some(DEFAULT_CLEANER_INTERVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_policy_parses_and_displays() {
        assert_eq!("every-batch".parse(), Ok(FsyncPolicy::EveryBatch));
        assert_eq!("never".parse(), Ok(FsyncPolicy::Never));
        assert_eq!(
            "interval-ms:250".parse(),
            Ok(FsyncPolicy::Interval(Duration::from_millis(250)))
        );
        for bad in [
            "",
            "interval-ms:",
            "interval-ms:0",
            "interval-ms:-1",
            "always",
            "interval:5",
        ] {
            assert!(bad.parse::<FsyncPolicy>().is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            FsyncPolicy::Interval(Duration::from_millis(7)).to_string(),
            "interval-ms:7"
        );
    }
}
