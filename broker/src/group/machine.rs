//! Sans-I/O state machine of one classic consumer group: its types, the [`Group`] record and
//! its member bookkeeping.
//!
//! The protocol's phases live in submodules: `machine/join.rs` the JoinGroup phase (joining,
//! preparing a rebalance, the join barrier, protocol selection), `machine/sync.rs` the
//! SyncGroup phase (distributing the leader's assignment); heartbeats, leaving and expiry are
//! in [`super::liveness`].
//!
//! States and transitions follow Apache Kafka's `GroupCoordinator`:
//!
//! ```text
//! Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
//! CompletingRebalance --leader's SyncGroup--> Stable
//! Stable | CompletingRebalance --join, leave, expiry--> PreparingRebalance
//! PreparingRebalance --last member gone--> Empty (generation + 1)
//! ```
//!
//! Requests that must wait (JoinGroup until the rebalance completes, SyncGroup until the
//! leader's assignment arrives) are identified by a caller-chosen [`WaiterId`]; every
//! operation returns the [`Reply`] values that became ready, possibly including the one for
//! the request just made. Time is passed in as milliseconds on any monotonic clock.

mod join;
mod sync;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::member::Member;
use super::{ErrorCode, GroupConfig};

/// Caller-chosen identity of a waiting JoinGroup or SyncGroup request.
pub type WaiterId = u64;

/// No error.
pub(crate) const NONE: ErrorCode = 0;

/// The state of a group (names as Kafka reports them in DescribeGroups / ListGroups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members (offsets may still be stored).
    Empty,
    /// A rebalance started: waiting for members to (re)join.
    PreparingRebalance,
    /// Every member joined: waiting for the leader's assignment.
    CompletingRebalance,
    /// The leader's assignment was distributed.
    Stable,
    /// The group was removed.
    Dead,
}

impl GroupState {
    /// Kafka's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A JoinGroup request, decoded.
#[derive(Debug, Clone)]
pub struct JoinParams {
    /// Empty for a member joining for the first time.
    pub member_id: String,
    /// Static membership id, if the client set `group.instance.id`.
    pub group_instance_id: Option<String>,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// Session timeout asked for, in ms.
    pub session_timeout_ms: i32,
    /// Rebalance timeout asked for, in ms (v0: the session timeout).
    pub rebalance_timeout_ms: i32,
    /// Protocol type (`consumer`).
    pub protocol_type: String,
    /// Supported protocols with metadata, in preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// v4+: a new member must first obtain its id (MEMBER_ID_REQUIRED) and join again.
    pub require_known_member_id: bool,
}

/// One member as the leader sees it in its JoinGroup response.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinedMember {
    /// Member id.
    pub member_id: String,
    /// Static membership id.
    pub group_instance_id: Option<String>,
    /// The member's metadata for the selected protocol.
    pub metadata: Bytes,
}

/// The answer to a JoinGroup request.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinResult {
    /// Error code (0 = none).
    pub error: ErrorCode,
    /// The new generation (-1 on error).
    pub generation_id: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The selected protocol (assignor).
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// The member id of the requester.
    pub member_id: String,
    /// All members with metadata, for the leader only.
    pub members: Vec<JoinedMember>,
}

impl JoinResult {
    /// An error answer.
    pub fn error(member_id: &str, error: ErrorCode) -> Self {
        Self {
            error,
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
        }
    }
}

/// The answer to a SyncGroup request.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResult {
    /// Error code (0 = none).
    pub error: ErrorCode,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The selected protocol.
    pub protocol_name: Option<String>,
    /// This member's assignment, as the leader encoded it.
    pub assignment: Bytes,
}

