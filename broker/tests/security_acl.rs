//! ACLs over TCP: principals authenticated with SASL/PLAIN on a SASL_PLAINTEXT listener get
//! Kafka's authorization error codes per API (TOPIC 29, GROUP 30, CLUSTER 31,
//! TRANSACTIONAL_ID 53), Metadata filters and reports authorized operations, and
//! CreateAcls/DescribeAcls/DeleteAcls round-trip and survive a broker restart.

use anyhow::{ensure, Context as _, Result};
use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, BrokerId, CreateAclsRequest,
    CreatePartitionsRequest, CreateTopicsRequest, DeleteAclsRequest, DeleteRecordsRequest,
    DeleteTopicsRequest, DescribeAclsRequest, DescribeConfigsRequest, DescribeGroupsRequest,
    EndTxnRequest, FindCoordinatorRequest, GroupId, IncrementalAlterConfigsRequest,
    InitProducerIdRequest, JoinGroupRequest, ListOffsetsRequest, MetadataRequest,
    OffsetCommitRequest, OffsetFetchRequest, ProducerId, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use onceflow_testkit::broker_process::BrokerProcess;
use onceflow_testkit::broker_process::Storage;
use onceflow_testkit::raw::idempotent_batch;
use onceflow_testkit::raw::topic_name;
use onceflow_testkit::raw::RawClient;
use onceflow_testkit::security::{arg, plain_login};

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const GROUP_AUTHORIZATION_FAILED: i16 = 30;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// AclOperation codes.
const READ: i8 = 3;
const WRITE: i8 = 4;
const DESCRIBE: i8 = 8;
/// ResourceType codes.
const ANY_RESOURCE: i8 = 1;
const GROUP: i8 = 3;
/// PatternType codes.
const ANY_PATTERN: i8 = 1;
const LITERAL: i8 = 3;
/// Permission codes.
const ANY_PERMISSION: i8 = 1;
const ALLOW: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

struct AclBroker {
    broker: BrokerProcess,
    _files: tempfile::TempDir,
    _data: tempfile::TempDir,
}

impl AclBroker {
    fn start() -> Result<Self> {
        Self::start_with("")
    }

    /// The broker with the base ACLs plus `extra` lines of the ACL file.
    fn start_with(extra: &str) -> Result<Self> {
        let files = tempfile::tempdir()?;
        let users = files.path().join("users");
        std::fs::write(
            &users,
            "admin:plain:admin-pw\nalice:plain:alice-pw\nbob:plain:bob-pw\n",
        )?;
        let acls = files.path().join("acls");
        std::fs::write(
            &acls,
            format!(
                "# alice may produce to and consume from `allowed`, and describe group g-desc\n\
             User:alice * Write Allow Topic Literal allowed\n\
             User:alice * Read Allow Topic Literal allowed\n\
             User:alice * Describe Allow Group Literal g-desc\n\
             User:alice * All Deny Topic Prefixed secret\n{extra}"
            ),
        )?;
        let data = tempfile::tempdir()?;
        let (users, acls) = (arg(&users), arg(&acls));
        let broker = BrokerProcess::spawn(
            Storage::Durable {
                dir: data.path().to_path_buf(),
                fsync: "every-batch".into(),
            },
            &[
                "--listener",
                "SASL_PLAINTEXT://127.0.0.1:0",
                "--sasl-users",
                &users,
                "--acl-file",
                &acls,
                "--super-user",
                "User:admin",
            ],
        )?;
        Ok(AclBroker {
            broker,
            _files: files,
            _data: data,
        })
    }

    fn login(&self, user: &str) -> Result<RawClient> {
        let addr = self
            .broker
            .listener_addr("SASL_PLAINTEXT")
            .context("no SASL listener")?;
        let mut client = RawClient::connect(addr)?;
        let code = plain_login(&mut client, user, &format!("{user}-pw"))?;
        ensure!(code == 0, "{user} login failed with {code}");
        Ok(client)
    }
}

fn create_topics(client: &mut RawClient, names: &[&str]) -> Result<Vec<i16>> {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(
            names
                .iter()
                .map(|n| {
                    CreatableTopic::default()
                        .with_name(topic_name(n))
                        .with_num_partitions(1)
                        .with_replication_factor(1)
                })
                .collect(),
        );
    Ok(client
        .request(&req, 5)?
        .topics
        .iter()
        .map(|t| t.error_code)
        .collect())
}

