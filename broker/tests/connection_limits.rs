//! Connection limits of the broker binary, over raw TCP: a SASL listener's frame limit before
//! authentication (`--sasl-max-receive-bytes`, Kafka's `sasl.server.max.receive.size`), the
//! idle timeout (`--connections-max-idle-ms`) and the per-address connection limit
//! (`--max-connections-per-ip`). Every verdict waits for an event (an answer, a close) with
//! a timeout only as the upper bound.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiVersionsRequest, BrokerId, FetchRequest};
use kafka_protocol::protocol::StrBytes;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{idempotent_batch, topic_name, RawClient};
use onceflow_testkit::security::{arg, plain_login};

/// Upper bound of every wait for a close.
const CLOSE_BOUND: Duration = Duration::from_secs(10);

fn api_versions_ok(client: &mut RawClient) -> Result<()> {
    let resp = client.request(&ApiVersionsRequest::default(), 0)?;
    ensure!(resp.error_code == 0, "ApiVersions: {}", resp.error_code);
    Ok(())
}

#[test]
fn a_large_frame_before_sasl_authentication_closes_the_connection() -> Result<()> {
    let files = tempfile::tempdir()?;
    let users = files.path().join("users");
    std::fs::write(&users, "alice:plain:alice-pw\n")?;
    let broker = BrokerProcess::spawn(
        Storage::InMemory,
        &[
            "--listener",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--sasl-users",
            &arg(&users),
        ],
    )?;
    let sasl = broker
        .listener_addr("SASL_PLAINTEXT")
        .context("no SASL listener")?;

    // A well-formed ApiVersions of 1 MiB (a long client software name), which the broker
    // would answer were it small: refused at its size prefix, before the body is read.
    let mut big = RawClient::connect(sasl)?;
    let name = "a".repeat(1 << 20);
    let req = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_string(name))
        .with_client_software_version(StrBytes::from_static_str("1"));
    let (_, frame) = big.encode_frame(&req, 3)?;
    ensure!(frame.len() > 1 << 20);
    // The broker may close while the body is still being written: a failed write is fine.
    let _ = big.send_bytes(&frame);
    ensure!(
        big.closed_within(CLOSE_BOUND),
        "a 1 MiB frame before authentication was not refused"
    );

    // A normal client authenticates, then may send frames above the pre-authentication
    // limit (a 600 KiB produce).
    let mut client = RawClient::connect(sasl)?;
    api_versions_ok(&mut client)?;
    ensure!(plain_login(&mut client, "alice", "alice-pw")? == 0, "login");
    client.metadata(9, &["after-auth"])?;
    let value = "v".repeat(600 << 10);
    let answer = client.produce(9, "after-auth", 0, idempotent_batch(-1, -1, -1, &[&value])?)?;
    ensure!(answer.error_code == 0, "produce after auth: {answer:?}");
    Ok(())
}

#[test]
fn an_idle_connection_is_closed_after_the_configured_timeout() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--connections-max-idle-ms", "1000"])?;
    let mut client = RawClient::connect(broker.addr())?;
    api_versions_ok(&mut client)?;
    client.metadata(9, &["idle"])?;
    // A long poll longer than the idle timeout is a request in flight, not idling: its
    // answer comes.
    let long_poll = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(1500)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name("idle"))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)
                .with_log_start_offset(-1)
                .with_current_leader_epoch(-1)])]);
    let answer = client.request(&long_poll, 11)?;
    ensure!(answer.error_code == 0, "long poll: {}", answer.error_code);
    // Then nothing: the broker closes it.
    ensure!(
        client.closed_within(CLOSE_BOUND),
        "an idle connection stayed open"
    );
    Ok(())
}

#[test]
fn a_connection_over_the_per_ip_limit_is_refused_and_the_others_keep_working() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--max-connections-per-ip", "3"])?;
    let mut admitted = Vec::new();
    for _ in 0..3 {
        let mut c = RawClient::connect(broker.addr())?;
        // Answered: the broker has accepted and counted it.
        api_versions_ok(&mut c)?;
        admitted.push(c);
    }
    let mut fourth = RawClient::connect(broker.addr())?;
    let (_, frame) = fourth.encode_frame(&ApiVersionsRequest::default(), 0)?;
    let _ = fourth.send_bytes(&frame);
    ensure!(
        fourth.closed_within(CLOSE_BOUND),
        "the fourth connection from 127.0.0.1 was served"
    );
    for c in &mut admitted {
        api_versions_ok(c)?;
    }
    Ok(())
}