impl SyncResult {
    /// An error answer.
    pub fn error(error: ErrorCode) -> Self {
        Self {
            error,
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// An answer for a waiting request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Answer to a JoinGroup.
    Join {
        /// The waiting request.
        waiter: WaiterId,
        /// Its answer.
        result: JoinResult,
    },
    /// Answer to a SyncGroup.
    Sync {
        /// The waiting request.
        waiter: WaiterId,
        /// Its answer.
        result: SyncResult,
    },
}

/// One classic consumer group.
#[derive(Debug)]
pub struct Group {
    pub(crate) id: String,
    pub(crate) state: GroupState,
    pub(crate) generation: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) leader: Option<String>,
    /// Members in join order (the first is the leader unless it leaves).
    pub(crate) members: Vec<Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with their expiry deadline.
    pub(crate) pending_members: BTreeMap<String, u64>,
    /// Members that have not sent SyncGroup in this generation yet.
    pub(crate) pending_sync: BTreeSet<String>,
    pub(crate) rebalance_deadline_ms: Option<u64>,
    pub(crate) initial_delay_deadline_ms: Option<u64>,
    pub(crate) initial_delay_remaining_ms: u64,
    pub(crate) new_member_added: bool,
    pub(crate) sync_deadline_ms: Option<u64>,
    pub(crate) config: GroupConfig,
    member_nonce: u64,
    member_seq: u64,
    /// Rebalances started since creation.
    pub(crate) rebalances: u64,
}

impl Group {
    /// A new empty group. `member_nonce` makes the member ids it generates unique across
    /// broker restarts.
    pub fn new(id: &str, config: GroupConfig, member_nonce: u64) -> Self {
        Self {
            id: id.to_owned(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: Vec::new(),
            pending_members: BTreeMap::new(),
            pending_sync: BTreeSet::new(),
            rebalance_deadline_ms: None,
            initial_delay_deadline_ms: None,
            initial_delay_remaining_ms: 0,
            new_member_added: false,
            sync_deadline_ms: None,
            config,
            member_nonce,
            member_seq: 0,
            rebalances: 0,
        }
    }

    /// An empty group restored from disk at `generation`, so that members of earlier
    /// generations stay fenced after a restart.
    pub fn restored(
        id: &str,
        config: GroupConfig,
        member_nonce: u64,
        generation: i32,
        protocol_type: Option<String>,
    ) -> Self {
        let mut group = Self::new(id, config, member_nonce);
        group.generation = generation;
        group.protocol_type = protocol_type.filter(|t| !t.is_empty());
        group
    }

    /// The group id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The current state.
    pub fn state(&self) -> GroupState {
        self.state
    }

    /// The current generation.
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// The protocol type of the group, once a member joined.
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    /// The protocol selected for the current generation.
    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }

    /// The leader's member id.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// The members, in join order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Rebalances started since the group was created here.
    pub fn rebalances(&self) -> u64 {
        self.rebalances
    }

    /// A member by id.
    pub fn member(&self, member_id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.member_id == member_id)
    }

    pub(crate) fn member_mut(&mut self, member_id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.member_id == member_id)
    }

    pub(crate) fn has_member(&self, member_id: &str) -> bool {
        self.member(member_id).is_some()
    }

    fn is_leader(&self, member_id: &str) -> bool {
        self.leader.as_deref() == Some(member_id)
    }

    /// Whether a session timeout is within the configured bounds.
    pub fn session_timeout_valid(config: &GroupConfig, session_timeout_ms: i32) -> bool {
        let Ok(ms) = u64::try_from(session_timeout_ms) else {
            return false;
        };
        let min = u64::try_from(config.min_session_timeout.as_millis()).unwrap_or(u64::MAX);
        let max = u64::try_from(config.max_session_timeout.as_millis()).unwrap_or(u64::MAX);
        (min..=max).contains(&ms)
    }

    /// Records a sign of life from `member_id`.
    pub(crate) fn touch(&mut self, member_id: &str, now_ms: u64) {
        if let Some(member) = self.member_mut(member_id) {
            member.last_heartbeat_ms = now_ms;
        }
    }
}
