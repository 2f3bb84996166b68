//! The JoinGroup phase of a group's rebalance: joining members, preparing a rebalance,
//! completing the join barrier and Kafka's protocol selection.

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::{
    Group, GroupState, JoinParams, JoinResult, JoinedMember, Reply, SyncResult, WaiterId, NONE,
};
use crate::group::member::Member;
use crate::group::ErrorCode;

impl Group {
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
}

fn join_error(waiter: WaiterId, member_id: &str, error: ErrorCode) -> Reply {
    Reply::Join {
        waiter,
        result: JoinResult::error(member_id, error),
    }
}
