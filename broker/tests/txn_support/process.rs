//! The broker binary (or this test binary in a helper role) as a child process that a test
//! can kill -9.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running broker child process.
pub struct BrokerChild {
    pub child: Child,
    pub bootstrap: String,
}

impl BrokerChild {
    /// Starts `onceflow-broker --listen 127.0.0.1:0 --data-dir DIR` plus `extra` flags and
    /// waits for its `listening on` line.
    pub fn spawn(data_dir: &Path, extra: &[&str]) -> BrokerChild {
        Self::spawn_env(data_dir, extra, &[])
    }

    /// [`BrokerChild::spawn`] with extra environment variables (e.g. a test failpoint).
    pub fn spawn_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> BrokerChild {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))
            .expect("log file");
        // ONCEFLOW_BROKER_BIN: a private copy of the binary (the shared target dir may be
        // rebuilt by another worktree while tests run).
        let bin = std::env::var("ONCEFLOW_BROKER_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_onceflow-broker").to_string());
        let mut child = Command::new(bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--default-partitions",
                "1",
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info,onceflow_broker::txn=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn broker");
        let Some(line) = try_first_line(&mut child, "listening on ") else {
            let log = std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default();
            panic!("broker did not start; its log:\n{log}");
        };
        BrokerChild {
            child,
            bootstrap: line.trim_start_matches("listening on ").trim().to_string(),
        }
    }

    /// SIGKILL, no cleanup.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BrokerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the log of the broker child started on `data_dir` holds `needle` (a line the
/// broker logs at the moment a test wants to act on) `times` times; panics after `timeout`.
pub fn wait_for_log(data_dir: &Path, needle: &str, times: usize, timeout: Duration) {
    let path = data_dir.with_extension("log");
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if std::fs::read_to_string(&path).is_ok_and(|log| log.matches(needle).count() >= times) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker did not log {needle:?} within {timeout:?}; see {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the child's stdout until a line starting with `prefix` (120 s bound); the rest of
/// stdout is drained in the background.
pub fn first_line(child: &mut Child, prefix: &str) -> String {
    try_first_line(child, prefix).expect("child printed its line in time")
}

/// [`first_line`], `None` if the child exits or stays silent for 120 s.
pub fn try_first_line(child: &mut Child, prefix: &str) -> Option<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent && line.starts_with(&prefix) {
                let _ = tx.send(line);
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120)).ok()
}
