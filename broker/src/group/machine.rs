//! Sans-I/O state machine of one classic consumer group: membership, JoinGroup and SyncGroup.
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

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

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

    /// Handles a JoinGroup request whose answer goes to `waiter`.
    pub fn join(&mut self, waiter: WaiterId, params: JoinParams, now_ms: u64) -> Vec<Reply> {
        let mut out = Vec::new();
        let error = if !Self::session_timeout_valid(&self.config, params.session_timeout_ms) {
            Some(ResponseError::InvalidSessionTimeout.code())
        } else if self.state == GroupState::Dead {
            Some(ResponseError::CoordinatorNotAvailable.code())
        } else if !self.supports_protocols(&params.protocol_type, &params.protocols) {
            Some(ResponseError::InconsistentGroupProtocol.code())
        } else {
            None
        };
        if let Some(error) = error {
            out.push(join_error(waiter, &params.member_id, error));
            return out;
        }
        if params.member_id.is_empty() {
            self.join_new_member(waiter, params, now_ms, &mut out);
        } else {
            self.join_current_member(waiter, params, now_ms, &mut out);
        }
        if self.state == GroupState::PreparingRebalance {
            self.try_complete_join(now_ms, &mut out);
        }
        out
    }

    fn join_new_member(
        &mut self,
        waiter: WaiterId,
        params: JoinParams,
        now_ms: u64,
        out: &mut Vec<Reply>,
    ) {
        if self.members.len() + self.pending_members.len() >= self.config.max_size {
            out.push(join_error(
                waiter,
                "",
                ResponseError::GroupMaxSizeReached.code(),
            ));
            return;
        }
        self.member_seq += 1;
        let member_id = format!(
            "{}-{:016x}-{}",
            if params.client_id.is_empty() {
                "member"
            } else {
                &params.client_id
            },
            self.member_nonce,
            self.member_seq
        );
        if params.require_known_member_id {
            let session = u64::try_from(params.session_timeout_ms).unwrap_or(0);
            self.pending_members
                .insert(member_id.clone(), now_ms.saturating_add(session));
            tracing::debug!(group = %self.id, member = %member_id, "member id required");
            out.push(join_error(
                waiter,
                &member_id,
                ResponseError::MemberIdRequired.code(),
            ));
            return;
        }
        self.add_member_and_rebalance(waiter, member_id, params, now_ms, out);
    }

    fn join_current_member(
        &mut self,
        waiter: WaiterId,
        params: JoinParams,
        now_ms: u64,
        out: &mut Vec<Reply>,
    ) {
        let member_id = params.member_id.clone();
        if self.pending_members.remove(&member_id).is_some() {
            self.add_member_and_rebalance(waiter, member_id, params, now_ms, out);
            return;
        }
        let Some(member) = self.member(&member_id) else {
            out.push(join_error(
                waiter,
                &member_id,
                ResponseError::UnknownMemberId.code(),
            ));
            return;
        };
        let matches = member.matches(&params.protocols);
        match self.state {
            GroupState::PreparingRebalance => {
                self.update_member_and_rebalance(waiter, params, now_ms, out);
            }
            GroupState::CompletingRebalance if matches => {
                // The member lost its JoinGroup answer: repeat the current generation's.
                let result = self.current_join_result(&member_id);
                self.touch(&member_id, now_ms);
                out.push(Reply::Join { waiter, result });
            }
            GroupState::Stable if matches && !self.is_leader(&member_id) => {
                // A follower without metadata changes just gets the current generation.
                let mut result = self.current_join_result(&member_id);
                result.members.clear();
                self.touch(&member_id, now_ms);
                out.push(Reply::Join { waiter, result });
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                // The leader rejoining, or changed metadata: rebalance.
                self.update_member_and_rebalance(waiter, params, now_ms, out);
            }
            GroupState::Empty | GroupState::Dead => {
                out.push(join_error(
                    waiter,
                    &member_id,
                    ResponseError::UnknownMemberId.code(),
                ));
            }
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        waiter: WaiterId,
        member_id: String,
        params: JoinParams,
        now_ms: u64,
        out: &mut Vec<Reply>,
    ) {
        if self.members.is_empty() {
            self.protocol_type = Some(params.protocol_type.clone());
        }
        if self.state == GroupState::PreparingRebalance && self.initial_delay_deadline_ms.is_some()
        {
            self.new_member_added = true;
        }
        let new_member_timeout =
            u64::try_from(self.config.new_member_join_timeout.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(group = %self.id, member = %member_id, client_id = %params.client_id,
            "member joined group");
        self.members.push(Member {
            member_id: member_id.clone(),
            group_instance_id: params.group_instance_id,
            client_id: params.client_id,
            client_host: params.client_host,
            rebalance_timeout_ms: u64::try_from(params.rebalance_timeout_ms).unwrap_or(0),
            session_timeout_ms: u64::try_from(params.session_timeout_ms).unwrap_or(0),
            protocol_type: params.protocol_type,
            protocols: params.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(waiter),
            awaiting_sync: None,
            last_heartbeat_ms: now_ms,
            is_new: true,
            new_member_deadline_ms: now_ms.saturating_add(new_member_timeout),
        });
        if self.leader.is_none() {
            self.leader = Some(member_id.clone());
        }
        self.maybe_prepare_rebalance(now_ms, &format!("adding new member {member_id}"), out);
    }

    fn update_member_and_rebalance(
        &mut self,
        waiter: WaiterId,
        params: JoinParams,
        now_ms: u64,
        out: &mut Vec<Reply>,
    ) {
        let member_id = params.member_id.clone();
        if let Some(member) = self.member_mut(&member_id) {
            member.protocols = params.protocols;
            member.rebalance_timeout_ms = u64::try_from(params.rebalance_timeout_ms).unwrap_or(0);
            member.session_timeout_ms = u64::try_from(params.session_timeout_ms).unwrap_or(0);
            member.last_heartbeat_ms = now_ms;
            if let Some(previous) = member.awaiting_join.replace(waiter) {
                if previous != waiter {
                    out.push(join_error(
                        previous,
                        &member_id,
                        ResponseError::RebalanceInProgress.code(),
                    ));
                }
            }
        }
        self.maybe_prepare_rebalance(
            now_ms,
            &format!("updating metadata of member {member_id}"),
            out,
        );
    }

    /// Starts a rebalance unless one is already being prepared.
    pub(crate) fn maybe_prepare_rebalance(
        &mut self,
        now_ms: u64,
        reason: &str,
        out: &mut Vec<Reply>,
    ) {
        if matches!(
            self.state,
            GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty
        ) {
            self.prepare_rebalance(now_ms, reason, out);
        }
    }

    pub(crate) fn prepare_rebalance(&mut self, now_ms: u64, reason: &str, out: &mut Vec<Reply>) {
        if self.state == GroupState::CompletingRebalance {
            self.reset_and_propagate_assignment_error(
                ResponseError::RebalanceInProgress.code(),
                out,
            );
        }
        self.sync_deadline_ms = None;
        let was_empty = self.state == GroupState::Empty;
        self.state = GroupState::PreparingRebalance;
        let rebalance_timeout = self.rebalance_timeout_ms();
        self.rebalance_deadline_ms = Some(now_ms.saturating_add(rebalance_timeout));
        let delay = u64::try_from(self.config.initial_rebalance_delay.as_millis()).unwrap_or(0);
        if was_empty && delay > 0 {
            let first = delay.min(rebalance_timeout);
            self.initial_delay_deadline_ms = Some(now_ms.saturating_add(first));
            self.initial_delay_remaining_ms = rebalance_timeout.saturating_sub(first);
            self.new_member_added = false;
        } else {
            self.initial_delay_deadline_ms = None;
        }
        self.rebalances += 1;
        metrics::counter!("onceflow_broker_group_rebalances_total", "group" => self.id.clone())
            .increment(1);
        tracing::info!(group = %self.id, generation = self.generation, reason,
            "preparing to rebalance group");
    }

    /// The largest rebalance timeout of the members (Kafka waits that long for rejoins).
    fn rebalance_timeout_ms(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0)
    }

    fn reset_and_propagate_assignment_error(&mut self, error: ErrorCode, out: &mut Vec<Reply>) {
        for member in &mut self.members {
            member.assignment = Bytes::new();
            if let Some(waiter) = member.awaiting_sync.take() {
                out.push(Reply::Sync {
                    waiter,
                    result: SyncResult::error(error),
                });
            }
        }
    }

    fn all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.iter().all(|m| m.awaiting_join.is_some())
    }

    /// Completes the join phase if every known member has rejoined (and no initial delay runs).
    pub(crate) fn try_complete_join(&mut self, now_ms: u64, out: &mut Vec<Reply>) {
        if self.state == GroupState::PreparingRebalance
            && self.initial_delay_deadline_ms.is_none()
            && self.all_members_joined()
        {
            self.complete_join(now_ms, out);
        }
    }

    /// Ends the join phase: drops members that did not rejoin, starts the next generation and
    /// answers every waiting JoinGroup (the leader gets all members' metadata).
    pub(crate) fn complete_join(&mut self, now_ms: u64, out: &mut Vec<Reply>) {
        let (joined, gone): (Vec<Member>, Vec<Member>) = std::mem::take(&mut self.members)
            .into_iter()
            .partition(|m| m.awaiting_join.is_some());
        self.members = joined;
        for member in gone {
            tracing::info!(group = %self.id, member = %member.member_id,
                "removing member that did not rejoin before the rebalance timeout");
            self.pending_sync.remove(&member.member_id);
        }
        if !self
            .leader
            .as_deref()
            .is_some_and(|leader| self.has_member(leader))
        {
            self.leader = self.members.first().map(|m| m.member_id.clone());
        }
        self.rebalance_deadline_ms = None;
        self.initial_delay_deadline_ms = None;
        self.pending_sync.clear();
        self.generation = self.generation.wrapping_add(1).max(1);
        if self.members.is_empty() {
            self.protocol_name = None;
            self.state = GroupState::Empty;
            self.sync_deadline_ms = None;
            tracing::info!(group = %self.id, generation = self.generation, "group is now empty");
            return;
        }
        self.protocol_name = self.select_protocol();
        self.state = GroupState::CompletingRebalance;
        let ids: Vec<String> = self.members.iter().map(|m| m.member_id.clone()).collect();
        for member_id in ids {
            let result = self.current_join_result(&member_id);
            if let Some(member) = self.member_mut(&member_id) {
                member.last_heartbeat_ms = now_ms;
                member.is_new = false;
                if let Some(waiter) = member.awaiting_join.take() {
                    out.push(Reply::Join { waiter, result });
                }
            }
            self.pending_sync.insert(member_id);
        }
        self.sync_deadline_ms = Some(now_ms.saturating_add(self.rebalance_timeout_ms()));
        tracing::info!(group = %self.id, generation = self.generation,
            protocol = self.protocol_name.as_deref().unwrap_or(""),
            members = self.members.len(), "stabilized group");
    }

    /// The JoinGroup answer of the current generation for `member_id`.
    fn current_join_result(&self, member_id: &str) -> JoinResult {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let members = if self.is_leader(member_id) {
            self.members
                .iter()
                .map(|m| JoinedMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    metadata: m.metadata(&protocol).cloned().unwrap_or_default(),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: NONE,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_owned(),
            members,
        }
    }

    /// Protocols every member supports, in the first member's preference order.
    fn candidate_protocols(&self) -> Vec<String> {
        let Some(first) = self.members.first() else {
            return Vec::new();
        };
        first
            .protocols
            .iter()
            .map(|(name, _)| name.clone())
            .filter(|name| self.members.iter().all(|m| m.supports(name)))
            .collect()
    }

    /// Kafka's protocol selection: each member votes for its most preferred protocol among
    /// those all members support; most votes wins (ties: the first member's preference).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes = vec![0usize; candidates.len()];
        for member in &self.members {
            if let Some(choice) = member.vote(&candidates) {
                if let Some(i) = candidates.iter().position(|c| c == choice) {
                    votes[i] += 1;
                }
            }
        }
        let mut best: Option<(usize, usize)> = None;
        for (i, &count) in votes.iter().enumerate() {
            if best.is_none_or(|(_, top)| count > top) {
                best = Some((i, count));
            }
        }
        best.map(|(i, _)| candidates[i].clone())
    }

    /// Whether a member with these protocols may join (Kafka's `supportsProtocols`).
    fn supports_protocols(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols
                .iter()
                .any(|(name, _)| self.members.iter().all(|m| m.supports(name)))
    }

    /// Handles a SyncGroup request whose answer goes to `waiter`. `assignments` is what the
    /// leader sends (followers send none).
    #[allow(clippy::too_many_arguments)]
    pub fn sync(
        &mut self,
        waiter: WaiterId,
        generation_id: i32,
        member_id: &str,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now_ms: u64,
    ) -> Vec<Reply> {
        let mut out = Vec::new();
        let error = if self.state == GroupState::Dead {
            Some(ResponseError::CoordinatorNotAvailable.code())
        } else if !self.has_member(member_id) {
            Some(ResponseError::UnknownMemberId.code())
        } else if generation_id != self.generation {
            Some(ResponseError::IllegalGeneration.code())
        } else if protocol_type.is_some_and(|t| self.protocol_type.as_deref() != Some(t))
            || protocol_name.is_some_and(|n| self.protocol_name.as_deref() != Some(n))
        {
            Some(ResponseError::InconsistentGroupProtocol.code())
        } else {
            match self.state {
                GroupState::Empty => Some(ResponseError::UnknownMemberId.code()),
                GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress.code()),
                _ => None,
            }
        };
        if let Some(error) = error {
            out.push(Reply::Sync {
                waiter,
                result: SyncResult::error(error),
            });
            return out;
        }
        self.pending_sync.remove(member_id);
        if self.pending_sync.is_empty() {
            self.sync_deadline_ms = None;
        }
        self.touch(member_id, now_ms);
        if self.state == GroupState::Stable {
            let result = self.sync_result(member_id);
            out.push(Reply::Sync { waiter, result });
            return out;
        }
        // CompletingRebalance: wait for the leader's assignment.
        if let Some(member) = self.member_mut(member_id) {
            if let Some(previous) = member.awaiting_sync.replace(waiter) {
                if previous != waiter {
                    out.push(Reply::Sync {
                        waiter: previous,
                        result: SyncResult::error(ResponseError::RebalanceInProgress.code()),
                    });
                }
            }
        }
        if self.is_leader(member_id) {
            let mut assignments: BTreeMap<String, Bytes> = assignments.into_iter().collect();
            let missing = self
                .members
                .iter()
                .filter(|m| !assignments.contains_key(&m.member_id))
                .count();
            if missing > 0 {
                tracing::warn!(group = %self.id, missing,
                    "leader's assignment leaves members without one; they get an empty assignment");
            }
            for member in &mut self.members {
                member.assignment = assignments.remove(&member.member_id).unwrap_or_default();
            }
            self.state = GroupState::Stable;
            tracing::info!(group = %self.id, generation = self.generation, leader = %member_id,
                "assignment received from leader; group is stable");
            let waiting: Vec<(WaiterId, String)> = self
                .members
                .iter_mut()
                .filter_map(|m| m.awaiting_sync.take().map(|w| (w, m.member_id.clone())))
                .collect();
            for (waiter, id) in waiting {
                let result = self.sync_result(&id);
                out.push(Reply::Sync { waiter, result });
            }
        }
        out
    }

    fn sync_result(&self, member_id: &str) -> SyncResult {
        SyncResult {
            error: NONE,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            assignment: self
                .member(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    /// Records a sign of life from `member_id`.
    pub(crate) fn touch(&mut self, member_id: &str, now_ms: u64) {
        if let Some(member) = self.member_mut(member_id) {
            member.last_heartbeat_ms = now_ms;
        }
    }
}

fn join_error(waiter: WaiterId, member_id: &str, error: ErrorCode) -> Reply {
    Reply::Join {
        waiter,
        result: JoinResult::error(member_id, error),
    }
}
