//! Group APIs on the wire at chosen versions, with a hand-driven member next to a real
//! rdkafka consumer: session expiry, rebalance timeout, takeover from committed offsets.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, RequestHeader, ResponseHeader, SyncGroupRequest, SyncGroupResponse,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use onceflow_broker::{start, BrokerConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A minimal Kafka client: one request at a time on one connection.
struct RawClient {
    stream: TcpStream,
    correlation_id: i32,
}

impl RawClient {
    async fn connect(addr: &str) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.expect("connect"),
            correlation_id: 0,
        }
    }

    async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("raw")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, api.request_header_version(version))
            .expect("header encodes");
        req.encode(&mut body, version).expect("request encodes");
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_u32(body.len() as u32);
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).await.expect("write");
        let len = self.stream.read_u32().await.expect("response size") as usize;
        let mut buf = vec![0u8; len];
        self.stream.read_exact(&mut buf).await.expect("response");
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut buf, api.response_header_version(version))
            .expect("response header");
        assert_eq!(header.correlation_id, self.correlation_id);
        let resp = Resp::decode(&mut buf, version).expect("response decodes");
        assert!(!buf.has_remaining(), "{api:?} v{version}: trailing bytes");
        resp
    }
}

fn s(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_owned())
}

/// ConsumerProtocolSubscription v0 for `topic`.
fn subscription(topic: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(-1);
    b.freeze()
}

/// ConsumerProtocolAssignment v0 of `partitions` of `topic`.
fn assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(partitions.len() as i32);
    for p in partitions {
        b.put_i32(*p);
    }
    b.put_i32(-1);
    b.freeze()
}

fn join_request(group: &str, member_id: &str, topic: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(6_000)
        .with_rebalance_timeout_ms(6_000)
        .with_member_id(s(member_id))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(subscription(topic))])
}

/// Joins `group` as a lone member with JoinGroup v5 (the member id dance) and syncs v3;
/// returns (member id, generation).
async fn join_and_sync(
    client: &mut RawClient,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> (String, i32) {
    let first: JoinGroupResponse = client
        .call(ApiKey::JoinGroup, 5, &join_request(group, "", topic))
        .await;
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    let member_id = first.member_id.to_string();
    assert!(!member_id.is_empty());
    let joined: JoinGroupResponse = client
        .call(
            ApiKey::JoinGroup,
            5,
            &join_request(group, &member_id, topic),
        )
        .await;
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.leader.as_str(), member_id);
    assert_eq!(
        joined.protocol_name.as_ref().map(|p| p.as_str()),
        Some("range")
    );
    assert_eq!(joined.members.len(), 1);
    assert_eq!(joined.members[0].metadata, subscription(topic));
    let sync: SyncGroupResponse = client
        .call(
            ApiKey::SyncGroup,
            3,
            &SyncGroupRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(joined.generation_id)
                .with_member_id(s(&member_id))
                .with_assignments(vec![SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member_id))
                    .with_assignment(assignment(topic, partitions))]),
        )
        .await;
    assert_eq!(sync.error_code, 0);
    assert_eq!(sync.assignment, assignment(topic, partitions));
    (member_id, joined.generation_id)
}

async fn describe(client: &mut RawClient, group: &str) -> (String, usize) {
    let resp: DescribeGroupsResponse = client
        .call(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]),
        )
        .await;
    let g = &resp.groups[0];
    assert_eq!(g.error_code, 0);
    (g.group_state.to_string(), g.members.len())
}

