//! Tests of the request guard: every advertised version of every walked API, encoded by the
//! kafka-protocol crate with populated fields, must be accepted and consumed exactly; absurd
//! array counts must be refused.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::{check, walk, GuardError, COORDINATOR_MAX_VERSIONS, WALKED, WITHOUT_ARRAYS};
use crate::handlers::api_versions::SUPPORTED;

fn name(s: &'static str) -> TopicName {
    TopicName(StrBytes::from_static_str(s))
}

fn str(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}

fn encoded<T: Encodable>(body: &T, version: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    body.encode(&mut buf, version).expect("encodes");
    buf.to_vec()
}

#[path = "request_guard_config_samples.rs"]
mod config_samples;

fn sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
    let b = match api {
        ApiKey::DeleteRecords | ApiKey::AlterConfigs | ApiKey::IncrementalAlterConfigs => {
            return config_samples::sample(api, version)
        }
        ApiKey::Produce => {
            let partition = |i| {
                PartitionProduceData::default()
                    .with_index(i)
                    .with_records(Some(Bytes::from_static(b"0123456789abcdef")))
            };
            let topic = |n| {
                TopicProduceData::default()
                    .with_name(name(n))
                    .with_partition_data(vec![partition(0), partition(1)])
            };
            encoded(
                &ProduceRequest::default()
                    .with_transactional_id(Some(TransactionalId(str("tx"))))
                    .with_acks(-1)
                    .with_timeout_ms(30_000)
                    .with_topic_data(vec![topic("a"), topic("bb")]),
                version,
            )
        }
        ApiKey::Fetch => {
            let partition = |i| {
                FetchPartition::default()
                    .with_partition(i)
                    .with_fetch_offset(77)
                    .with_partition_max_bytes(1 << 20)
                    .with_log_start_offset(if version >= 5 { 3 } else { -1 })
                    .with_current_leader_epoch(if version >= 9 { 2 } else { -1 })
                    .with_last_fetched_epoch(if version >= 12 { 1 } else { -1 })
            };
            let mut req = FetchRequest::default()
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(52_428_800)
                .with_isolation_level(1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(name("t"))
                    .with_partitions(vec![partition(0), partition(3)])]);
            if version >= 7 {
                req = req.with_session_epoch(-1).with_forgotten_topics_data(vec![
                    ForgottenTopic::default()
                        .with_topic(name("old"))
                        .with_partitions(vec![1, 2, 3]),
                ]);
            }
            if version >= 11 {
                req = req.with_rack_id(str("rack-a"));
            }
            encoded(&req, version)
        }
        ApiKey::ListOffsets => {
            let partition = |i| {
                ListOffsetsPartition::default()
                    .with_partition_index(i)
                    .with_timestamp(-1)
                    .with_current_leader_epoch(if version >= 4 { 5 } else { -1 })
            };
            encoded(
                &ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_isolation_level(if version >= 2 { 1 } else { 0 })
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(name("t"))
                        .with_partitions(vec![partition(0), partition(1)])]),
                version,
            )
        }
        ApiKey::Metadata => {
            let topics = vec![
                MetadataRequestTopic::default().with_name(Some(name("a"))),
                MetadataRequestTopic::default().with_name(Some(name("bbb"))),
            ];
            let mut req = MetadataRequest::default().with_topics(Some(topics));
            if version >= 4 {
                req = req.with_allow_auto_topic_creation(true);
            }
            if version >= 8 {
                req = req.with_include_topic_authorized_operations(true);
            }
            if (8..=10).contains(&version) {
                req = req.with_include_cluster_authorized_operations(true);
            }
            encoded(&req, version)
        }
        ApiKey::CreateTopics => {
            let topic = CreatableTopic::default()
                .with_name(name("new"))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_assignments(vec![CreatableReplicaAssignment::default()
                    .with_partition_index(0)
                    .with_broker_ids(vec![BrokerId(0), BrokerId(1)])])
                .with_configs(vec![CreatableTopicConfig::default()
                    .with_name(str("retention.ms"))
                    .with_value(Some(str("1000")))]);
            encoded(
                &CreateTopicsRequest::default()
                    .with_topics(vec![topic.clone(), topic.with_name(name("other"))])
                    .with_timeout_ms(5000)
                    .with_validate_only(true),
                version,
            )
        }
        ApiKey::DeleteTopics => encoded(
            &DeleteTopicsRequest::default()
                .with_topic_names(vec![name("a"), name("bcd")])
                .with_timeout_ms(5000),
            version,
        ),
        ApiKey::DescribeConfigs => encoded(
            &DescribeConfigsRequest::default()
                .with_resources(vec![
                    DescribeConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(str("t"))
                        .with_configuration_keys(Some(vec![str("segment.bytes"), str("x")])),
                    DescribeConfigsResource::default()
                        .with_resource_type(4)
                        .with_resource_name(str("0"))
                        .with_configuration_keys(None),
                ])
                .with_include_synonyms(true)
                .with_include_documentation(version >= 3),
            version,
        ),
        ApiKey::CreatePartitions
        | ApiKey::DescribeProducers
        | ApiKey::ListTransactions
        | ApiKey::DescribeTransactions
        | ApiKey::WriteTxnMarkers => return admin_sample(api, version),
        _ => return coordinator_sample(api, version),
    };
    Some(b)
}

