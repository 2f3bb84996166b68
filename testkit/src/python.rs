//! The Python interpreter with kafka-python for tests of a client that is not librdkafka:
//! `ONCEFLOW_PYTHON` or the workspace's `.venv/bin/python`; `None` when missing (the test
//! then prints a SKIPPED line). Scripts live in `broker/tests/python/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Result};

use crate::bins::workspace_root;
use crate::broker_process::BrokerProcess;
use crate::child::run_bounded;

/// The interpreter, if it exists and imports `kafka`.
pub fn kafka_python() -> Option<PathBuf> {
    kafka_python_with("import kafka")
}

/// The interpreter, if it exists and runs `import_line` (e.g. an import only a recent
/// kafka-python has).
pub fn kafka_python_with(import_line: &str) -> Option<PathBuf> {
    let candidate = match std::env::var_os("ONCEFLOW_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".venv/bin/python"),
    };
    if !candidate.is_file() {
        return None;
    }
    let works = Command::new(&candidate)
        .args(["-c", import_line])
        .output()
        .is_ok_and(|o| o.status.success());
    works.then_some(candidate)
}

/// Runs `broker/tests/python/<script>` with the broker's bootstrap address and `args`, bounded
/// by `timeout`; returns its stdout, or an error with its output and the broker's log.
pub fn run_python_script(
    py: &Path,
    script: &str,
    broker: &BrokerProcess,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let path = workspace_root().join("broker/tests/python").join(script);
    let mut cmd = Command::new(py);
    cmd.arg(path).arg(broker.bootstrap()).args(args);
    let (status, stdout, stderr) = run_bounded(&mut cmd, None, timeout)?;
    ensure!(
        status.success(),
        "{script} {args:?} failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}\nbroker log:\n{}",
        broker.log_tail(3000)
    );
    Ok(stdout)
}