async fn heartbeat(client: &mut RawClient, group: &str, member: &str, generation: i32) -> i16 {
    let resp: HeartbeatResponse = client
        .call(
            ApiKey::Heartbeat,
            3,
            &HeartbeatRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(generation)
                .with_member_id(s(member)),
        )
        .await;
    resp.error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_member_expires_and_a_consumer_takes_over_from_committed_offsets() {
    let broker = start(BrokerConfig::default()).await.expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let topic = "raw-groups";
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for r in admin
        .create_topics(
            &[NewTopic::new(topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for p in 0..3 {
        for i in 0..5 {
            producer
                .send(
                    FutureRecord::<(), _>::to(topic)
                        .partition(p)
                        .payload(&format!("p{p}-{i}")),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
    }

    let mut client = RawClient::connect(&bootstrap).await;

    // FindCoordinator v4 batch: this node for every key.
    let found: FindCoordinatorResponse = client
        .call(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![s("a"), s("b")]),
        )
        .await;
    assert_eq!(found.coordinators.len(), 2);
    assert!(found
        .coordinators
        .iter()
        .all(|c| c.error_code == 0 && c.node_id.0 == 0));
    assert!(found
        .coordinators
        .iter()
        .all(|c| c.port == broker.local_addr().port() as i32));

    // Group 1: a member that goes silent expires after its session timeout.
    let (silent, silent_gen) = join_and_sync(&mut client, "g-expire", topic, &[0, 1, 2]).await;
    assert_eq!(
        describe(&mut client, "g-expire").await,
        ("Stable".to_owned(), 1)
    );

    // Group 2: a hand-driven member owns everything and commits partition 0 at offset 3.
    let (raw, raw_gen) = join_and_sync(&mut client, "g-takeover", topic, &[0, 1, 2]).await;
    let commit: OffsetCommitResponse = client
        .call(
            ApiKey::OffsetCommit,
            2,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(s("g-takeover")))
                .with_generation_id_or_member_epoch(raw_gen)
                .with_member_id(s(&raw))
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(s(topic)))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(3),
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(7)
                            .with_committed_offset(1),
                    ])]),
        )
        .await;
    let codes: Vec<i16> = commit.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(
        codes,
        vec![0, ResponseError::UnknownTopicOrPartition.code()]
    );
    let fetched: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            8,
            &OffsetFetchRequest::default()
                .with_require_stable(true)
                .with_groups(vec![OffsetFetchRequestGroup::default()
                    .with_group_id(GroupId(s("g-takeover")))
                    .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                        .with_name(TopicName(s(topic)))
                        .with_partition_indexes(vec![0, 1])]))]),
        )
        .await;
    let parts = &fetched.groups[0].topics[0].partitions;
    assert_eq!(
        parts.iter().map(|p| p.committed_offset).collect::<Vec<_>>(),
        vec![3, -1]
    );

    let listed: ListGroupsResponse = client
        .call(
            ApiKey::ListGroups,
            4,
            &ListGroupsRequest::default().with_states_filter(vec![s("Stable")]),
        )
        .await;
    let names: BTreeSet<String> = listed
        .groups
        .iter()
        .map(|g| g.group_id.to_string())
        .collect();
    assert!(
        names.contains("g-expire") && names.contains("g-takeover"),
        "{names:?}"
    );

    // An rdkafka consumer joins g-takeover; the hand-driven member never rejoins nor
    // heartbeats, so it is dropped and the consumer owns all partitions, starting partition 0
    // at the committed offset and the others from the beginning.
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "g-takeover")
        .set("session.timeout.ms", "6000")
        .set("max.poll.interval.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while seen.len() < 12 {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, consumer.recv())
            .await
            .expect("records within the deadline")
            .expect("no consumer error");
        seen.insert(message.payload_view::<str>().unwrap().unwrap().to_owned());
    }
    let expected: BTreeSet<String> = ["p0-3", "p0-4"]
        .into_iter()
        .map(str::to_owned)
        .chain((1..3).flat_map(|p| (0..5).map(move |i| format!("p{p}-{i}"))))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(
        heartbeat(&mut client, "g-takeover", &raw, raw_gen).await,
        ResponseError::UnknownMemberId.code(),
        "the silent member was removed"
    );

    // By now (over 6 s later) the silent member of g-expire has expired too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (state, members) = describe(&mut client, "g-expire").await;
        if state == "Empty" {
            assert_eq!(members, 0);
            break;
        }
        assert!(Instant::now() < deadline, "g-expire still {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        heartbeat(&mut client, "g-expire", &silent, silent_gen).await,
        ResponseError::UnknownMemberId.code()
    );

    // LeaveGroup v3 batch: unknown members get per-member errors.
    let left: LeaveGroupResponse = client
        .call(
            ApiKey::LeaveGroup,
            3,
            &LeaveGroupRequest::default()
                .with_group_id(GroupId(s("g-expire")))
                .with_members(vec![MemberIdentity::default().with_member_id(s(&silent))]),
        )
        .await;
    assert_eq!(left.error_code, 0);
    assert_eq!(
        left.members[0].error_code,
        ResponseError::UnknownMemberId.code()
    );

    tokio::task::spawn_blocking(move || drop(consumer))
        .await
        .unwrap();
    broker.shutdown().await;
}