fn find_coordinator(client: &mut RawClient, key: &str, key_type: i8) -> Result<i16> {
    let req = FindCoordinatorRequest::default()
        .with_key(s(key))
        .with_key_type(key_type);
    Ok(client.request(&req, 3)?.error_code)
}

fn alice_acl(resource_type: i8, name: &str, operation: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_resource_pattern_type(LITERAL)
        .with_principal(s("User:alice"))
        .with_host(s("*"))
        .with_operation(operation)
        .with_permission_type(ALLOW)
}

fn describe_alice(client: &mut RawClient) -> Result<Vec<(i8, String, i8)>> {
    let req = DescribeAclsRequest::default()
        .with_resource_type_filter(ANY_RESOURCE)
        .with_pattern_type_filter(ANY_PATTERN)
        .with_resource_name_filter(None)
        .with_host_filter(None)
        .with_principal_filter(Some(s("User:alice")))
        .with_operation(1)
        .with_permission_type(ANY_PERMISSION);
    let resp = client.request(&req, 3)?;
    ensure!(
        resp.error_code == 0,
        "DescribeAcls error {}",
        resp.error_code
    );
    let mut out = Vec::new();
    for r in resp.resources {
        for a in r.acls {
            out.push((r.resource_type, r.resource_name.to_string(), a.operation));
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn acl_denials_per_api() -> Result<()> {
    let b = AclBroker::start()?;
    let mut admin = b.login("admin")?;
    ensure!(
        create_topics(&mut admin, &["allowed", "denied", "secret-x"])? == [0, 0, 0],
        "admin could not create topics"
    );
    let mut alice = b.login("alice")?;

    // Metadata: named unauthorized topics get 29, the all-topics list leaves them out, and
    // authorized operations are Kafka's bitfield (Read + Write + implied Describe).
    let meta = alice.request(
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic_name("allowed"))),
                MetadataRequestTopic::default().with_name(Some(topic_name("denied"))),
            ]))
            .with_allow_auto_topic_creation(false)
            .with_include_topic_authorized_operations(true),
        12,
    )?;
    let by_name = |name: &str| {
        meta.topics
            .iter()
            .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(name))
    };
    let allowed = by_name("allowed").context("allowed missing")?;
    ensure!(allowed.error_code == 0, "allowed: {}", allowed.error_code);
    ensure!(
        allowed.topic_authorized_operations == (1 << READ) | (1 << WRITE) | (1 << DESCRIBE),
        "authorized operations {:#b}",
        allowed.topic_authorized_operations
    );
    ensure!(by_name("denied").context("denied missing")?.error_code == TOPIC_AUTHORIZATION_FAILED);
    let all = alice.request(&MetadataRequest::default().with_topics(None), 12)?;
    let names: Vec<String> = all
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    ensure!(names == ["allowed"], "all-topics metadata shows {names:?}");

    // Idempotent InitProducerId: alice has Write on a topic; bob has nothing.
    let (pid, epoch) = alice.init_producer_id(4)?;
    let mut bob = b.login("bob")?;
    let resp = bob.request(
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(-1),
        4,
    )?;
    ensure!(
        resp.error_code == CLUSTER_AUTHORIZATION_FAILED,
        "bob InitProducerId {}",
        resp.error_code
    );

    // Produce / Fetch.
    let batch = idempotent_batch(pid, epoch, 0, &["a", "b"])?;
    let ok = alice.produce(9, "allowed", 0, batch)?;
    ensure!(ok.error_code == 0, "produce to allowed: {}", ok.error_code);
    let batch = idempotent_batch(pid, epoch, 0, &["x"])?;
    let denied = alice.produce(9, "denied", 0, batch)?;
    ensure!(
        denied.error_code == TOPIC_AUTHORIZATION_FAILED,
        "produce to denied: {}",
        denied.error_code
    );
    let batch = idempotent_batch(pid, epoch, 0, &["x"])?;
    let deny_wins = alice.produce(9, "secret-x", 0, batch)?;
    ensure!(
        deny_wins.error_code == TOPIC_AUTHORIZATION_FAILED,
        "produce to secret-x: {}",
        deny_wins.error_code
    );
    let (code, _, _) = alice.fetch(12, "allowed", 0, 0)?;
    ensure!(code == 0, "fetch allowed: {code}");
    let (code, _, _) = alice.fetch(12, "denied", 0, 0)?;
    ensure!(code == TOPIC_AUTHORIZATION_FAILED, "fetch denied: {code}");

    // Transactions: no Write on the transactional id.
    let resp = alice.request(
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s("tx-1"))))
            .with_transaction_timeout_ms(10_000),
        4,
    )?;
    ensure!(
        resp.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "txn InitProducerId {}",
        resp.error_code
    );
    ensure!(find_coordinator(&mut alice, "tx-1", 1)? == TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    let resp = alice.request(
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx-1")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_group_id(GroupId(s("g-desc"))),
        3,
    )?;
    ensure!(
        resp.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "AddOffsetsToTxn {}",
        resp.error_code
    );

    // Groups: Describe allows FindCoordinator and DescribeGroups, not JoinGroup.
    ensure!(find_coordinator(&mut alice, "g-desc", 0)? == 0);
    ensure!(find_coordinator(&mut alice, "g-other", 0)? == GROUP_AUTHORIZATION_FAILED);
    let join = alice.request(
        &JoinGroupRequest::default()
            .with_group_id(GroupId(s("g-desc")))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(""))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::new())]),
        5,
    )?;
    ensure!(
        join.error_code == GROUP_AUTHORIZATION_FAILED,
        "JoinGroup {}",
        join.error_code
    );
    let groups = alice.request(
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s("g-desc")), GroupId(s("g-other"))])
            .with_include_authorized_operations(true),
        5,
    )?;
    ensure!(groups.groups[0].error_code == 0);
    ensure!(
        groups.groups[0].authorized_operations == 1 << DESCRIBE,
        "{:#b}",
        groups.groups[0].authorized_operations
    );
    ensure!(groups.groups[1].error_code == GROUP_AUTHORIZATION_FAILED);

    // CreateTopics needs Create; the ACL APIs need Alter/Describe on the cluster.
    ensure!(create_topics(&mut alice, &["alice-new"])? == [TOPIC_AUTHORIZATION_FAILED]);
    let resp = alice.request(
        &CreateAclsRequest::default().with_creations(vec![alice_acl(GROUP, "g", READ)]),
        3,
    )?;
    ensure!(resp.results[0].error_code == CLUSTER_AUTHORIZATION_FAILED);
    let resp = alice.request(
        &DescribeAclsRequest::default()
            .with_resource_type_filter(ANY_RESOURCE)
            .with_pattern_type_filter(ANY_PATTERN)
            .with_operation(1)
            .with_permission_type(ANY_PERMISSION),
        3,
    )?;
    ensure!(resp.error_code == CLUSTER_AUTHORIZATION_FAILED);
    Ok(())
}

