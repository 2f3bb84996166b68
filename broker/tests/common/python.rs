//! The Python interpreter with kafka-python for tests of a client that is not librdkafka:
//! `ONCEFLOW_PYTHON` or the workspace's `.venv/bin/python`; `None` when missing (the test
//! then prints a SKIPPED line).

use std::path::PathBuf;
use std::process::Command;

use super::workspace_root;

/// The interpreter, if it exists and imports `kafka`.
pub fn kafka_python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("ONCEFLOW_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".venv/bin/python"),
    };
    if !candidate.is_file() {
        return None;
    }
    let has_kafka = Command::new(&candidate)
        .args(["-c", "import kafka"])
        .output()
        .is_ok_and(|o| o.status.success());
    has_kafka.then_some(candidate)
}