/// Every advertised version of every group API, in one member's life: join, sync, heartbeat,
/// commit, fetch, describe, list, leave. Each response must decode exactly at that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_group_api_version_round_trips() {
    let broker = start(BrokerConfig::default()).await.expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let topic = "sweep";
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for r in admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let mut client = RawClient::connect(&bootstrap).await;
    for v in 0..=4_i16 {
        let req = if v >= 4 {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![s("g")])
        } else {
            FindCoordinatorRequest::default().with_key(s("g"))
        };
        let resp: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, v, &req).await;
        let (error, port) = if v >= 4 {
            (resp.coordinators[0].error_code, resp.coordinators[0].port)
        } else {
            (resp.error_code, resp.port)
        };
        assert_eq!(
            (error, port),
            (0, broker.local_addr().port() as i32),
            "FindCoordinator v{v}"
        );
    }
    for v in 0..=9_i16 {
        let group = format!("sweep-{v}");
        let mut joined: JoinGroupResponse = client
            .call(ApiKey::JoinGroup, v, &join_request(&group, "", topic))
            .await;
        if v >= 4 {
            assert_eq!(
                joined.error_code,
                ResponseError::MemberIdRequired.code(),
                "JoinGroup v{v}"
            );
            let id = joined.member_id.to_string();
            joined = client
                .call(ApiKey::JoinGroup, v, &join_request(&group, &id, topic))
                .await;
        }
        assert_eq!(joined.error_code, 0, "JoinGroup v{v}");
        assert_eq!(joined.generation_id, 1);
        let member = joined.member_id.to_string();
        let generation = joined.generation_id;

        let sv = v.min(5);
        let mut sync_req = SyncGroupRequest::default()
            .with_group_id(GroupId(s(&group)))
            .with_generation_id(generation)
            .with_member_id(s(&member))
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(s(&member))
                .with_assignment(assignment(topic, &[0]))]);
        if sv >= 5 {
            sync_req = sync_req
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s("range")));
        }
        let sync: SyncGroupResponse = client.call(ApiKey::SyncGroup, sv, &sync_req).await;
        assert_eq!(sync.error_code, 0, "SyncGroup v{sv}");
        assert_eq!(sync.assignment, assignment(topic, &[0]));

        let hv = v.min(4);
        let hb: HeartbeatResponse = client
            .call(
                ApiKey::Heartbeat,
                hv,
                &HeartbeatRequest::default()
                    .with_group_id(GroupId(s(&group)))
                    .with_generation_id(generation)
                    .with_member_id(s(&member)),
            )
            .await;
        assert_eq!(hb.error_code, 0, "Heartbeat v{hv}");

        let cv = v.clamp(2, 9);
        let commit: OffsetCommitResponse = client
            .call(
                ApiKey::OffsetCommit,
                cv,
                &OffsetCommitRequest::default()
                    .with_group_id(GroupId(s(&group)))
                    .with_generation_id_or_member_epoch(generation)
                    .with_member_id(s(&member))
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(topic)))
                        .with_partitions(vec![OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(i64::from(v) + 10)
                            .with_committed_metadata(Some(s("meta")))])]),
            )
            .await;
        assert_eq!(
            commit.topics[0].partitions[0].error_code, 0,
            "OffsetCommit v{cv}"
        );

        let fv = v.clamp(1, 9);
        let fetched: OffsetFetchResponse = if fv >= 8 {
            client
                .call(
                    ApiKey::OffsetFetch,
                    fv,
                    &OffsetFetchRequest::default()
                        .with_require_stable(true)
                        .with_groups(vec![OffsetFetchRequestGroup::default()
                            .with_group_id(GroupId(s(&group)))
                            .with_topics(None)]),
                )
                .await
        } else {
            let topics = vec![
                kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic::default()
                    .with_name(TopicName(s(topic)))
                    .with_partition_indexes(vec![0]),
            ];
            let mut req = OffsetFetchRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_topics(Some(topics));
            if fv >= 7 {
                req = req.with_require_stable(true);
            }
            client.call(ApiKey::OffsetFetch, fv, &req).await
        };
        let (offset, metadata) = if fv >= 8 {
            let p = &fetched.groups[0].topics[0].partitions[0];
            (p.committed_offset, p.metadata.clone())
        } else {
            let p = &fetched.topics[0].partitions[0];
            (p.committed_offset, p.metadata.clone())
        };
        assert_eq!(offset, i64::from(v) + 10, "OffsetFetch v{fv}");
        assert_eq!(metadata.as_ref().map(|m| m.as_str()), Some("meta"));

        let dv = v.min(5);
        let described: DescribeGroupsResponse = client
            .call(
                ApiKey::DescribeGroups,
                dv,
                &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
            )
            .await;
        let g = &described.groups[0];
        assert_eq!(
            (
                g.group_state.as_str(),
                g.protocol_data.as_str(),
                g.members.len()
            ),
            ("Stable", "range", 1),
            "DescribeGroups v{dv}"
        );
        assert_eq!(g.members[0].member_assignment, assignment(topic, &[0]));

        let lv = v.min(5);
        let listed: ListGroupsResponse = client
            .call(ApiKey::ListGroups, lv, &ListGroupsRequest::default())
            .await;
        assert!(
            listed.groups.iter().any(|g| g.group_id.as_str() == group),
            "ListGroups v{lv}"
        );

        let leave_v = v.min(5);
        let leave_req = if leave_v >= 3 {
            LeaveGroupRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_members(vec![MemberIdentity::default().with_member_id(s(&member))])
        } else {
            LeaveGroupRequest::default()
                .with_group_id(GroupId(s(&group)))
                .with_member_id(s(&member))
        };
        let left: LeaveGroupResponse = client.call(ApiKey::LeaveGroup, leave_v, &leave_req).await;
        assert_eq!(left.error_code, 0, "LeaveGroup v{leave_v}");
        let (state, members) = describe(&mut client, &group).await;
        assert_eq!((state.as_str(), members), ("Empty", 0));
    }
    broker.shutdown().await;
}