#[test]
fn acl_admin_round_trip_survives_restart() -> Result<()> {
    let mut b = AclBroker::start()?;
    let mut admin = b.login("admin")?;
    let before = describe_alice(&mut admin)?;
    ensure!(before.len() == 4, "file bindings: {before:?}");

    // alice gets Read on group g-read and on topic t-read.
    let resp = admin.request(
        &CreateAclsRequest::default().with_creations(vec![
            alice_acl(GROUP, "g-read", READ),
            alice_acl(2, "t-read", READ),
        ]),
        3,
    )?;
    ensure!(resp.results.iter().all(|r| r.error_code == 0), "{resp:?}");
    let mut alice = b.login("alice")?;
    ensure!(
        find_coordinator(&mut alice, "g-read", 0)? == 0,
        "Read implies Describe"
    );
    let after = describe_alice(&mut admin)?;
    ensure!(after.len() == 6, "{after:?}");

    // Delete the topic binding again.
    let resp = admin.request(
        &DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
            .with_resource_type_filter(2)
            .with_resource_name_filter(Some(s("t-read")))
            .with_pattern_type_filter(LITERAL)
            .with_principal_filter(Some(s("User:alice")))
            .with_host_filter(None)
            .with_operation(READ)
            .with_permission_type(ALLOW)]),
        3,
    )?;
    ensure!(resp.filter_results[0].error_code == 0);
    ensure!(resp.filter_results[0].matching_acls.len() == 1, "{resp:?}");

    // After a kill -9 and restart: g-read survives, t-read stays deleted.
    b.broker.restart()?;
    let mut admin = b.login("admin")?;
    let restarted = describe_alice(&mut admin)?;
    ensure!(restarted.len() == 5, "{restarted:?}");
    ensure!(restarted.contains(&(GROUP, "g-read".to_string(), READ)));
    ensure!(!restarted.iter().any(|(_, name, _)| name == "t-read"));
    let mut alice = b.login("alice")?;
    ensure!(find_coordinator(&mut alice, "g-read", 0)? == 0);
    Ok(())
}

