//! Consumer group coordinator (Kafka's classic group protocol) and the group offsets store.
//!
//! The coordinator is split the way the rest of the broker is:
//!
//! - [`machine`] and [`liveness`] hold a sans-I/O state machine for one group
//!   ([`Group`]): members, generations, the JoinGroup / SyncGroup barrier, heartbeats,
//!   session and rebalance timeouts. It takes the current time as an argument and answers
//!   with [`Reply`] values addressed to waiting requests, so it is unit-tested with a fake
//!   clock and no runtime.
//! - [`offsets`] is the committed-offsets store, including transactional offsets that stay
//!   pending until their transaction's marker (`stage_txn_offsets` / `complete_txn`), and
//!   [`offsets_log`] its append-only, checksummed file in the data directory.
//! - [`coordinator`] is the thin async layer: a map of groups behind a mutex, one oneshot
//!   channel per waiting JoinGroup / SyncGroup request, a tokio timer task for expiry, and
//!   metrics.
//!
//! The broker never computes partition assignments: the group leader's client does (range,
//! roundrobin, cooperative-sticky) and the coordinator relays its bytes.

pub mod coordinator;
#[cfg(test)]
mod coordinator_tests;
pub mod liveness;
pub mod machine;
#[cfg(test)]
mod machine_proptest;
#[cfg(test)]
mod machine_tests;
pub mod member;
pub mod offsets;
pub mod offsets_log;

pub use coordinator::GroupCoordinator;
pub use machine::{
    Group, GroupState, JoinParams, JoinResult, JoinedMember, Reply, SyncResult, WaiterId,
};
pub use member::Member;
pub use offsets::{CommittedOffset, OffsetStore, TopicPartition};

use std::time::Duration;

/// A Kafka protocol error code (0 = none), as carried in responses.
pub type ErrorCode = i16;

/// Errors of the group coordinator's persistence. Protocol-level refusals are not errors
/// here: they are Kafka error codes in the replies.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// Reading or writing the offsets file failed (an external fault; retry may help).
    #[error("group offsets file {path}: {source}")]
    Io {
        /// The file concerned.
        path: std::path::PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The offsets file holds a record that passes its checksum but cannot be decoded
    /// (a bug or a file from an incompatible version; retrying will not help).
    #[error("group offsets file {path}: corrupt record at byte {position}: {reason}")]
    Corrupt {
        /// The file concerned.
        path: std::path::PathBuf,
        /// Byte position of the record.
        position: u64,
        /// What was wrong.
        reason: String,
    },
    /// The offsets file holds damage followed by valid records (external; the operator decides,
    /// with `--repair-corrupt-logs`, whether to drop the damaged bytes).
    #[error("group offsets file is corrupt: {0}")]
    CorruptLog(#[from] crate::framed_log::CorruptLog),
    /// The store was closed by a broker shutdown.
    #[error("group offsets store is closed")]
    Closed,
}

/// Result type of the group coordinator.
pub type Result<T> = std::result::Result<T, GroupError>;

/// Tunables of the group coordinator (Kafka's `group.*` broker settings).
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Smallest session timeout a member may ask for (Kafka `group.min.session.timeout.ms`).
    pub min_session_timeout: Duration,
    /// Largest session timeout a member may ask for (Kafka `group.max.session.timeout.ms`).
    pub max_session_timeout: Duration,
    /// How long the first rebalance of an empty group waits for more members
    /// (Kafka `group.initial.rebalance.delay.ms`; Kafka's default is 3 s, ours 0 so that
    /// tests and single-machine runs form groups at once).
    pub initial_rebalance_delay: Duration,
    /// How long a new member's JoinGroup may wait before the member is dropped (Kafka: 5 min).
    pub new_member_join_timeout: Duration,
    /// Largest number of members in a group (Kafka `group.max.size`).
    pub max_size: usize,
    /// Largest committed metadata string (Kafka `offset.metadata.max.bytes`).
    pub max_metadata_bytes: usize,
    /// How often the timer task checks for expired members and rebalance deadlines.
    pub tick_interval: Duration,
    /// Open an offsets file holding damage followed by valid records by dropping the damaged
    /// bytes (reported at error level and in metrics) instead of refusing to start.
    pub repair_corrupt_logs: bool,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session_timeout: Duration::from_millis(6_000),
            max_session_timeout: Duration::from_millis(1_800_000),
            initial_rebalance_delay: Duration::ZERO,
            new_member_join_timeout: Duration::from_millis(300_000),
            max_size: 1_000,
            max_metadata_bytes: 4_096,
            tick_interval: Duration::from_millis(50),
            repair_corrupt_logs: false,
        }
    }
}
