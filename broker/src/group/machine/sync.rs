//! The SyncGroup phase of a group's rebalance: members wait for the leader's assignment,
//! which completes the generation (the group becomes Stable).

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::{Group, GroupState, Reply, SyncResult, WaiterId, NONE};

impl Group {
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
}