#[test]
fn every_advertised_version_is_walked_exactly() {
    let mut walked = 0;
    for &(api, min, max) in SUPPORTED {
        for version in min..=max {
            let Some(body) = sample(api, version) else {
                continue;
            };
            assert_eq!(
                walk(api, version, &body),
                Ok(body.len()),
                "{api:?} v{version}"
            );
            // Every strict prefix is refused or stops short (never reads past the end).
            for cut in 0..body.len() {
                if let Ok(n) = walk(api, version, &body[..cut]) {
                    assert!(n <= cut, "{api:?} v{version} cut {cut}");
                }
            }
            walked += 1;
        }
    }
    assert!(walked > 40, "only {walked} versions walked");
}

#[test]
fn absurd_array_counts_are_refused() {
    // Metadata v1 claiming i32::MAX topics.
    let mut body = BytesMut::new();
    body.put_i32(i32::MAX);
    assert!(matches!(
        check(ApiKey::Metadata, 1, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
    // Produce v9 (compact): a partition array with a huge varint count.
    let mut body = BytesMut::new();
    body.put_u8(0); // null transactional id
    body.put_i16(1);
    body.put_i32(1000);
    body.put_u8(2); // one topic
    body.put_u8(2); // name "x"
    body.put_u8(b'x');
    body.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // 2^32-1 partitions
    assert!(matches!(
        check(ApiKey::Produce, 9, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
    // Fetch v4: a topic claiming a hundred million partitions in a tiny frame.
    let mut body = BytesMut::new();
    body.put_slice(&[0; 17]);
    body.put_i32(1);
    body.put_i16(1);
    body.put_u8(b't');
    body.put_i32(100_000_000);
    assert!(matches!(
        check(ApiKey::Fetch, 4, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
}

#[test]
fn apis_without_arrays_pass_unwalked() {
    assert_eq!(check(ApiKey::ApiVersions, 3, &[1, 2, 3]), Ok(()));
    assert_eq!(check(ApiKey::InitProducerId, 4, &[]), Ok(()));
}

#[test]
fn every_advertised_api_is_guarded() {
    for &(api, min, max) in SUPPORTED {
        assert!(
            WALKED.contains(&api) || WITHOUT_ARRAYS.contains(&api),
            "{api:?} is advertised but request_guard.rs neither walks it nor lists it as \
             array-free: add a walk (the decoder would trust its array counts)"
        );
        if let Some(&(_, walked_max)) = COORDINATOR_MAX_VERSIONS.iter().find(|(k, _)| *k == api) {
            assert!(
                max <= walked_max,
                "{api:?} advertised up to v{max}, walked to v{walked_max}"
            );
        } else if WALKED.contains(&api) {
            for version in min..=max {
                assert!(
                    sample(api, version).is_some(),
                    "no sample for {api:?} v{version}"
                );
            }
        }
    }
}

fn group(s: &'static str) -> GroupId {
    GroupId(StrBytes::from_static_str(s))
}

/// Populated transaction/group coordinator requests.
fn coordinator_sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
    use kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    let txn = || TransactionalId(str("txn-1"));
    let topics = || {
        vec![
            AddPartitionsToTxnTopic::default()
                .with_name(name("a"))
                .with_partitions(vec![0, 1, 2]),
            AddPartitionsToTxnTopic::default().with_name(name("bb")),
        ]
    };
    let b = match api {
        ApiKey::AddPartitionsToTxn if version >= 4 => encoded(
            &AddPartitionsToTxnRequest::default().with_transactions(vec![
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(txn())
                    .with_producer_id(ProducerId(7))
                    .with_producer_epoch(1)
                    .with_verify_only(true)
                    .with_topics(topics()),
                AddPartitionsToTxnTransaction::default().with_transactional_id(txn()),
            ]),
            version,
        ),
        ApiKey::AddPartitionsToTxn => encoded(
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(txn())
                .with_v3_and_below_producer_id(ProducerId(7))
                .with_v3_and_below_producer_epoch(1)
                .with_v3_and_below_topics(topics()),
            version,
        ),
        ApiKey::TxnOffsetCommit => {
            let partition = |i| {
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(i)
                    .with_committed_offset(99)
                    .with_committed_leader_epoch(if version >= 2 { 3 } else { -1 })
                    .with_committed_metadata(Some(str("meta")))
            };
            let mut req = TxnOffsetCommitRequest::default()
                .with_transactional_id(txn())
                .with_group_id(group("g"))
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(1)
                .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                    .with_name(name("t"))
                    .with_partitions(vec![partition(0), partition(1)])]);
            if version >= 3 {
                req = req
                    .with_generation_id(4)
                    .with_member_id(str("member"))
                    .with_group_instance_id(Some(str("inst")));
            }
            encoded(&req, version)
        }
        ApiKey::FindCoordinator => {
            let mut req = FindCoordinatorRequest::default();
            if version <= 3 {
                req = req.with_key(str("group-or-txn"));
            } else {
                req = req.with_coordinator_keys(vec![str("k1"), str("key-two")]);
            }
            if version >= 1 {
                req = req.with_key_type(1);
            }
            encoded(&req, version)
        }
        ApiKey::JoinGroup => {
            let mut req = JoinGroupRequest::default()
                .with_group_id(group("g"))
                .with_session_timeout_ms(10_000)
                .with_member_id(str("m"))
                .with_protocol_type(str("consumer"))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(str("range"))
                        .with_metadata(Bytes::from_static(b"meta")),
                    JoinGroupRequestProtocol::default().with_name(str("roundrobin")),
                ]);
            if version >= 1 {
                req = req.with_rebalance_timeout_ms(30_000);
            }
            if version >= 5 {
                req = req.with_group_instance_id(Some(str("inst")));
            }
            if version >= 8 {
                req = req.with_reason(Some(str("why")));
            }
            encoded(&req, version)
        }
        ApiKey::SyncGroup => {
            let mut req = SyncGroupRequest::default()
                .with_group_id(group("g"))
                .with_generation_id(3)
                .with_member_id(str("m"))
                .with_assignments(vec![
                    SyncGroupRequestAssignment::default()
                        .with_member_id(str("m"))
                        .with_assignment(Bytes::from_static(b"assignment")),
                    SyncGroupRequestAssignment::default().with_member_id(str("n")),
                ]);
            if version >= 3 {
                req = req.with_group_instance_id(Some(str("inst")));
            }
            if version >= 5 {
                req = req
                    .with_protocol_type(Some(str("consumer")))
                    .with_protocol_name(Some(str("range")));
            }
            encoded(&req, version)
        }
        ApiKey::LeaveGroup => {
            let mut req = LeaveGroupRequest::default().with_group_id(group("g"));
            if version <= 2 {
                req = req.with_member_id(str("m"));
            } else {
                let member = |m| {
                    MemberIdentity::default()
                        .with_member_id(str(m))
                        .with_group_instance_id(Some(str("inst")))
                        .with_reason(if version >= 5 { Some(str("bye")) } else { None })
                };
                req = req.with_members(vec![member("m"), member("n")]);
            }
            encoded(&req, version)
        }
        ApiKey::OffsetCommit => {
            let partition = |i| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(i)
                    .with_committed_offset(42)
                    .with_committed_leader_epoch(if version >= 6 { 2 } else { -1 })
                    .with_committed_metadata(Some(str("m")))
            };
            let mut req = OffsetCommitRequest::default()
                .with_group_id(group("g"))
                .with_generation_id_or_member_epoch(5)
                .with_member_id(str("member"))
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(name("t"))
                    .with_partitions(vec![partition(0), partition(1)])]);
            if version >= 7 {
                req = req.with_group_instance_id(Some(str("inst")));
            }
            if version <= 4 {
                req = req.with_retention_time_ms(-1);
            }
            encoded(&req, version)
        }
        ApiKey::OffsetFetch if version >= 8 => {
            let topics = vec![OffsetFetchRequestTopics::default()
                .with_name(name("t"))
                .with_partition_indexes(vec![0, 1])];
            let mut g = OffsetFetchRequestGroup::default()
                .with_group_id(group("g"))
                .with_topics(Some(topics));
            if version >= 9 {
                g = g.with_member_id(Some(str("m"))).with_member_epoch(3);
            }
            let other = OffsetFetchRequestGroup::default().with_group_id(group("h"));
            encoded(
                &OffsetFetchRequest::default()
                    .with_groups(vec![g, other])
                    .with_require_stable(true),
                version,
            )
        }
        ApiKey::OffsetFetch => {
            let topics = vec![
                OffsetFetchRequestTopic::default()
                    .with_name(name("t"))
                    .with_partition_indexes(vec![0, 1, 2]),
                OffsetFetchRequestTopic::default().with_name(name("u")),
            ];
            let mut req = OffsetFetchRequest::default()
                .with_group_id(group("g"))
                .with_topics(Some(topics));
            if version >= 7 {
                req = req.with_require_stable(true);
            }
            encoded(&req, version)
        }
        ApiKey::DescribeGroups => encoded(
            &DescribeGroupsRequest::default()
                .with_groups(vec![group("g"), group("other")])
                .with_include_authorized_operations(version >= 3),
            version,
        ),
        ApiKey::ListGroups => {
            let mut req = ListGroupsRequest::default();
            if version >= 4 {
                req = req.with_states_filter(vec![str("Stable"), str("Empty")]);
            }
            if version >= 5 {
                req = req.with_types_filter(vec![str("classic")]);
            }
            encoded(&req, version)
        }
        ApiKey::CreateAcls => {
            use kafka_protocol::messages::create_acls_request::AclCreation;
            let acl = |n| {
                AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(str(n))
                    .with_resource_pattern_type(3)
                    .with_principal(str("User:alice"))
                    .with_host(str("*"))
                    .with_operation(3)
                    .with_permission_type(3)
            };
            encoded(
                &CreateAclsRequest::default().with_creations(vec![acl("a"), acl("bb")]),
                version,
            )
        }
        ApiKey::DeleteAcls => {
            use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
            let filter = |n: Option<&'static str>| {
                DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_resource_name_filter(n.map(str))
                    .with_pattern_type_filter(1)
                    .with_principal_filter(Some(str("User:alice")))
                    .with_host_filter(None)
                    .with_operation(1)
                    .with_permission_type(1)
            };
            encoded(
                &DeleteAclsRequest::default().with_filters(vec![filter(Some("t")), filter(None)]),
                version,
            )
        }
        _ => return None,
    };
    Some(b)
}

