//! Property test of the group state machine: random sequences of joins, syncs, heartbeats,
//! leaves and clock advances keep the group's invariants, and no waiting request is ever
//! lost (each is answered exactly once or is still held by its member).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use proptest::prelude::*;

use super::machine::{Group, GroupState, JoinParams, Reply, WaiterId};
use super::GroupConfig;

#[derive(Debug, Clone)]
enum Op {
    /// A new member joins (v4+ dance when `dance`).
    NewMember { dance: bool, protocol: u8 },
    /// Known member `i` (mod the known ids) sends JoinGroup again.
    Rejoin { i: usize, protocol: u8 },
    /// Member `i` sends SyncGroup with the group's current generation.
    Sync { i: usize },
    /// Member `i` heartbeats.
    Heartbeat { i: usize },
    /// Member `i` leaves.
    Leave { i: usize },
    /// The clock advances.
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<bool>(), 0u8..3).prop_map(|(dance, protocol)| Op::NewMember { dance, protocol }),
        (0usize..8, 0u8..3).prop_map(|(i, protocol)| Op::Rejoin { i, protocol }),
        (0usize..8).prop_map(|i| Op::Sync { i }),
        (0usize..8).prop_map(|i| Op::Heartbeat { i }),
        (0usize..8).prop_map(|i| Op::Leave { i }),
        (1u64..4_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn protocols(choice: u8) -> Vec<(String, Bytes)> {
    let all = ["range", "roundrobin", "cooperative-sticky"];
    // Every member supports "range" so they stay compatible; preferences differ.
    let mut names = vec![all[choice as usize % 3], "range"];
    names.dedup();
    names
        .into_iter()
        .map(|n| (n.to_owned(), Bytes::from_static(b"m")))
        .collect()
}

fn params(member_id: &str, protocol: u8, dance: bool) -> JoinParams {
    JoinParams {
        member_id: member_id.to_owned(),
        group_instance_id: None,
        client_id: "c".to_owned(),
        client_host: String::new(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 5_000,
        protocol_type: "consumer".to_owned(),
        protocols: protocols(protocol),
        require_known_member_id: dance,
    }
}

struct Harness {
    group: Group,
    now: u64,
    next_waiter: WaiterId,
    /// Waiters registered and not answered yet.
    open: BTreeSet<WaiterId>,
    /// Every member id ever seen.
    known: Vec<String>,
    last_generation: i32,
}

impl Harness {
    fn waiter(&mut self) -> WaiterId {
        self.next_waiter += 1;
        self.open.insert(self.next_waiter);
        self.next_waiter
    }

    fn absorb(&mut self, replies: Vec<Reply>) -> Result<(), TestCaseError> {
        for reply in replies {
            let (waiter, id) = match &reply {
                Reply::Join { waiter, result } => (*waiter, Some(result.member_id.clone())),
                Reply::Sync { waiter, .. } => (*waiter, None),
            };
            prop_assert!(
                self.open.remove(&waiter),
                "waiter {waiter} answered twice or never registered"
            );
            if let Some(id) = id.filter(|id| !id.is_empty()) {
                if !self.known.contains(&id) {
                    self.known.push(id);
                }
            }
        }
        Ok(())
    }

    fn member(&self, i: usize) -> Option<String> {
        if self.known.is_empty() {
            None
        } else {
            Some(self.known[i % self.known.len()].clone())
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::NewMember { dance, protocol } => {
                let w = self.waiter();
                let replies = self.group.join(w, params("", protocol, dance), self.now);
                self.absorb(replies)?;
            }
            Op::Rejoin { i, protocol } => {
                if let Some(id) = self.member(i) {
                    let w = self.waiter();
                    let replies = self.group.join(w, params(&id, protocol, true), self.now);
                    self.absorb(replies)?;
                }
            }
            Op::Sync { i } => {
                if let Some(id) = self.member(i) {
                    let w = self.waiter();
                    let generation = self.group.generation();
                    let assignments: Vec<(String, Bytes)> = self
                        .group
                        .members()
                        .iter()
                        .map(|m| (m.member_id.clone(), Bytes::from_static(b"a")))
                        .collect();
                    let replies =
                        self.group
                            .sync(w, generation, &id, None, None, assignments, self.now);
                    self.absorb(replies)?;
                }
            }
            Op::Heartbeat { i } => {
                if let Some(id) = self.member(i) {
                    let generation = self.group.generation();
                    self.group.heartbeat(generation, &id, self.now);
                }
            }
            Op::Leave { i } => {
                if let Some(id) = self.member(i) {
                    let (_, replies) = self.group.leave(&[id], self.now);
                    self.absorb(replies)?;
                }
            }
            Op::Advance { ms } => {
                self.now += ms;
                let (replies, _) = self.group.tick(self.now);
                self.absorb(replies)?;
            }
        }
        self.check()
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        let g = &self.group;
        let ids: BTreeSet<&str> = g.members().iter().map(|m| m.member_id.as_str()).collect();
        prop_assert_eq!(ids.len(), g.members().len(), "duplicate member ids");
        prop_assert!(
            g.generation() >= self.last_generation,
            "generation went back"
        );
        self.last_generation = g.generation();
        match g.leader() {
            Some(leader) => prop_assert!(ids.contains(leader), "leader {} is not a member", leader),
            None => prop_assert!(ids.is_empty(), "members without a leader"),
        }
        if g.state() == GroupState::Empty {
            prop_assert!(ids.is_empty(), "Empty group with members");
        }
        if matches!(
            g.state(),
            GroupState::Stable | GroupState::CompletingRebalance
        ) {
            prop_assert!(!ids.is_empty(), "{:?} without members", g.state());
            prop_assert!(g.members().iter().all(|m| m.awaiting_join.is_none()));
            prop_assert!(g.protocol_name().is_some());
        }
        if g.state() == GroupState::Stable {
            prop_assert!(g.members().iter().all(|m| m.awaiting_sync.is_none()));
        }
        prop_assert!(g.pending_sync.iter().all(|id| ids.contains(id.as_str())));
        // No lost request: every unanswered waiter is held by a member.
        let held: BTreeMap<WaiterId, &str> = g
            .members()
            .iter()
            .flat_map(|m| {
                m.awaiting_join
                    .into_iter()
                    .chain(m.awaiting_sync)
                    .map(move |w| (w, m.member_id.as_str()))
            })
            .collect();
        for waiter in &self.open {
            prop_assert!(
                held.contains_key(waiter),
                "waiter {} was dropped without an answer",
                waiter
            );
        }
        prop_assert_eq!(held.len(), self.open.len());
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_operations_keep_invariants_and_answer_every_request(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness {
            group: Group::new("g", GroupConfig::default(), 7),
            now: 0,
            next_waiter: 0,
            open: BTreeSet::new(),
            known: Vec::new(),
            last_generation: 0,
        };
        for op in ops {
            h.apply(op)?;
        }
        // Long enough without activity, everyone expires and every request is answered.
        for _ in 0..10 {
            h.now += 400_000;
            let (replies, _) = h.group.tick(h.now);
            h.absorb(replies)?;
            h.check()?;
        }
        prop_assert!(h.open.is_empty(), "requests never answered: {:?}", h.open);
        prop_assert_eq!(h.group.state(), GroupState::Empty);
    }
}
