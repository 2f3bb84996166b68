//! Topic configs through kafka-python's admin client against the broker binary (durable):
//! IncrementalAlterConfigs and AlterConfigs change them, bad values are refused with
//! INVALID_CONFIG, describe_configs reports them as DYNAMIC_TOPIC_CONFIG, and they survive a
//! restart. The interpreter comes from `ONCEFLOW_PYTHON` or `.venv/bin/python`; without it
//! the test prints a SKIPPED line.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::python::{kafka_python, run_python_script};

fn run_script(py: &Path, broker: &BrokerProcess, topic: &str, mode: &str) -> Result<String> {
    run_python_script(
        py,
        "kafka_python_configs.py",
        broker,
        &[topic, mode],
        Duration::from_secs(55),
    )
}

#[test]
fn kafka_python_alters_and_describes_topic_configs() -> Result<()> {
    let Some(py) = kafka_python() else {
        eprintln!("SKIPPED kafka_python_alters_and_describes_topic_configs: no python with kafka-python (set ONCEFLOW_PYTHON or run scripts/ci-setup.sh)");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let mut broker = BrokerProcess::spawn(
        Storage::Durable {
            dir: dir.path().to_path_buf(),
            fsync: "every-batch".into(),
        },
        &[],
    )?;
    let out = run_script(&py, &broker, "py-configs", "alter")?;
    ensure!(
        out.contains("\"retention.ms\": \"7200000\""),
        "alter printed: {out}"
    );
    broker.restart()?;
    let out = run_script(&py, &broker, "py-configs", "check")?;
    ensure!(
        out.contains("\"compression.type\": \"lz4\""),
        "check printed: {out}"
    );
    Ok(())
}
