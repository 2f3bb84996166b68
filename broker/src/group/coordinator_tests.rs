//! Tests of the async coordinator layer: waiting JoinGroup / SyncGroup requests, the timer
//! task, OffsetCommit checks, and OffsetFetch with require_stable.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::coordinator::GroupCoordinator;
use super::machine::{GroupState, JoinParams, NONE};
use super::offsets::{CommittedOffset, TopicPartition};
use super::GroupConfig;

fn fast_config() -> GroupConfig {
    GroupConfig {
        min_session_timeout: Duration::from_millis(100),
        tick_interval: Duration::from_millis(10),
        ..GroupConfig::default()
    }
}

fn params(member_id: &str, session_ms: i32) -> JoinParams {
    JoinParams {
        member_id: member_id.to_owned(),
        group_instance_id: None,
        client_id: "c".to_owned(),
        client_host: String::new(),
        session_timeout_ms: session_ms,
        rebalance_timeout_ms: 2_000,
        protocol_type: "consumer".to_owned(),
        protocols: vec![("range".to_owned(), Bytes::from_static(b"m"))],
        require_known_member_id: false,
    }
}

fn off(offset: i64) -> CommittedOffset {
    CommittedOffset {
        offset,
        leader_epoch: -1,
        metadata: String::new(),
        commit_timestamp_ms: 0,
    }
}

