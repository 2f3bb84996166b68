//! kafka-python's admin client (pure Python, not librdkafka) against the admin APIs:
//! create_partitions then describe_topics, and KIP-664's list_transactions,
//! describe_transactions, describe_producers and abort_transaction on a transaction that a
//! kafka-python producer leaves open (`tests/python/kafka_python_partitions.py`). The
//! interpreter comes from `ONCEFLOW_PYTHON` or the workspace's `.venv/bin/python`; without
//! it the test prints a SKIPPED line and passes.

use std::time::Duration;

use anyhow::{ensure, Result};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::python::{kafka_python_with, run_python_script};

#[test]
fn kafka_python_grows_a_topic_and_aborts_a_hanging_transaction() -> Result<()> {
    let Some(py) = kafka_python_with("from kafka.admin import AbortTransactionSpec") else {
        eprintln!("SKIPPED kafka_python_grows_a_topic_and_aborts_a_hanging_transaction: no python with kafka-python >= 3 (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--no-auto-create-topics"])?;
    let stdout = run_python_script(
        &py,
        "kafka_python_partitions.py",
        &broker,
        &["py-grow"],
        Duration::from_secs(90),
    )?;
    ensure!(
        stdout.contains("\"partitions\": 3")
            && stdout.contains("\"state_after\": \"CompleteAbort\"")
            && stdout.contains("\"read_committed\": [\"on-new-partition\", \"after-hanging\"]"),
        "script printed: {stdout}"
    );
    Ok(())
}
