//! SASL over TCP: rdkafka (built without TLS, so SASL/PLAIN) produces and consumes on a
//! SASL_PLAINTEXT listener; a raw client checks that a wrong password gets
//! SASL_AUTHENTICATION_FAILED (58), a broker WARN line naming the user and the peer (never the
//! password) and a closed connection while an authenticated connection keeps being served,
//! and that requests before authentication close the connection.

mod common;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use bytes::Bytes;
use common::{client_config, BrokerProcess, RawClient, Storage};
use kafka_protocol::messages::{MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::Message;

const PASSWORD: &str = "alice-Secret-4711";
const WRONG: &str = "not-the-password-0815";

fn sasl_broker(extra: &[&str]) -> Result<(BrokerProcess, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let users = dir.path().join("users");
    std::fs::write(
        &users,
        format!("alice:plain:{PASSWORD}\nbob:plain:bob-pw\n"),
    )?;
    let users = users.to_string_lossy().into_owned();
    let mut args = vec![
        "--listener",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--sasl-users",
        &users,
    ];
    args.extend_from_slice(extra);
    let broker = BrokerProcess::spawn(Storage::InMemory, &args)?;
    Ok((broker, dir))
}

fn sasl_addr(broker: &BrokerProcess) -> Result<std::net::SocketAddr> {
    broker
        .listener_addr("SASL_PLAINTEXT")
        .context("no SASL_PLAINTEXT listener line")
}

fn sasl_config(bootstrap: &str, user: &str, password: &str) -> rdkafka::ClientConfig {
    let mut c = client_config(bootstrap);
    c.set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "PLAIN")
        .set("sasl.username", user)
        .set("sasl.password", password);
    c
}

/// SaslHandshake v1 + SaslAuthenticate v2 with PLAIN; returns the authenticate error code.
fn plain_login(client: &mut RawClient, user: &str, password: &str) -> Result<i16> {
    let hs = client.request(
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        1,
    )?;
    ensure!(hs.error_code == 0, "handshake error {}", hs.error_code);
    ensure!(
        hs.mechanisms.iter().any(|m| m.as_str() == "SCRAM-SHA-512"),
        "mechanisms {:?}",
        hs.mechanisms
    );
    let token = format!("\0{user}\0{password}");
    let auth = client.request(
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
        2,
    )?;
    Ok(auth.error_code)
}

#[test]
fn rdkafka_sasl_plain_produces_and_consumes() -> Result<()> {
    let (broker, _dir) = sasl_broker(&[])?;
    let bootstrap = sasl_addr(&broker)?.to_string();
    let producer: BaseProducer = sasl_config(&bootstrap, "alice", PASSWORD)
        .set("enable.idempotence", "true")
        .create()?;
    for i in 0..20 {
        let value = format!("v{i}");
        producer
            .send(BaseRecord::to("sasl-orders").key("k").payload(&value))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let consumer: BaseConsumer = sasl_config(&bootstrap, "alice", PASSWORD)
        .set("group.id", "sasl-readers")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&["sasl-orders"])?;
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while values.len() < 20 && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    let expected: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    ensure!(
        values == expected,
        "read {values:?}\nlog:\n{}",
        broker.log_tail(4000)
    );
    consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)?;
    let log = broker.all_logs();
    ensure!(
        log.contains("SASL authentication succeeded") && log.contains("User:alice"),
        "{log}"
    );
    Ok(())
}

#[test]
fn wrong_password_is_refused_while_others_are_served() -> Result<()> {
    let (broker, _dir) = sasl_broker(&[])?;
    let addr = sasl_addr(&broker)?;

    let mut good = RawClient::connect(addr)?;
    ensure!(plain_login(&mut good, "bob", "bob-pw")? == 0, "bob refused");

    let mut bad = RawClient::connect(addr)?;
    let code = plain_login(&mut bad, "alice", WRONG)?;
    ensure!(code == 58, "wrong password answered {code}, expected 58");
    ensure!(
        bad.closed_within(Duration::from_secs(10)),
        "connection stays open after failed authentication"
    );

    // The authenticated connection keeps being served.
    let meta = good.request(&MetadataRequest::default().with_topics(None), 4)?;
    ensure!(!meta.brokers.is_empty(), "metadata without brokers");
    ensure!(
        meta.brokers[0].port == i32::from(addr.port()),
        "Metadata on the SASL listener advertises {:?}, expected port {}",
        meta.brokers[0],
        addr.port()
    );

    // Before authentication only ApiVersions and the SASL APIs are answered.
    let mut early = RawClient::connect(addr)?;
    early.api_versions()?;
    let (_, frame) = early.encode_frame(&MetadataRequest::default().with_topics(None), 4)?;
    early.send_bytes(&frame)?;
    ensure!(
        early.closed_within(Duration::from_secs(10)),
        "Metadata before authentication was not refused"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = broker.all_logs();
        if log.contains("SASL authentication failed") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = log
        .lines()
        .find(|l| l.contains("SASL authentication failed"))
        .with_context(|| format!("no failure line in\n{log}"))?;
    ensure!(line.contains("WARN"), "not a WARN line: {line}");
    ensure!(line.contains("user=alice"), "user not named: {line}");
    ensure!(line.contains("peer=127.0.0.1:"), "peer not named: {line}");
    ensure!(!log.contains(WRONG), "the tried password is in the log");
    ensure!(
        !log.contains(PASSWORD),
        "the configured password is in the log"
    );
    Ok(())
}

/// At debug level, too, the log never shows a configured or tried password.
#[test]
fn debug_log_holds_no_password() -> Result<()> {
    std::env::set_var("RUST_LOG", "debug");
    let result = (|| -> Result<()> {
        let (broker, _dir) = sasl_broker(&[])?;
        let addr = sasl_addr(&broker)?;
        let mut good = RawClient::connect(addr)?;
        ensure!(plain_login(&mut good, "alice", PASSWORD)? == 0);
        good.request(&MetadataRequest::default().with_topics(None), 4)?;
        let mut bad = RawClient::connect(addr)?;
        ensure!(plain_login(&mut bad, "alice", WRONG)? == 58);
        ensure!(bad.closed_within(Duration::from_secs(10)));
        let log = broker.all_logs();
        ensure!(log.contains("DEBUG"), "not a debug log:\n{log}");
        ensure!(log.contains("SASL authentication failed"), "{log}");
        for secret in [PASSWORD, WRONG, "bob-pw"] {
            ensure!(!log.contains(secret), "{secret:?} in the debug log");
        }
        Ok(())
    })();
    std::env::remove_var("RUST_LOG");
    result
}