#[tokio::test]
async fn join_waits_for_rejoin_and_silent_member_expires_by_timer() {
    let coordinator = Arc::new(GroupCoordinator::in_memory(fast_config()));
    let timer = coordinator.spawn_timer();
    let a = coordinator.join("g", params("", 60_000)).await;
    assert_eq!(a.error, NONE);
    let sync = coordinator
        .sync(
            "g",
            a.generation_id,
            &a.member_id,
            None,
            None,
            vec![(a.member_id.clone(), Bytes::from_static(b"x"))],
        )
        .await;
    assert_eq!(sync.assignment, Bytes::from_static(b"x"));

    // B joins with a short session; A rejoins, so generation 2 forms with both.
    let c2 = Arc::clone(&coordinator);
    let b = tokio::spawn(async move { c2.join("g", params("", 200)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        coordinator.heartbeat("g", a.generation_id, &a.member_id),
        ResponseError::RebalanceInProgress.code()
    );
    let a2 = coordinator.join("g", params(&a.member_id, 60_000)).await;
    let b = b.await.unwrap();
    assert_eq!(a2.generation_id, 2);
    assert_eq!(b.generation_id, 2);

    // B never syncs nor heartbeats: after its session the timer removes it and A must rejoin.
    let leader_sync = coordinator
        .sync("g", 2, &a.member_id, None, None, vec![])
        .await;
    assert_eq!(leader_sync.error, NONE);
    let mut waited = Duration::ZERO;
    while coordinator.heartbeat("g", 2, &a.member_id) == NONE {
        assert!(waited < Duration::from_secs(5), "B was never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    assert_eq!(
        coordinator.heartbeat("g", 2, &b.member_id),
        ResponseError::UnknownMemberId.code()
    );
    let a3 = coordinator.join("g", params(&a.member_id, 60_000)).await;
    assert_eq!(a3.generation_id, 3);
    assert_eq!(a3.members.len(), 1);
    coordinator.close();
    timer.await.unwrap();
}

#[tokio::test]
async fn unknown_member_on_missing_group_and_invalid_group_id() {
    let coordinator = GroupCoordinator::in_memory(fast_config());
    assert_eq!(
        coordinator.join("g", params("ghost", 1_000)).await.error,
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        coordinator.join("", params("", 1_000)).await.error,
        ResponseError::InvalidGroupId.code()
    );
    assert_eq!(
        coordinator.join("g", params("", 1)).await.error,
        ResponseError::InvalidSessionTimeout.code()
    );
    assert_eq!(
        coordinator
            .sync("g", 1, "ghost", None, None, vec![])
            .await
            .error,
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(coordinator.describe("nope").state, GroupState::Dead);
    assert!(coordinator.list(&[]).is_empty());
}

#[tokio::test]
async fn offset_commit_checks_generation_and_fetch_honours_require_stable() {
    let coordinator = GroupCoordinator::in_memory(fast_config());
    let tp = TopicPartition::new("t", 0);
    // Standalone commit (generation -1) to a group that does not exist yet: allowed.
    let codes = coordinator
        .commit_offsets("simple", -1, "", vec![(tp.clone(), off(3))])
        .await;
    assert_eq!(codes, vec![NONE]);
    // A commit claiming a generation of a group that does not exist: refused.
    let codes = coordinator
        .commit_offsets("nogroup", 4, "m", vec![(tp.clone(), off(3))])
        .await;
    assert_eq!(codes, vec![ResponseError::IllegalGeneration.code()]);

    let a = coordinator.join("g", params("", 10_000)).await;
    let codes = coordinator
        .commit_offsets(
            "g",
            a.generation_id,
            &a.member_id,
            vec![(tp.clone(), off(7))],
        )
        .await;
    assert_eq!(
        codes,
        vec![ResponseError::RebalanceInProgress.code()],
        "not before SyncGroup"
    );
    coordinator
        .sync("g", a.generation_id, &a.member_id, None, None, vec![])
        .await;
    let big = CommittedOffset {
        metadata: "x".repeat(10_000),
        ..off(1)
    };
    let codes = coordinator
        .commit_offsets(
            "g",
            a.generation_id,
            &a.member_id,
            vec![(tp.clone(), off(7)), (TopicPartition::new("t", 1), big)],
        )
        .await;
    assert_eq!(
        codes,
        vec![NONE, ResponseError::OffsetMetadataTooLarge.code()]
    );
    let codes = coordinator
        .commit_offsets(
            "g",
            a.generation_id + 1,
            &a.member_id,
            vec![(tp.clone(), off(9))],
        )
        .await;
    assert_eq!(codes, vec![ResponseError::IllegalGeneration.code()]);

    // Transactional offsets pending: require_stable answers UNSTABLE_OFFSET_COMMIT.
    coordinator
        .offsets()
        .stage_txn_offsets("g", 77, vec![(tp.clone(), off(20))])
        .unwrap();
    let stable = coordinator.fetch_offsets("g", Some(vec![tp.clone()]), true);
    assert_eq!(stable[0].error, ResponseError::UnstableOffsetCommit.code());
    let plain = coordinator.fetch_offsets("g", Some(vec![tp.clone()]), false);
    assert_eq!(plain[0].committed.as_ref().unwrap().offset, 7);
    coordinator.offsets().complete_txn("g", 77, true).unwrap();
    let stable = coordinator.fetch_offsets("g", None, true);
    assert_eq!(stable.len(), 1);
    assert_eq!(stable[0].error, NONE);
    assert_eq!(stable[0].committed.as_ref().unwrap().offset, 20);

    let listed = coordinator.list(&["stable".to_owned()]);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].group_id, "g");
    let described = coordinator.describe("g");
    assert_eq!(described.state, GroupState::Stable);
    assert_eq!(described.protocol, "range");
    assert_eq!(described.members.len(), 1);
}

#[tokio::test]
async fn generation_survives_reopen_and_fences_old_members() {
    let dir = tempfile::tempdir().unwrap();
    let member = {
        let coordinator = GroupCoordinator::open(Some(dir.path()), true, fast_config()).unwrap();
        let a = coordinator.join("g", params("", 10_000)).await;
        coordinator
            .sync("g", a.generation_id, &a.member_id, None, None, vec![])
            .await;
        coordinator
            .commit_offsets(
                "g",
                a.generation_id,
                &a.member_id,
                vec![(TopicPartition::new("t", 0), off(5))],
            )
            .await;
        coordinator.close();
        a
    };
    let coordinator = GroupCoordinator::open(Some(dir.path()), true, fast_config()).unwrap();
    assert_eq!(coordinator.describe("g").state, GroupState::Empty);
    assert_eq!(
        coordinator.heartbeat("g", member.generation_id, &member.member_id),
        ResponseError::UnknownMemberId.code()
    );
    let fetched = coordinator.fetch_offsets("g", None, true);
    assert_eq!(fetched[0].committed.as_ref().unwrap().offset, 5);
    let again = coordinator.join("g", params("", 10_000)).await;
    assert_eq!(again.generation_id, member.generation_id + 1);
}

#[tokio::test]
async fn shutdown_releases_waiting_requests_with_not_coordinator() {
    let coordinator = Arc::new(GroupCoordinator::in_memory(fast_config()));
    let a = coordinator.join("g", params("", 10_000)).await;
    assert_eq!(a.error, NONE);
    // A second member waits for A to rejoin.
    let c2 = Arc::clone(&coordinator);
    let waiting = tokio::spawn(async move { c2.join("g", params("", 10_000)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiting.is_finished(),
        "the newcomer waits for the rebalance"
    );
    coordinator.begin_shutdown();
    let released = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("released at once")
        .unwrap();
    assert_eq!(released.error, ResponseError::NotCoordinator.code());
    assert_eq!(
        coordinator.join("g", params("", 10_000)).await.error,
        ResponseError::NotCoordinator.code()
    );
    // Offset commits still go through until the store is closed.
    let codes = coordinator
        .commit_offsets(
            "simple",
            -1,
            "",
            vec![(TopicPartition::new("t", 0), off(1))],
        )
        .await;
    assert_eq!(codes, vec![NONE]);
    coordinator.close();
    let codes = coordinator
        .commit_offsets(
            "simple",
            -1,
            "",
            vec![(TopicPartition::new("t", 0), off(2))],
        )
        .await;
    assert_ne!(codes, vec![NONE], "a closed store refuses commits");
}