const OPERATION_NOT_ATTEMPTED: i16 = 55;
/// DescribeConfigs resource types.
const CONFIG_TOPIC: i8 = 2;
const CONFIG_BROKER: i8 = 4;

/// (topic, partition error) of an AddPartitionsToTxn v3 answer.
fn add_partitions(
    client: &mut RawClient,
    txn: &str,
    (pid, epoch): (i64, i16),
    topics: &[&str],
) -> Result<Vec<(String, i16)>> {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(s(txn)))
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(
            topics
                .iter()
                .map(|t| {
                    AddPartitionsToTxnTopic::default()
                        .with_name(topic_name(t))
                        .with_partitions(vec![0])
                })
                .collect(),
        );
    let resp = client.request(&req, 3)?;
    let mut out = Vec::new();
    for t in resp.results_by_topic_v3_and_below {
        for p in t.results_by_partition {
            out.push((t.name.0.to_string(), p.partition_error_code));
        }
    }
    out.sort();
    Ok(out)
}

/// Partition errors of a TxnOffsetCommit v3 of offset 0 of `topic` partition 0.
fn txn_offset_commit(
    client: &mut RawClient,
    txn: &str,
    group: &str,
    (pid, epoch): (i64, i16),
    topic: &str,
) -> Result<Vec<i16>> {
    let req = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s(txn)))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_generation_id(-1)
        .with_member_id(s(""))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(0)])]);
    let resp = client.request(&req, 3)?;
    Ok(resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect())
}

/// Partition errors of a simple (no member) OffsetCommit v8 of offset 1 of `topic` partition 0.
fn offset_commit(client: &mut RawClient, group: &str, topic: &str) -> Result<Vec<i16>> {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(s(""))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(1)])]);
    let resp = client.request(&req, 8)?;
    Ok(resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect())
}

/// The first partition error of a ListOffsets v7 (latest) of `topic` partition 0.
fn list_offsets(client: &mut RawClient, topic: &str) -> Result<i16> {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    let resp = client.request(&req, 7)?;
    resp.topics
        .first()
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code)
        .context("empty ListOffsets answer")
}

/// The first partition error of a DeleteRecords v2 up to the high watermark (-1) of `topic`
/// partition 0.
fn delete_records(client: &mut RawClient, topic: &str) -> Result<i16> {
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(-1)])]);
    let resp = client.request(&req, 2)?;
    resp.topics
        .first()
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code)
        .context("empty DeleteRecords answer")
}

/// The error of a CreatePartitions v3 taking `topic` to `count` partitions.
fn create_partitions(client: &mut RawClient, topic: &str, count: i32) -> Result<i16> {
    let req = CreatePartitionsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(topic))
            .with_count(count)
            .with_assignments(None)]);
    let resp = client.request(&req, 3)?;
    resp.results
        .first()
        .map(|r| r.error_code)
        .context("empty CreatePartitions answer")
}

/// The error of a DescribeConfigs v4 of one resource.
fn describe_configs(client: &mut RawClient, resource_type: i8, name: &str) -> Result<i16> {
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(s(name))]);
    let resp = client.request(&req, 4)?;
    resp.results
        .first()
        .map(|r| r.error_code)
        .context("empty DescribeConfigs answer")
}

