//! SASL and authorization hardening, over TCP against an in-process broker with a
//! SASL_PLAINTEXT listener: an unsupported mechanism is answered with
//! UNSUPPORTED_SASL_MECHANISM and the mechanisms offered, then the connection closes (as
//! Kafka); a users file with more SCRAM iterations than Kafka allows refuses the start;
//! DescribeTransactions leaves out the topics the principal may not Describe.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, DescribeTransactionsRequest, InitProducerIdRequest,
    SaslHandshakeRequest, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::config::SecurityConfig;
use onceflow_broker::security::scram::{ScramCredential, ScramHash};
use onceflow_broker::security::{ListenerConfig, SecurityProtocol};
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::{topic_name, RawClient};
use onceflow_testkit::security::plain_login;

const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

fn config(files: &std::path::Path, users: &str, acls: &str) -> Result<BrokerConfig> {
    std::fs::write(files.join("users"), users)?;
    std::fs::write(files.join("acls"), acls)?;
    Ok(BrokerConfig {
        listeners: vec![ListenerConfig::new(
            SecurityProtocol::SaslPlaintext,
            "127.0.0.1:0".parse()?,
        )],
        security: SecurityConfig {
            sasl_users_file: Some(files.join("users")),
            acl_file: Some(files.join("acls")),
            super_users: vec!["User:admin".into()],
            ..SecurityConfig::default()
        },
        ..BrokerConfig::default()
    })
}

fn login(broker: &InProcessBroker, user: &str) -> Result<RawClient> {
    let mut c = RawClient::connect(broker.addr())?;
    let code = plain_login(&mut c, user, &format!("{user}-pw"))?;
    ensure!(code == 0, "{user} login: {code}");
    Ok(c)
}

#[test]
fn an_unsupported_mechanism_is_answered_then_the_connection_closes() -> Result<()> {
    let files = tempfile::tempdir()?;
    let broker = InProcessBroker::start(config(files.path(), "alice:plain:alice-pw\n", "")?)?;
    let mut c = RawClient::connect(broker.addr())?;
    let resp = c.request(
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI")),
        1,
    )?;
    ensure!(resp.error_code == UNSUPPORTED_SASL_MECHANISM, "{resp:?}");
    ensure!(
        resp.mechanisms.iter().any(|m| m.as_str() == "PLAIN"),
        "{resp:?}"
    );
    ensure!(
        c.closed_within(Duration::from_secs(10)),
        "the connection stayed open after UNSUPPORTED_SASL_MECHANISM"
    );
    // Others are unaffected.
    login(&broker, "alice")?;
    Ok(())
}

#[test]
fn scram_credentials_above_kafkas_iteration_limit_refuse_the_start() -> Result<()> {
    let files = tempfile::tempdir()?;
    let credential = ScramCredential::from_password(ScramHash::Sha256, "pw", 16_385);
    let users = format!("bob:scram-sha-256:{}\n", credential.to_file_value());
    let err = match InProcessBroker::start(config(files.path(), &users, "")?) {
        Ok(_) => anyhow::bail!("the broker started"),
        Err(e) => e.to_string(),
    };
    ensure!(err.contains("16385 iterations"), "{err}");
    Ok(())
}

#[test]
fn describe_transactions_leaves_out_topics_the_principal_may_not_describe() -> Result<()> {
    let files = tempfile::tempdir()?;
    let broker = InProcessBroker::start(config(
        files.path(),
        "admin:plain:admin-pw\nalice:plain:alice-pw\n",
        "User:alice * Describe Allow TransactionalId Literal txn\n\
         User:alice * Describe Allow Topic Literal visible\n",
    )?)?;
    let txn = TransactionalId(StrBytes::from_static_str("txn"));
    let mut admin = login(&broker, "admin")?;
    admin.metadata(9, &["visible", "hidden"])?;
    let init = admin.request(
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(txn.clone()))
            .with_transaction_timeout_ms(60_000),
        1,
    )?;
    ensure!(init.error_code == 0, "InitProducerId: {}", init.error_code);
    let add = admin.request(
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn.clone())
            .with_v3_and_below_producer_id(init.producer_id)
            .with_v3_and_below_producer_epoch(init.producer_epoch)
            .with_v3_and_below_topics(
                ["visible", "hidden"]
                    .iter()
                    .map(|t| {
                        AddPartitionsToTxnTopic::default()
                            .with_name(topic_name(t))
                            .with_partitions(vec![0])
                    })
                    .collect(),
            ),
        3,
    )?;
    for t in &add.results_by_topic_v3_and_below {
        for p in &t.results_by_partition {
            ensure!(p.partition_error_code == 0, "AddPartitionsToTxn: {add:?}");
        }
    }
    let describe = |client: &mut RawClient| -> Result<Vec<String>> {
        let resp = client.request(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![txn.clone()]),
            0,
        )?;
        let state = resp.transaction_states.first().context("no state")?;
        ensure!(state.error_code == 0, "DescribeTransactions: {state:?}");
        Ok(state.topics.iter().map(|t| t.topic.to_string()).collect())
    };
    ensure!(describe(&mut admin)? == ["hidden", "visible"]);
    let mut alice = login(&broker, "alice")?;
    let seen = describe(&mut alice)?;
    ensure!(seen == ["visible"], "alice sees {seen:?}");
    Ok(())
}
