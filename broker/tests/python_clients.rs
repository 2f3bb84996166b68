//! A client that is not librdkafka: kafka-python (pure Python, from PyPI) produces with an
//! idempotent gzip producer, consumes (assign, no group), looks offsets up by time, reads back
//! records that rdkafka wrote, and runs its admin client (create, describe, configs, delete)
//! against the broker binary. The interpreter comes from `ONCEFLOW_PYTHON` or the
//! workspace's `.venv/bin/python` (made by `scripts/ci-setup.sh`); without it the test skips
//! with a notice.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::python::{kafka_python, run_python_script};
use onceflow_testkit::records::{produce_acked, read_all, TestRecord};

fn run_script(py: &Path, broker: &BrokerProcess, args: &[&str]) -> Result<String> {
    run_python_script(
        py,
        "kafka_python_roundtrip.py",
        broker,
        args,
        Duration::from_secs(55),
    )
}

#[test]
fn kafka_python_produces_and_consumes() -> Result<()> {
    let Some(py) = kafka_python() else {
        eprintln!("SKIPPED kafka_python_produces_and_consumes: no python with kafka-python (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let out = run_script(&py, &broker, &["py-topic", "500", "produce-consume"])?;
    ensure!(
        out.contains("\"produced\": 500") && out.contains("\"consumed\": 500"),
        "script printed: {out}"
    );

    // What kafka-python wrote is readable by rdkafka too (gzip batches stored as sent).
    let read = read_all(broker.bootstrap(), "py-topic", 1, Duration::from_secs(30))?;
    ensure!(
        read.len() == 500,
        "rdkafka read {} records written by kafka-python",
        read.len()
    );
    for (i, r) in read.iter().enumerate() {
        ensure!(
            r.key == format!("py-key-{i}").into_bytes(),
            "record {i} key {:?}",
            String::from_utf8_lossy(&r.key)
        );
        ensure!(
            r.timestamp == Some(1_700_000_000_000 + i as i64),
            "record {i} timestamp {:?}",
            r.timestamp
        );
    }
    Ok(())
}

#[test]
fn kafka_python_reads_what_rdkafka_wrote() -> Result<()> {
    let Some(py) = kafka_python() else {
        eprintln!("SKIPPED kafka_python_reads_what_rdkafka_wrote: no python with kafka-python (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let records: Vec<TestRecord> = (0..300).map(|i| TestRecord::numbered(0, i, 64)).collect();
    produce_acked(broker.bootstrap(), "from-rdkafka", &records).context("rdkafka produce")?;
    let out = run_script(&py, &broker, &["from-rdkafka", "300", "consume-only"])?;
    ensure!(out.contains("\"consumed\": 300"), "script printed: {out}");
    Ok(())
}

#[test]
fn kafka_python_admin_client() -> Result<()> {
    let Some(py) = kafka_python() else {
        eprintln!("SKIPPED kafka_python_admin_client: no python with kafka-python (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--no-auto-create-topics"])?;
    let out = run_script(&py, &broker, &["py-admin", "3", "admin"])?;
    ensure!(out.contains("\"partitions\": 3"), "script printed: {out}");
    Ok(())
}

/// Kafka's ListOffsets by timestamp answers the first RECORD whose timestamp is >= the target,
/// looking inside batches (librdkafka's own test 0054_offset_time checks this too).
#[test]
fn kafka_python_offsets_for_times_is_record_exact() -> Result<()> {
    let Some(py) = kafka_python() else {
        eprintln!("SKIPPED kafka_python_offsets_for_times_is_record_exact: no python with kafka-python (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let out = run_script(&py, &broker, &["py-offsets", "500", "offsets"])?;
    ensure!(out.contains("\"by_time\": 250"), "script printed: {out}");
    Ok(())
}
