//! ACLs over TCP: principals authenticated with SASL/PLAIN on a SASL_PLAINTEXT listener get
//! Kafka's authorization error codes per API (TOPIC 29, GROUP 30, CLUSTER 31,
//! TRANSACTIONAL_ID 53), Metadata filters and reports authorized operations, and
//! CreateAcls/DescribeAcls/DeleteAcls round-trip and survive a broker restart.

use anyhow::{ensure, Context as _, Result};
use bytes::Bytes;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, CreateAclsRequest, CreateTopicsRequest, DeleteAclsRequest,
    DescribeAclsRequest, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    InitProducerIdRequest, JoinGroupRequest, MetadataRequest, ProducerId, TransactionalId,
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
        let files = tempfile::tempdir()?;
        let users = files.path().join("users");
        std::fs::write(
            &users,
            "admin:plain:admin-pw\nalice:plain:alice-pw\nbob:plain:bob-pw\n",
        )?;
        let acls = files.path().join("acls");
        std::fs::write(
            &acls,
            "# alice may produce to and consume from `allowed`, and describe group g-desc\n\
             User:alice * Write Allow Topic Literal allowed\n\
             User:alice * Read Allow Topic Literal allowed\n\
             User:alice * Describe Allow Group Literal g-desc\n\
             User:alice * All Deny Topic Prefixed secret\n",
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
