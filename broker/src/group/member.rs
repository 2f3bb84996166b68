//! One member of a classic consumer group, as the coordinator tracks it.

use bytes::Bytes;

use super::WaiterId;

/// A member of a group: identity, timeouts, its supported protocols and its assignment.
#[derive(Debug, Clone)]
pub struct Member {
    /// Broker-assigned member id (`client_id-<unique suffix>`).
    pub member_id: String,
    /// Static membership id (KIP-345), recorded and reported; membership stays dynamic.
    pub group_instance_id: Option<String>,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's address as the broker saw it.
    pub client_host: String,
    /// How long the coordinator waits for this member to rejoin during a rebalance, in ms.
    pub rebalance_timeout_ms: u64,
    /// How long the member may go without a heartbeat, in ms.
    pub session_timeout_ms: u64,
    /// The protocol type (`consumer` for consumers).
    pub protocol_type: String,
    /// Supported protocols (assignor names) with their metadata, in preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// The assignment the leader gave this member in the current generation.
    pub assignment: Bytes,
    /// The JoinGroup request of this member waiting for the rebalance to complete.
    pub awaiting_join: Option<WaiterId>,
    /// The SyncGroup request of this member waiting for the leader's assignment.
    pub awaiting_sync: Option<WaiterId>,
    /// When the member last showed life (heartbeat, join, sync, commit), in ms.
    pub last_heartbeat_ms: u64,
    /// True until the member completes its first rebalance.
    pub is_new: bool,
    /// When a new member's pending JoinGroup gives up (Kafka's new-member join timeout).
    pub new_member_deadline_ms: u64,
}

impl Member {
    /// The metadata this member supplied for `protocol`, if it supports it.
    pub fn metadata(&self, protocol: &str) -> Option<&Bytes> {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, metadata)| metadata)
    }

    /// Whether the member supports `protocol`.
    pub fn supports(&self, protocol: &str) -> bool {
        self.metadata(protocol).is_some()
    }

    /// Whether `protocols` equals this member's current protocols (same names, order, bytes).
    pub fn matches(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }

    /// The member's first preferred protocol among `candidates`.
    pub fn vote<'a>(&self, candidates: &'a [String]) -> Option<&'a String> {
        self.protocols
            .iter()
            .find_map(|(name, _)| candidates.iter().find(|c| *c == name))
    }

    /// Whether the session timer may expire this member at `now_ms` (Kafka's
    /// `hasSatisfiedHeartbeat` negated): members waiting in a rebalance are exempt, except new
    /// members, whose JoinGroup is bounded by the new-member timeout instead.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        if self.is_new {
            return now_ms >= self.new_member_deadline_ms;
        }
        if self.awaiting_join.is_some() || self.awaiting_sync.is_some() {
            return false;
        }
        now_ms
            >= self
                .last_heartbeat_ms
                .saturating_add(self.session_timeout_ms)
    }
}