#[test]
fn coordinator_requests_are_walked_exactly() {
    let mut walked = 0;
    for &(api, max) in COORDINATOR_MAX_VERSIONS {
        for version in api.valid_versions().min..=max {
            let body = coordinator_sample(api, version).expect("sample");
            assert_eq!(
                walk(api, version, &body),
                Ok(body.len()),
                "{api:?} v{version}"
            );
            for cut in 0..body.len() {
                if let Ok(n) = walk(api, version, &body[..cut]) {
                    assert!(n <= cut, "{api:?} v{version} cut {cut}");
                }
            }
            walked += 1;
        }
    }
    assert!(walked > 60, "only {walked} versions walked");
    // A bomb in a group API: DescribeGroups v0 claiming i32::MAX groups.
    let mut body = BytesMut::new();
    body.put_i32(i32::MAX);
    assert!(matches!(
        check(ApiKey::DescribeGroups, 0, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
}

/// Populated admin requests (CreatePartitions, KIP-664's transaction APIs).
fn admin_sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
    use kafka_protocol::messages::create_partitions_request::{
        CreatePartitionsAssignment, CreatePartitionsTopic,
    };
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    let b = match api {
        ApiKey::CreatePartitions => {
            let assigned = CreatePartitionsTopic::default()
                .with_name(name("t"))
                .with_count(4)
                .with_assignments(Some(vec![
                    CreatePartitionsAssignment::default().with_broker_ids(vec![BrokerId(0)]),
                    CreatePartitionsAssignment::default()
                        .with_broker_ids(vec![BrokerId(0), BrokerId(1)]),
                ]));
            let plain = CreatePartitionsTopic::default()
                .with_name(name("uu"))
                .with_count(9)
                .with_assignments(None);
            encoded(
                &CreatePartitionsRequest::default()
                    .with_topics(vec![assigned, plain])
                    .with_timeout_ms(5000)
                    .with_validate_only(true),
                version,
            )
        }
        ApiKey::DescribeProducers => encoded(
            &DescribeProducersRequest::default().with_topics(vec![
                TopicRequest::default()
                    .with_name(name("t"))
                    .with_partition_indexes(vec![0, 1, 2]),
                TopicRequest::default().with_name(name("empty")),
            ]),
            version,
        ),
        ApiKey::ListTransactions => {
            let mut req = ListTransactionsRequest::default()
                .with_state_filters(vec![str("Ongoing"), str("Bogus")])
                .with_producer_id_filters(vec![ProducerId(7), ProducerId(9)]);
            if version >= 1 {
                req = req.with_duration_filter(60_000);
            }
            encoded(&req, version)
        }
        ApiKey::DescribeTransactions => encoded(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![
                TransactionalId(str("a")),
                TransactionalId(str("txn-two")),
            ]),
            version,
        ),
        ApiKey::WriteTxnMarkers => {
            let marker = |pid| {
                WritableTxnMarker::default()
                    .with_producer_id(ProducerId(pid))
                    .with_producer_epoch(3)
                    .with_transaction_result(false)
                    .with_coordinator_epoch(2)
                    .with_topics(vec![WritableTxnMarkerTopic::default()
                        .with_name(name("t"))
                        .with_partition_indexes(vec![0, 5])])
            };
            encoded(
                &WriteTxnMarkersRequest::default().with_markers(vec![marker(7), marker(8)]),
                version,
            )
        }
        _ => return None,
    };
    Some(b)
}

#[test]
fn admin_requests_refuse_absurd_and_negative_counts() {
    // CreatePartitions v1 claiming i32::MAX topics.
    let mut body = BytesMut::new();
    body.put_i32(i32::MAX);
    assert!(matches!(
        check(ApiKey::CreatePartitions, 1, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
    // CreatePartitions v0: one topic whose assignments claim a hundred million entries.
    let mut body = BytesMut::new();
    body.put_i32(1);
    body.put_i16(1);
    body.put_u8(b't');
    body.put_i32(8); // count
    body.put_i32(100_000_000);
    assert!(matches!(
        check(ApiKey::CreatePartitions, 0, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
    // A negative (null) assignments count is accepted by the walk, as the schema allows.
    let mut body = BytesMut::new();
    body.put_i32(1);
    body.put_i16(1);
    body.put_u8(b't');
    body.put_i32(8);
    body.put_i32(-1);
    body.put_i32(5000);
    body.put_u8(0);
    assert_eq!(walk(ApiKey::CreatePartitions, 0, &body), Ok(body.len()));
    // A negative topic count is an empty (null) array; a bare negative partition count
    // inside DescribeProducers is too, and the rest of the body must still parse.
    let mut body = BytesMut::new();
    body.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // compact count 2^32-1 topics
    for api in [
        ApiKey::DescribeProducers,
        ApiKey::DescribeTransactions,
        ApiKey::ListTransactions,
        ApiKey::WriteTxnMarkers,
    ] {
        let version = api_versions_min(api);
        assert!(
            matches!(
                check(api, version, &body),
                Err(GuardError::ArrayTooLong { .. })
            ),
            "{api:?}"
        );
    }
    // ListTransactions: a sane state filter then a producer-id array of a billion ids.
    let mut body = BytesMut::new();
    body.put_u8(1); // no state filters
    body.put_slice(&[0x81, 0x94, 0xeb, 0xdc, 0x03]); // 1e9 ids
    body.put_slice(&[0; 8]);
    body.put_u8(0);
    assert!(matches!(
        check(ApiKey::ListTransactions, 1, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
    // WriteTxnMarkers: one marker whose topic claims a million partitions.
    let mut body = BytesMut::new();
    body.put_u8(2); // one marker
    body.put_i64(7);
    body.put_i16(0);
    body.put_u8(0);
    body.put_u8(2); // one topic
    body.put_u8(2);
    body.put_u8(b't');
    body.put_slice(&[0xc1, 0x84, 0x3d]); // 1_000_001
    assert!(matches!(
        check(ApiKey::WriteTxnMarkers, 1, &body),
        Err(GuardError::ArrayTooLong { .. })
    ));
}

fn api_versions_min(api: ApiKey) -> i16 {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == api)
        .map_or(0, |&(_, min, _)| min)
}
