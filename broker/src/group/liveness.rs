//! Liveness of a group's members: Heartbeat, LeaveGroup, session and rebalance timeouts, and
//! the member checks OffsetCommit / TxnOffsetCommit make (sans-I/O, like [`super::machine`]).

use kafka_protocol::error::ResponseError;

use super::machine::{Group, GroupState, JoinResult, Reply, SyncResult, NONE};
use super::ErrorCode;

impl Group {
    /// Handles a Heartbeat. During a rebalance the answer is REBALANCE_IN_PROGRESS, which tells
    /// the member to rejoin.
    pub fn heartbeat(&mut self, generation_id: i32, member_id: &str, now_ms: u64) -> ErrorCode {
        if self.state == GroupState::Dead {
            return ResponseError::CoordinatorNotAvailable.code();
        }
        if !self.has_member(member_id) {
            return ResponseError::UnknownMemberId.code();
        }
        if generation_id != self.generation {
            return ResponseError::IllegalGeneration.code();
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => ResponseError::UnknownMemberId.code(),
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.touch(member_id, now_ms);
                NONE
            }
            GroupState::PreparingRebalance => {
                self.touch(member_id, now_ms);
                ResponseError::RebalanceInProgress.code()
            }
        }
    }

    /// Handles a LeaveGroup for `member_ids` (v3+ carries several): one error code per member.
    pub fn leave(&mut self, member_ids: &[String], now_ms: u64) -> (Vec<ErrorCode>, Vec<Reply>) {
        let mut out = Vec::new();
        let mut errors = Vec::with_capacity(member_ids.len());
        for member_id in member_ids {
            if self.state == GroupState::Dead {
                errors.push(ResponseError::CoordinatorNotAvailable.code());
            } else if self.pending_members.remove(member_id).is_some() {
                tracing::info!(group = %self.id, member = %member_id, "pending member left group");
                self.try_complete_join(now_ms, &mut out);
                errors.push(NONE);
            } else if self.has_member(member_id) {
                tracing::info!(group = %self.id, member = %member_id, "member left group");
                self.remove_member_and_update(member_id, "member left the group", now_ms, &mut out);
                errors.push(NONE);
            } else {
                errors.push(ResponseError::UnknownMemberId.code());
            }
        }
        (errors, out)
    }

    /// Removes a member, answers its waiting requests with UNKNOWN_MEMBER_ID, and rebalances.
    pub(crate) fn remove_member_and_update(
        &mut self,
        member_id: &str,
        reason: &str,
        now_ms: u64,
        out: &mut Vec<Reply>,
    ) {
        let Some(index) = self.members.iter().position(|m| m.member_id == member_id) else {
            return;
        };
        let member = self.members.remove(index);
        if let Some(waiter) = member.awaiting_join {
            out.push(Reply::Join {
                waiter,
                result: JoinResult::error(member_id, ResponseError::UnknownMemberId.code()),
            });
        }
        if let Some(waiter) = member.awaiting_sync {
            out.push(Reply::Sync {
                waiter,
                result: SyncResult::error(ResponseError::UnknownMemberId.code()),
            });
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members.first().map(|m| m.member_id.clone());
        }
        self.pending_sync.remove(member_id);
        match self.state {
            GroupState::Dead | GroupState::Empty => {}
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.maybe_prepare_rebalance(
                    now_ms,
                    &format!("removing member {member_id}: {reason}"),
                    out,
                );
                // With the last member gone nobody is left to wait for.
                self.try_complete_join(now_ms, out);
            }
            GroupState::PreparingRebalance => self.try_complete_join(now_ms, out),
        }
    }

    /// Advances timers to `now_ms`: expires pending and silent members, completes a join phase
    /// whose rebalance timeout passed, and drops members that never sent SyncGroup. Returns the
    /// answers that became ready and the ids of members expired.
    pub fn tick(&mut self, now_ms: u64) -> (Vec<Reply>, Vec<String>) {
        let mut out = Vec::new();
        let mut expired = Vec::new();
        if self.state == GroupState::Dead {
            return (out, expired);
        }
        let before = self.pending_members.len();
        self.pending_members.retain(|id, deadline| {
            let keep = now_ms < *deadline;
            if !keep {
                tracing::info!(member = %id, "pending member removed after session timeout");
            }
            keep
        });
        if self.pending_members.len() != before {
            self.try_complete_join(now_ms, &mut out);
        }

        let silent: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.is_expired(now_ms))
            .map(|m| m.member_id.clone())
            .collect();
        for member_id in silent {
            tracing::info!(group = %self.id, member = %member_id,
                "member failed (session timeout expired); removing it from the group");
            metrics::counter!("onceflow_broker_group_members_expired_total").increment(1);
            self.remove_member_and_update(&member_id, "session timeout expired", now_ms, &mut out);
            expired.push(member_id);
        }

        if self.state == GroupState::PreparingRebalance {
            if let Some(deadline) = self.initial_delay_deadline_ms {
                if now_ms >= deadline {
                    if self.new_member_added && self.initial_delay_remaining_ms > 0 {
                        let delay = u64::try_from(self.config.initial_rebalance_delay.as_millis())
                            .unwrap_or(0)
                            .min(self.initial_delay_remaining_ms);
                        self.initial_delay_deadline_ms = Some(now_ms.saturating_add(delay));
                        self.initial_delay_remaining_ms -= delay;
                        self.new_member_added = false;
                    } else {
                        self.complete_join(now_ms, &mut out);
                    }
                }
            } else if self.rebalance_deadline_ms.is_some_and(|d| now_ms >= d) {
                self.complete_join(now_ms, &mut out);
            } else {
                self.try_complete_join(now_ms, &mut out);
            }
        }

        if matches!(
            self.state,
            GroupState::CompletingRebalance | GroupState::Stable
        ) && self.sync_deadline_ms.is_some_and(|d| now_ms >= d)
        {
            self.sync_deadline_ms = None;
            let laggards: Vec<String> =
                std::mem::take(&mut self.pending_sync).into_iter().collect();
            if !laggards.is_empty() {
                for member_id in &laggards {
                    tracing::info!(group = %self.id, member = %member_id,
                        "removing member that did not send SyncGroup in time");
                    if let Some(index) = self.members.iter().position(|m| &m.member_id == member_id)
                    {
                        let member = self.members.remove(index);
                        if let Some(waiter) = member.awaiting_sync {
                            out.push(Reply::Sync {
                                waiter,
                                result: SyncResult::error(ResponseError::UnknownMemberId.code()),
                            });
                        }
                    }
                    expired.push(member_id.clone());
                }
                if !self
                    .leader
                    .as_deref()
                    .is_some_and(|leader| self.has_member(leader))
                {
                    self.leader = self.members.first().map(|m| m.member_id.clone());
                }
                self.prepare_rebalance(now_ms, "members did not send SyncGroup in time", &mut out);
                self.try_complete_join(now_ms, &mut out);
            }
        }
        (out, expired)
    }

    /// The member and generation checks of OffsetCommit (`transactional` = false) and
    /// TxnOffsetCommit (true), as Kafka's `validateOffsetCommit`. A passing check counts as a
    /// heartbeat.
    pub fn validate_offset_commit(
        &mut self,
        generation_id: i32,
        member_id: &str,
        transactional: bool,
        now_ms: u64,
    ) -> ErrorCode {
        if self.state == GroupState::Dead {
            return ResponseError::CoordinatorNotAvailable.code();
        }
        if generation_id >= 0 || !member_id.is_empty() {
            if !self.has_member(member_id) {
                return ResponseError::UnknownMemberId.code();
            }
            if generation_id != self.generation {
                return ResponseError::IllegalGeneration.code();
            }
        } else if !transactional && self.state != GroupState::Empty {
            // When the group has members, only members may commit.
            return ResponseError::UnknownMemberId.code();
        }
        if !transactional && self.state == GroupState::CompletingRebalance {
            return ResponseError::RebalanceInProgress.code();
        }
        self.touch(member_id, now_ms);
        NONE
    }

    /// The earliest instant at which [`Group::tick`] has work to do, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let members = self.members.iter().map(|m| {
            if m.is_new {
                m.new_member_deadline_ms
            } else {
                m.last_heartbeat_ms.saturating_add(m.session_timeout_ms)
            }
        });
        members
            .chain(self.pending_members.values().copied())
            .chain(self.rebalance_deadline_ms)
            .chain(self.initial_delay_deadline_ms)
            .chain(self.sync_deadline_ms)
            .min()
    }
}
