//! kafka-python's admin client (pure Python, not librdkafka) against the admin APIs:
//! create_partitions then describe_topics, and KIP-664's list_transactions,
//! describe_transactions, describe_producers and abort_transaction on a transaction that a
//! kafka-python producer leaves open (`tests/python/kafka_python_partitions.py`). The
//! interpreter comes from `ONCEFLOW_PYTHON` or the workspace's `.venv/bin/python`; without
//! it the test prints a SKIPPED line and passes.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Result};
use common::{run_bounded, workspace_root, BrokerProcess, Storage};

fn python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("ONCEFLOW_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".venv/bin/python"),
    };
    if !candidate.is_file() {
        return None;
    }
    let has_kafka = Command::new(&candidate)
        .args(["-c", "from kafka.admin import AbortTransactionSpec"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    has_kafka.then_some(candidate)
}

#[test]
fn kafka_python_grows_a_topic_and_aborts_a_hanging_transaction() -> Result<()> {
    let Some(py) = python() else {
        eprintln!("SKIPPED kafka_python_grows_a_topic_and_aborts_a_hanging_transaction: no python with kafka-python >= 3 (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--no-auto-create-topics"])?;
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_python_partitions.py");
    let mut cmd = Command::new(&py);
    cmd.arg(script).arg(broker.bootstrap()).arg("py-grow");
    let (status, stdout, stderr) = run_bounded(&mut cmd, None, Duration::from_secs(90))?;
    ensure!(
        status.success(),
        "kafka-python failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}\nbroker log:\n{}",
        broker.log_tail(3000)
    );
    ensure!(
        stdout.contains("\"partitions\": 3")
            && stdout.contains("\"state_after\": \"CompleteAbort\"")
            && stdout.contains("\"read_committed\": [\"on-new-partition\", \"after-hanging\"]"),
        "script printed: {stdout}"
    );
    Ok(())
}
