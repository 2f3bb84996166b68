//! The exactly-once harness: the broker and the example job `examples/exactly_once_etl` run
//! as child processes over TCP on 127.0.0.1, the input is produced with rdkafka, and the
//! output is checked record by record with a read_committed consumer.
//!
//! Environment knobs: `ONCEFLOW_EOS_RECORDS` (input records of the kill -9 runs; default
//! 200000), `ONCEFLOW_EOS_SEED` (random kill moments and data; printed by
//! every test), `ONCEFLOW_EOS_KILLS` (SIGKILLs per kill -9 run, default 10),
//! `ONCEFLOW_EOS_VERBOSE` (echo children's stdout), `ONCEFLOW_EOS_JOB_LOG` /
//! `ONCEFLOW_EOS_BROKER_LOG` (RUST_LOG of the children; logs stay in the test's temp dir
//! when `ONCEFLOW_EOS_KEEP` is set), `ONCEFLOW_EOS_PREBUILT` (use the example and broker
//! binaries as built, without `cargo build`).
//!
//! Faults that an assertion depends on are triggered on what the processes report (stdout
//! lines, the checkpoint directory, the topics), never on how long something takes; waits
//! are bounded only against a process that is stuck.

mod checker;
mod data;
mod run;

use std::sync::Mutex;

pub use checker::*;
pub use data::*;
pub use run::*;

/// Serialises the scenarios of one test binary: each runs a broker and job processes, and
/// running several at once on a 2-core machine only makes kill timing meaningless.
static MACHINE: Mutex<()> = Mutex::new(());

/// Takes the machine for one scenario (poison from an earlier failed test is ignored).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A u64 from the environment or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seed of this run (`ONCEFLOW_EOS_SEED` or random), printed so failures reproduce.
pub fn seed(test: &str) -> u64 {
    let seed = env_u64("ONCEFLOW_EOS_SEED", rand::random::<u32>() as u64);
    eprintln!("[eos] {test}: ONCEFLOW_EOS_SEED={seed}");
    seed
}

/// A temp dir for one scenario; kept on disk when `ONCEFLOW_EOS_KEEP` is set.
pub fn scenario_dir(test: &str) -> ScenarioDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("onceflow-{test}-"))
        .tempdir()
        .expect("tempdir");
    eprintln!("[eos] {test}: logs in {}", dir.path().display());
    ScenarioDir(Some(dir))
}

/// A scenario's directory (broker data, job logs): deleted when the test passes
/// ([`finish_dir`]), kept when it panics, so a failure's logs can be read afterwards.
pub struct ScenarioDir(Option<tempfile::TempDir>);

impl ScenarioDir {
    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        self.0
            .as_ref()
            .map_or(std::path::Path::new("."), |d| d.path())
    }
}

impl Drop for ScenarioDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!(
                    "[eos] kept the failed scenario's logs in {}",
                    dir.keep().display()
                );
            }
        }
    }
}

/// Keeps `dir` on disk if `ONCEFLOW_EOS_KEEP` is set.
pub fn finish_dir(mut dir: ScenarioDir) {
    if std::env::var_os("ONCEFLOW_EOS_KEEP").is_some() {
        if let Some(d) = dir.0.take() {
            let _ = d.keep();
        }
    }
}