/// The error of an IncrementalAlterConfigs v1 setting `retention.ms` of `topic`.
fn alter_topic_config(client: &mut RawClient, topic: &str) -> Result<i16> {
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(CONFIG_TOPIC)
            .with_resource_name(s(topic))
            .with_configs(vec![AlterableConfig::default()
                .with_name(s("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(s("3600000")))]),
    ]);
    let resp = client.request(&req, 1)?;
    resp.responses
        .first()
        .map(|r| r.error_code)
        .context("empty IncrementalAlterConfigs answer")
}

/// The transaction, offset and admin APIs: each refuses with the code Kafka gives when the
/// principal lacks the permission Kafka checks for it, and works once the permission is there.
#[test]
fn acl_denials_of_transaction_offset_and_admin_apis() -> Result<()> {
    let b = AclBroker::start_with(
        "User:alice * Write Allow TransactionalId Literal tx-ok\n\
         User:alice * Read Allow Group Literal g-read\n",
    )?;
    let mut admin = b.login("admin")?;
    ensure!(
        create_topics(&mut admin, &["allowed", "denied"])? == [0, 0],
        "admin could not create topics"
    );
    let mut alice = b.login("alice")?;
    let init = alice.request(
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s("tx-ok"))))
            .with_transaction_timeout_ms(10_000),
        4,
    )?;
    ensure!(
        init.error_code == 0,
        "InitProducerId tx-ok {}",
        init.error_code
    );
    let producer = (init.producer_id.0, init.producer_epoch);

    // AddPartitionsToTxn: Write on the transactional id refuses every partition; then Write on
    // each topic: the denied topic gets 29 and the others are not attempted.
    let all_denied = add_partitions(&mut alice, "tx-no", producer, &["allowed"])?;
    ensure!(
        all_denied == [("allowed".to_string(), TRANSACTIONAL_ID_AUTHORIZATION_FAILED)],
        "AddPartitionsToTxn tx-no {all_denied:?}"
    );
    let mixed = add_partitions(&mut alice, "tx-ok", producer, &["allowed", "denied"])?;
    ensure!(
        mixed
            == [
                ("allowed".to_string(), OPERATION_NOT_ATTEMPTED),
                ("denied".to_string(), TOPIC_AUTHORIZATION_FAILED)
            ],
        "AddPartitionsToTxn allowed+denied {mixed:?}"
    );
    let added = add_partitions(&mut alice, "tx-ok", producer, &["allowed"])?;
    ensure!(
        added == [("allowed".to_string(), 0)],
        "AddPartitionsToTxn allowed {added:?}"
    );

    // TxnOffsetCommit: Write on the transactional id, then Read on the group, then Read on
    // each topic.
    let add_offsets = alice.request(
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx-ok")))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_group_id(GroupId(s("g-read"))),
        3,
    )?;
    ensure!(
        add_offsets.error_code == 0,
        "AddOffsetsToTxn g-read {}",
        add_offsets.error_code
    );
    let codes = txn_offset_commit(&mut alice, "tx-no", "g-read", producer, "allowed")?;
    ensure!(
        codes == [TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
        "TxnOffsetCommit tx-no {codes:?}"
    );
    let codes = txn_offset_commit(&mut alice, "tx-ok", "g-desc", producer, "allowed")?;
    ensure!(
        codes == [GROUP_AUTHORIZATION_FAILED],
        "TxnOffsetCommit to a group alice may only describe {codes:?}"
    );
    let codes = txn_offset_commit(&mut alice, "tx-ok", "g-read", producer, "denied")?;
    ensure!(
        codes == [TOPIC_AUTHORIZATION_FAILED],
        "TxnOffsetCommit of topic denied {codes:?}"
    );
    let codes = txn_offset_commit(&mut alice, "tx-ok", "g-read", producer, "allowed")?;
    ensure!(codes == [0], "TxnOffsetCommit allowed {codes:?}");

    // EndTxn: Write on the transactional id.
    let end = |client: &mut RawClient, txn: &str| -> Result<i16> {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(txn)))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_committed(true);
        Ok(client.request(&req, 3)?.error_code)
    };
    let code = end(&mut alice, "tx-no")?;
    ensure!(
        code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "EndTxn tx-no {code}"
    );
    let code = end(&mut alice, "tx-ok")?;
    ensure!(code == 0, "EndTxn tx-ok {code}");

    // OffsetCommit: Read on the group, then Read on each topic.
    let codes = offset_commit(&mut alice, "g-desc", "allowed")?;
    ensure!(
        codes == [GROUP_AUTHORIZATION_FAILED],
        "OffsetCommit g-desc {codes:?}"
    );
    let codes = offset_commit(&mut alice, "g-read", "denied")?;
    ensure!(
        codes == [TOPIC_AUTHORIZATION_FAILED],
        "OffsetCommit of denied {codes:?}"
    );
    let codes = offset_commit(&mut alice, "g-read", "allowed")?;
    ensure!(codes == [0], "OffsetCommit allowed {codes:?}");

    // OffsetFetch (v7: one group): Describe on the group, Describe on each named topic.
    let fetch = |client: &mut RawClient, group: &str, topic: &str| {
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(vec![0])]));
        client.request(&req, 7)
    };
    let resp = fetch(&mut alice, "g-other", "allowed")?;
    ensure!(
        resp.error_code == GROUP_AUTHORIZATION_FAILED,
        "OffsetFetch g-other {}",
        resp.error_code
    );
    let resp = fetch(&mut alice, "g-read", "denied")?;
    let codes: Vec<i16> = resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    ensure!(
        resp.error_code == 0 && codes == [TOPIC_AUTHORIZATION_FAILED],
        "OffsetFetch of denied: {} {codes:?}",
        resp.error_code
    );
    let resp = fetch(&mut alice, "g-read", "allowed")?;
    let offsets: Vec<(i16, i64)> = resp
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.error_code, p.committed_offset))
        })
        .collect();
    ensure!(
        offsets == [(0, 1)],
        "OffsetFetch allowed (the committed offset 1) {offsets:?}"
    );

    // ListOffsets: Describe on the topic.
    let code = list_offsets(&mut alice, "denied")?;
    ensure!(
        code == TOPIC_AUTHORIZATION_FAILED,
        "ListOffsets denied {code}"
    );
    let code = list_offsets(&mut alice, "allowed")?;
    ensure!(code == 0, "ListOffsets allowed {code}");

    // Read and Write do not grant Delete, Alter or the config operations.
    let code = delete_records(&mut alice, "allowed")?;
    ensure!(code == TOPIC_AUTHORIZATION_FAILED, "DeleteRecords {code}");
    let code = create_partitions(&mut alice, "allowed", 2)?;
    ensure!(
        code == TOPIC_AUTHORIZATION_FAILED,
        "CreatePartitions {code}"
    );
    let code = describe_configs(&mut alice, CONFIG_TOPIC, "allowed")?;
    ensure!(
        code == TOPIC_AUTHORIZATION_FAILED,
        "DescribeConfigs topic {code}"
    );
    let code = describe_configs(&mut alice, CONFIG_BROKER, "0")?;
    ensure!(
        code == CLUSTER_AUTHORIZATION_FAILED,
        "DescribeConfigs broker {code}"
    );
    let code = alter_topic_config(&mut alice, "allowed")?;
    ensure!(
        code == TOPIC_AUTHORIZATION_FAILED,
        "IncrementalAlterConfigs {code}"
    );
    let delete = |client: &mut RawClient, topic: &str| -> Result<i16> {
        let req = DeleteTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topic_names(vec![topic_name(topic)]);
        client
            .request(&req, 5)?
            .responses
            .first()
            .map(|r| r.error_code)
            .context("empty DeleteTopics answer")
    };
    let code = delete(&mut alice, "allowed")?;
    ensure!(code == TOPIC_AUTHORIZATION_FAILED, "DeleteTopics {code}");

    // The super user may do all of them.
    ensure!(describe_configs(&mut admin, CONFIG_TOPIC, "allowed")? == 0);
    ensure!(alter_topic_config(&mut admin, "allowed")? == 0);
    ensure!(create_partitions(&mut admin, "allowed", 2)? == 0);
    ensure!(delete_records(&mut admin, "allowed")? == 0);
    ensure!(delete(&mut admin, "allowed")? == 0);
    Ok(())
}
