//! Harness of the job-builder tests: builds an example other than `exactly_once_etl` next to
//! the broker binary, runs it as a child process of the eos harness (`Proc`), sends it SIGINT,
//! and reads a topic read_committed with keys.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::eos_common::{bins, Proc, PARTITIONS};

static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// Builds `examples/<name>.rs` (same profile and target dir as the eos harness, which builds
/// the broker) and returns a private hard link of the binary.
pub fn example_bin(name: &str) -> PathBuf {
    let broker = &bins().broker;
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get_or_insert_with(HashMap::new).get(name) {
        return p.clone();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--example", name, "-p", "onceflow", "--target-dir"])
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // a private link keeps this build's inode when another worktree rebuilds the example
    let private = broker.parent().expect("bins dir").join(name);
    let _ = std::fs::remove_file(&private);
    let built_bin = profile_dir.join("examples").join(name);
    std::fs::hard_link(&built_bin, &private)
        .or_else(|_| std::fs::copy(&built_bin, &private).map(|_| ()))
        .expect("pin the example binary");
    built
        .as_mut()
        .unwrap()
        .insert(name.to_string(), private.clone());
    private
}

/// Spawns example `name` with `args`; stderr goes to `<log_dir>/<run>.stderr.log`.
pub fn spawn_example(name: &str, args: &[String], log_dir: &Path, run: &str) -> Proc {
    let mut cmd = Command::new(example_bin(name));
    cmd.args(args).env(
        "RUST_LOG",
        std::env::var("ONCEFLOW_EOS_JOB_LOG").unwrap_or_else(|_| "info".into()),
    );
    Proc::spawn(
        &format!("{name} {run}"),
        cmd,
        &log_dir.join(format!("{run}.stderr.log")),
    )
}

/// SIGINT (Ctrl-C) to a running process.
pub fn interrupt(p: &mut Proc) {
    let status = Command::new("kill")
        .args(["-INT", &p.pid().to_string()])
        .status()
        .expect("run kill -INT");
    assert!(status.success(), "kill -INT {} failed", p.pid());
}

/// A record read from a topic: partition, offset, key and value.
#[derive(Debug, Clone)]
pub struct Keyed {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key (UTF-8, lossy).
    pub key: String,
    /// Value (UTF-8, lossy).
    pub value: String,
}

/// Everything committed in the 4 partitions of `topic` (read_committed, up to the end).
pub fn read_committed(bootstrap: &str, topic: &str) -> Vec<Keyed> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("job-kit-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut at_end = std::collections::HashSet::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while at_end.len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "reading {topic} did not reach its end in 90 s"
        );
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                out.push(Keyed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                });
            }
        }
    }
    out
}

/// Polls `read` every 300 ms until `done` holds for its result (returns it) or `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    mut read: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let v = read();
        if done(&v) {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
