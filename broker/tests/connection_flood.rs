//! Many idle and slow connections neither starve a working client nor take the broker's
//! memory: 300 connections that connect and send nothing, and 100 that send the size prefix
//! of a 50 MiB frame and then only a trickle of it, stay open against the broker binary
//! while a normal client produces and fetches; the broker's resident memory (VmRSS of the
//! child process) grows by far less than what the slow connections announced.
//!
//! This is a resource bound, not a timing assertion: every step waits for an answer.

use std::net::TcpStream;

use anyhow::{bail, ensure, Context as _, Result};
use kafka_protocol::messages::ApiVersionsRequest;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{decode_values, idempotent_batch, RawClient};

const IDLE: usize = 300;
const SLOW: usize = 100;
/// What each slow connection announces: 50 MiB (under the 100 MiB request limit).
const ANNOUNCED: i32 = 50 << 20;
/// The bound on the broker's RSS growth while they are open.
const RSS_GROWTH_BOUND_KIB: u64 = 200 << 10;

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS line")
}

/// Produces ten records to partition 0 of `topic` and reads them back, value by value.
fn produce_and_fetch(client: &mut RawClient, topic: &str, round: usize) -> Result<()> {
    let values: Vec<String> = (0..10)
        .map(|i| format!("round {round} record {i}"))
        .collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let answer = client.produce(9, topic, 0, idempotent_batch(-1, -1, -1, &refs)?)?;
    ensure!(answer.error_code == 0, "produce: {answer:?}");
    let (code, _, records) = client.fetch(11, topic, 0, answer.base_offset)?;
    ensure!(code == 0, "fetch: {code}");
    let got: Vec<String> = decode_values(records)?
        .into_iter()
        .filter(|(offset, _)| *offset >= answer.base_offset)
        .map(|(_, v)| v)
        .collect();
    ensure!(got == values, "fetched {got:?}");
    Ok(())
}

#[test]
fn idle_and_slow_connections_leave_a_working_client_served_and_memory_bounded() -> Result<()> {
    use std::io::Read as _;
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let pid = broker.pid().context("broker pid")?;
    let mut client = RawClient::connect(broker.addr())?;
    client.metadata(9, &["flood"])?;
    produce_and_fetch(&mut client, "flood", 0)?;
    let before = rss_kib(pid)?;

    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(broker.addr()))
        .collect::<std::io::Result<_>>()?;
    let mut slow = Vec::with_capacity(SLOW);
    for _ in 0..SLOW {
        let mut c = RawClient::connect(broker.addr())?;
        // Answered: the connection's task is running and reading.
        c.request(&ApiVersionsRequest::default(), 0)?;
        let mut start = ANNOUNCED.to_be_bytes().to_vec();
        start.extend_from_slice(&[0u8; 100]);
        c.send_bytes(&start)?;
        slow.push(c);
    }
    // The working client's connection was accepted after all of them (one accept queue).
    let mut working = RawClient::connect(broker.addr())?;
    produce_and_fetch(&mut working, "flood", 1)?;
    // Half of the slow ones trickle on; the others stall.
    for c in slow.iter_mut().step_by(2) {
        c.send_bytes(&[0u8; 1000])?;
    }
    produce_and_fetch(&mut working, "flood", 2)?;
    produce_and_fetch(&mut client, "flood", 3)?;
    let during = rss_kib(pid)?;
    let growth = during.saturating_sub(before);
    eprintln!(
        "broker VmRSS {before} KiB before, {during} KiB with {IDLE} idle and {SLOW} slow \
         connections ({} MiB announced): growth {growth} KiB",
        (SLOW as i64 * i64::from(ANNOUNCED)) >> 20
    );
    ensure!(
        growth < RSS_GROWTH_BOUND_KIB,
        "broker RSS grew by {growth} KiB (bound {RSS_GROWTH_BOUND_KIB} KiB)"
    );
    // The idle connections were not dropped to make room: none has seen an end of stream.
    for (i, s) in idle.iter().enumerate() {
        s.set_nonblocking(true)?;
        let mut byte = [0u8; 1];
        match (&*s).read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => bail!("idle connection {i} is not open and silent: {other:?}"),
        }
    }
    Ok(())
}
