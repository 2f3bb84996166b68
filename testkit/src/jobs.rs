//! Child-job runners: example job binaries spawned with their flags, and test binaries
//! re-executed to run one test as a job that reports its checkpoint events on stdout as
//! `EVENT ...` lines, which the parent waits on and SIGKILLs the job at.

use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use onceflow_runtime::{CheckpointEvent, JobResult};
use rand::rngs::ThreadRng;
use rand::Rng;

use crate::bins::example_bin;
use crate::child::Proc;

/// Spawns example `name` with `args`; stderr goes to `<log_dir>/<run>.stderr.log`, `RUST_LOG`
/// is `ONCEFLOW_EOS_JOB_LOG` (default `info`).
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

/// Longest wait for a checkpoint event of a healthy child: generous, so that only a stuck
/// child (not a loaded machine) reaches it.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Prints a checkpoint event for the parent (the child's `checkpoint_listener`).
pub fn announce_checkpoint(ev: CheckpointEvent) {
    match ev {
        CheckpointEvent::Triggered(n) => println!("EVENT triggered {n}"),
        CheckpointEvent::Completed(n) => println!("EVENT completed {n}"),
        CheckpointEvent::Failed(n) => println!("EVENT failed {n}"),
    }
}

/// Prints the `done` event that ends a child's run.
pub fn announce_done(r: &JobResult) {
    println!(
        "EVENT done restored_from={:?} completed={} failed={}",
        r.restored_from, r.completed_checkpoints, r.failed_checkpoints
    );
}

/// A command that re-executes this test binary to run only the test `child_test`; the caller
/// adds the environment the child needs.
pub fn child_command(child_test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args([child_test, "--exact", "--nocapture", "--test-threads=1"]);
    cmd
}

/// Spawns a job that reports `EVENT` lines (stderr discarded); wait on them with
/// [`next_event`].
pub fn spawn_with_events(cmd: Command) -> Proc {
    Proc::spawn_quiet("child job", cmd)
}

/// Waits for the job's next event (after the ones returned before) starting with `prefix`,
/// up to `timeout`; returns it without the `EVENT ` prefix. `None` if the job reported
/// `done` first, ended, or time ran out.
pub fn next_event(job: &mut Proc, prefix: &str, timeout: Duration) -> Option<String> {
    let line = job.next_line(timeout, |l| {
        l.strip_prefix("EVENT ")
            .is_some_and(|ev| ev.starts_with(prefix) || ev.starts_with("done"))
    })?;
    let ev = line.trim_start_matches("EVENT ");
    ev.starts_with(prefix).then(|| ev.to_string())
}

/// The job ended (or stopped reporting checkpoints) before it could be killed as often as
/// asked: it ran too short for the test.
#[derive(Debug)]
pub struct EndedEarly {
    /// Kills done before that.
    pub kills_done: usize,
}

/// Starts the job `kills` times with `spawn` (given the random source) and
/// SIGKILLs each run, rotating three moments: after a random sleep drawn from
/// `random_sleep_ms`; while a checkpoint is in flight (shortly after the 1st-3rd `triggered`);
/// right after the 1st-3rd `completed` checkpoint, before or during the sinks' commit.
pub fn kill_repeatedly(
    kills: usize,
    random_sleep_ms: Range<u64>,
    mut spawn: impl FnMut(&mut ThreadRng) -> Proc,
) -> Result<(), EndedEarly> {
    let mut rng = rand::rng();
    for done in 0..kills {
        let mut job = spawn(&mut rng);
        let alive = match done % 3 {
            // at a random moment
            0 => {
                std::thread::sleep(Duration::from_millis(
                    rng.random_range(random_sleep_ms.clone()),
                ));
                true
            }
            // while a checkpoint is in flight
            1 => {
                let skip = rng.random_range(0..3);
                let mut ok = true;
                for _ in 0..=skip {
                    ok = ok && next_event(&mut job, "triggered", EVENT_TIMEOUT).is_some();
                }
                if ok {
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
                }
                ok
            }
            // right after a checkpoint completed: before or during the sinks' commit
            _ => {
                let skip = rng.random_range(0..3);
                let mut ok = true;
                for _ in 0..=skip {
                    ok = ok && next_event(&mut job, "completed", EVENT_TIMEOUT).is_some();
                }
                ok
            }
        };
        // kill9 is false if the job had exited by itself
        if !job.kill9() || !alive {
            return Err(EndedEarly { kills_done: done });
        }
    }
    Ok(())
}
