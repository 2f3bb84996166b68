//! Unit tests of the sans-I/O group state machine, driven with a fake clock.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::machine::{
    Group, GroupState, JoinParams, JoinResult, Reply, SyncResult, WaiterId, NONE,
};
use super::GroupConfig;

const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 5_000;

fn config() -> GroupConfig {
    GroupConfig::default()
}

fn params(member_id: &str, protocols: &[&str]) -> JoinParams {
    JoinParams {
        member_id: member_id.to_owned(),
        group_instance_id: None,
        client_id: "client".to_owned(),
        client_host: "/127.0.0.1".to_owned(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".to_owned(),
        protocols: protocols
            .iter()
            .map(|p| {
                (
                    (*p).to_owned(),
                    Bytes::from(format!("meta-{p}-{member_id}")),
                )
            })
            .collect(),
        require_known_member_id: true,
    }
}

fn join_reply(replies: &[Reply], waiter: WaiterId) -> Option<JoinResult> {
    replies.iter().find_map(|r| match r {
        Reply::Join { waiter: w, result } if *w == waiter => Some(result.clone()),
        _ => None,
    })
}

fn sync_reply(replies: &[Reply], waiter: WaiterId) -> Option<SyncResult> {
    replies.iter().find_map(|r| match r {
        Reply::Sync { waiter: w, result } if *w == waiter => Some(result.clone()),
        _ => None,
    })
}

/// Runs the v4+ first-join dance for a new member: returns its member id and the replies of
/// its second JoinGroup (sent with `waiter`).
fn join_new(
    group: &mut Group,
    waiter: WaiterId,
    protocols: &[&str],
    now: u64,
) -> (String, Vec<Reply>) {
    let first = group.join(waiter, params("", protocols), now);
    let required = join_reply(&first, waiter).expect("an immediate answer");
    assert_eq!(required.error, ResponseError::MemberIdRequired.code());
    assert!(!required.member_id.is_empty());
    let replies = group.join(waiter, params(&required.member_id, protocols), now);
    (required.member_id, replies)
}

/// Forms a stable group of `n` members joined at time 0; returns their ids (leader first).
fn stable_group(n: usize) -> (Group, Vec<String>) {
    let mut group = Group::new("g", config(), 1);
    let mut ids = Vec::new();
    // Join everyone before the first completes: the first join completes at once (only member),
    // so instead join all with the same generation by rejoining until stable.
    for i in 0..n {
        let (id, _) = join_new(&mut group, 100 + i as u64, &["range"], 0);
        ids.push(id);
        // Existing members rejoin so the rebalance completes.
        for (j, other) in ids.iter().enumerate().take(i) {
            group.join(200 + (i * 10 + j) as u64, params(other, &["range"]), 0);
        }
    }
    assert_eq!(group.state(), GroupState::CompletingRebalance);
    let generation = group.generation();
    let leader = group.leader().unwrap().to_owned();
    let assignments = ids
        .iter()
        .map(|id| (id.clone(), Bytes::from(format!("assign-{id}"))))
        .collect();
    for id in ids.iter().filter(|id| **id != leader) {
        group.sync(1000, generation, id, None, None, Vec::new(), 0);
    }
    group.sync(1001, generation, &leader, None, None, assignments, 0);
    assert_eq!(group.state(), GroupState::Stable);
    (group, ids)
}

#[test]
fn first_join_requires_member_id_then_forms_generation_one() {
    let mut group = Group::new("g", config(), 1);
    let (id, replies) = join_new(&mut group, 1, &["range"], 0);
    let result = join_reply(&replies, 1).unwrap();
    assert_eq!(result.error, NONE);
    assert_eq!(result.generation_id, 1);
    assert_eq!(result.leader, id);
    assert_eq!(result.member_id, id);
    assert_eq!(result.protocol_name.as_deref(), Some("range"));
    assert_eq!(
        result.members.len(),
        1,
        "the leader gets every member's metadata"
    );
    assert_eq!(
        result.members[0].metadata,
        Bytes::from(format!("meta-range-{id}"))
    );
    assert_eq!(group.state(), GroupState::CompletingRebalance);
}

#[test]
fn join_without_member_id_requirement_joins_at_once() {
    let mut group = Group::new("g", config(), 1);
    let mut p = params("", &["range"]);
    p.require_known_member_id = false;
    let replies = group.join(1, p, 0);
    let result = join_reply(&replies, 1).unwrap();
    assert_eq!(result.error, NONE);
    assert_eq!(result.generation_id, 1);
}

#[test]
fn second_member_triggers_rebalance_and_leader_distributes_assignment() {
    let mut group = Group::new("g", config(), 1);
    let (a, _) = join_new(&mut group, 1, &["range"], 0);
    group.sync(
        2,
        1,
        &a,
        None,
        None,
        vec![(a.clone(), Bytes::from_static(b"all"))],
        0,
    );
    assert_eq!(group.state(), GroupState::Stable);

    let (b, replies) = join_new(&mut group, 3, &["range"], 10);
    assert!(
        join_reply(&replies, 3).is_none(),
        "the newcomer waits for the others"
    );
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert_eq!(
        group.heartbeat(1, &a, 20),
        ResponseError::RebalanceInProgress.code(),
        "heartbeats tell the old member to rejoin"
    );
    let replies = group.join(4, params(&a, &["range"]), 30);
    let for_a = join_reply(&replies, 4).unwrap();
    let for_b = join_reply(&replies, 3).unwrap();
    assert_eq!(for_a.generation_id, 2);
    assert_eq!(for_b.generation_id, 2);
    assert_eq!(for_a.leader, a);
    assert_eq!(for_a.members.len(), 2);
    assert!(
        for_b.members.is_empty(),
        "followers do not get member metadata"
    );

    let replies = group.sync(5, 2, &b, None, None, Vec::new(), 40);
    assert!(
        replies.is_empty(),
        "the follower waits for the leader's assignment"
    );
    let replies = group.sync(
        6,
        2,
        &a,
        Some("consumer"),
        Some("range"),
        vec![
            (a.clone(), Bytes::from_static(b"p0-2")),
            (b.clone(), Bytes::from_static(b"p3-5")),
        ],
        50,
    );
    assert_eq!(
        sync_reply(&replies, 6).unwrap().assignment,
        Bytes::from_static(b"p0-2")
    );
    assert_eq!(
        sync_reply(&replies, 5).unwrap().assignment,
        Bytes::from_static(b"p3-5")
    );
    assert_eq!(group.state(), GroupState::Stable);
    assert_eq!(group.heartbeat(2, &b, 60), NONE);
    assert_eq!(
        group.heartbeat(1, &b, 60),
        ResponseError::IllegalGeneration.code()
    );
}

#[test]
fn member_that_does_not_rejoin_is_dropped_at_rebalance_timeout() {
    let (mut group, ids) = stable_group(2);
    let generation = group.generation();
    let (c, replies) = join_new(&mut group, 50, &["range"], 1_000);
    assert!(replies.is_empty());
    // Only the leader rejoins; keep the other member's session alive with heartbeats.
    group.join(51, params(&ids[0], &["range"]), 1_100);
    assert_eq!(
        group.heartbeat(generation, &ids[1], 3_000),
        ResponseError::RebalanceInProgress.code()
    );
    let (replies, _) = group.tick(1_000 + REBALANCE_MS as u64 - 1);
    assert!(replies.is_empty(), "not before the rebalance timeout");
    let (replies, _) = group.tick(1_000 + REBALANCE_MS as u64);
    assert_eq!(
        join_reply(&replies, 50).unwrap().generation_id,
        generation + 1
    );
    assert_eq!(join_reply(&replies, 51).unwrap().members.len(), 2);
    assert!(group.member(&ids[1]).is_none());
    assert!(group.member(&c).is_some());
    assert_eq!(
        group.heartbeat(generation + 1, &ids[1], 7_000),
        ResponseError::UnknownMemberId.code()
    );
}

#[test]
fn silent_member_expires_after_session_timeout() {
    let (mut group, ids) = stable_group(2);
    let generation = group.generation();
    let session = SESSION_MS as u64;
    for t in (1_000..=session).step_by(1_000) {
        assert_eq!(group.heartbeat(generation, &ids[0], t), NONE);
        let (_, expired) = group.tick(t);
        if t < session {
            assert!(
                expired.is_empty(),
                "nobody expires before the session timeout"
            );
        }
    }
    assert!(
        group.member(&ids[1]).is_none(),
        "the silent member was removed"
    );
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert_eq!(
        group.heartbeat(generation, &ids[0], session + 100),
        ResponseError::RebalanceInProgress.code()
    );
    let replies = group.join(9, params(&ids[0], &["range"]), session + 2_100);
    let result = join_reply(&replies, 9).unwrap();
    assert_eq!(result.generation_id, generation + 1);
    assert_eq!(result.members.len(), 1);
}

#[test]
fn leaving_leader_hands_over_and_last_leave_empties_group() {
    let (mut group, ids) = stable_group(2);
    let generation = group.generation();
    let (errors, _) = group.leave(std::slice::from_ref(&ids[0]), 100);
    assert_eq!(errors, vec![NONE]);
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert_eq!(group.leader(), Some(ids[1].as_str()));
    let replies = group.join(7, params(&ids[1], &["range"]), 200);
    let result = join_reply(&replies, 7).unwrap();
    assert_eq!(result.generation_id, generation + 1);
    assert_eq!(result.leader, ids[1]);

    let (errors, _) = group.leave(&[ids[1].clone(), "nobody".to_owned()], 300);
    assert_eq!(errors, vec![NONE, ResponseError::UnknownMemberId.code()]);
    assert_eq!(group.state(), GroupState::Empty);
    assert_eq!(group.generation(), generation + 2);
}

#[test]
fn leaving_during_completing_rebalance_cancels_pending_syncs() {
    let mut group = Group::new("g", config(), 1);
    let (a, _) = join_new(&mut group, 1, &["range"], 0);
    let (b, _) = join_new(&mut group, 2, &["range"], 0);
    group.join(3, params(&a, &["range"]), 0);
    assert_eq!(group.state(), GroupState::CompletingRebalance);
    let generation = group.generation();
    let follower = if group.leader() == Some(a.as_str()) {
        &b
    } else {
        &a
    };
    let leader = group.leader().unwrap().to_owned();
    assert!(group
        .sync(4, generation, follower, None, None, vec![], 10)
        .is_empty());
    let (_, replies) = group.leave(std::slice::from_ref(&leader), 20);
    let sync = sync_reply(&replies, 4).unwrap();
    assert_eq!(sync.error, ResponseError::RebalanceInProgress.code());
}

#[test]
fn protocol_selected_by_vote_among_common_protocols() {
    let mut group = Group::new("g", config(), 1);
    let (a, _) = join_new(&mut group, 1, &["range", "roundrobin"], 0);
    let (b, _) = join_new(&mut group, 2, &["roundrobin", "range"], 0);
    let (c, _) = join_new(&mut group, 3, &["roundrobin", "range"], 0);
    group.join(4, params(&a, &["range", "roundrobin"]), 0);
    let replies = group.join(5, params(&b, &["roundrobin", "range"]), 0);
    let result = join_reply(&replies, 5).unwrap();
    assert_eq!(result.protocol_name.as_deref(), Some("roundrobin"));
    assert!(group.member(&c).is_some());

    let replies = group.join(6, params("", &["cooperative-sticky"]), 0);
    assert_eq!(
        join_reply(&replies, 6).unwrap().error,
        ResponseError::InconsistentGroupProtocol.code()
    );
}

#[test]
fn invalid_session_timeout_is_refused() {
    let mut group = Group::new("g", config(), 1);
    let mut p = params("", &["range"]);
    p.session_timeout_ms = 10;
    let replies = group.join(1, p, 0);
    assert_eq!(
        join_reply(&replies, 1).unwrap().error,
        ResponseError::InvalidSessionTimeout.code()
    );
}

#[test]
fn sync_checks_member_generation_and_state() {
    let (mut group, ids) = stable_group(2);
    let generation = group.generation();
    let err = |r: Vec<Reply>| sync_reply(&r, 9).unwrap().error;
    assert_eq!(
        err(group.sync(9, generation, "nobody", None, None, vec![], 0)),
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        err(group.sync(9, generation + 5, &ids[0], None, None, vec![], 0)),
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        err(group.sync(9, generation, &ids[0], None, Some("roundrobin"), vec![], 0)),
        ResponseError::InconsistentGroupProtocol.code()
    );
    let ok = sync_reply(
        &group.sync(9, generation, &ids[1], None, None, vec![], 0),
        9,
    )
    .unwrap();
    assert_eq!(ok.error, NONE);
    assert_eq!(ok.assignment, Bytes::from(format!("assign-{}", ids[1])));
}

#[test]
fn member_that_never_syncs_is_removed_after_rebalance_timeout() {
    let mut group = Group::new("g", config(), 1);
    let (a, _) = join_new(&mut group, 1, &["range"], 0);
    let (b, _) = join_new(&mut group, 2, &["range"], 0);
    group.join(3, params(&a, &["range"]), 0);
    let generation = group.generation();
    let leader = group.leader().unwrap().to_owned();
    let follower = if leader == a { b.clone() } else { a.clone() };
    group.sync(4, generation, &leader, None, None, vec![], 0);
    assert_eq!(group.state(), GroupState::Stable);
    // The follower never sends SyncGroup (but heartbeats).
    group.heartbeat(generation, &follower, 4_000);
    let (_, expired) = group.tick(REBALANCE_MS as u64);
    assert_eq!(expired, vec![follower.clone()]);
    assert!(group.member(&follower).is_none());
    assert_eq!(group.state(), GroupState::PreparingRebalance);
}

#[test]
fn offset_commit_member_checks() {
    let mut empty = Group::new("g", config(), 1);
    assert_eq!(
        empty.validate_offset_commit(-1, "", false, 0),
        NONE,
        "simple consumers commit to empty groups"
    );
    let (mut group, ids) = stable_group(1);
    let generation = group.generation();
    assert_eq!(
        group.validate_offset_commit(generation, &ids[0], false, 0),
        NONE
    );
    assert_eq!(
        group.validate_offset_commit(-1, "", false, 0),
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        group.validate_offset_commit(generation - 1, &ids[0], false, 0),
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        group.validate_offset_commit(generation, "zombie", true, 0),
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        group.validate_offset_commit(-1, "", true, 0),
        NONE,
        "old TxnOffsetCommit versions"
    );
    // A new member makes the group rebalance; a commit in CompletingRebalance must wait.
    let (_, _) = join_new(&mut group, 70, &["range"], 0);
    group.join(71, params(&ids[0], &["range"]), 0);
    assert_eq!(group.state(), GroupState::CompletingRebalance);
    assert_eq!(
        group.validate_offset_commit(group.generation(), &ids[0], false, 0),
        ResponseError::RebalanceInProgress.code()
    );
}

#[test]
fn initial_rebalance_delay_gathers_members() {
    let config = GroupConfig {
        initial_rebalance_delay: Duration::from_millis(100),
        ..GroupConfig::default()
    };
    let mut group = Group::new("g", config, 1);
    let (_, replies) = join_new(&mut group, 1, &["range"], 0);
    assert!(
        replies.is_empty(),
        "the first join waits for the initial delay"
    );
    let (_, replies) = join_new(&mut group, 2, &["range"], 50);
    assert!(replies.is_empty());
    let (replies, _) = group.tick(100);
    assert!(
        replies.is_empty(),
        "a member arrived during the delay: wait once more"
    );
    let (replies, _) = group.tick(200);
    assert_eq!(join_reply(&replies, 1).unwrap().generation_id, 1);
    assert_eq!(join_reply(&replies, 2).unwrap().generation_id, 1);
}

#[test]
fn restored_group_fences_old_generations() {
    let mut group = Group::restored("g", config(), 2, 7, Some("consumer".into()));
    assert_eq!(group.state(), GroupState::Empty);
    assert_eq!(
        group.heartbeat(7, "old-member", 0),
        ResponseError::UnknownMemberId.code()
    );
    let (_, replies) = join_new(&mut group, 1, &["range"], 0);
    assert_eq!(join_reply(&replies, 1).unwrap().generation_id, 8);
}

#[test]
fn pending_member_that_never_rejoins_expires() {
    let (mut group, ids) = stable_group(1);
    let first = group.join(5, params("", &["range"]), 0);
    let pending_id = join_reply(&first, 5).unwrap().member_id;
    // The leader rejoins (e.g. metadata change) but the pending member never comes back.
    let replies = group.join(6, params(&ids[0], &["range"]), 0);
    assert!(replies.is_empty(), "a pending member holds the rebalance");
    let (replies, _) = group.tick(SESSION_MS as u64);
    assert!(join_reply(&replies, 6).is_some());
    assert!(group.member(&pending_id).is_none());
}
