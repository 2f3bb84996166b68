//! Shared helpers of the crash tests: the job runs as a child process (the test binary
//! re-executed with one test name), reports its checkpoint events on stdout as `EVENT ...`
//! lines, and the parent SIGKILLs and restarts it at random moments.

use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use onceflow_runtime::{CheckpointEvent, JobResult};
use rand::rngs::ThreadRng;
use rand::Rng;

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

/// Spawns `cmd` and forwards the child's `EVENT` lines (without the prefix) to the receiver.
pub fn spawn_with_events(mut cmd: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child job");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(ev) = line.strip_prefix("EVENT ") {
                if tx.send(ev.to_string()).is_err() {
                    break;
                }
            }
        }
    });
    (child, rx)
}

/// Waits for an event starting with `prefix`, up to `timeout`; `None` if the child ended or
/// time ran out.
pub fn next_event(rx: &mpsc::Receiver<String>, prefix: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ev) if ev.starts_with(prefix) => return Some(ev),
            Ok(ev) if ev.starts_with("done") => return None,
            Ok(_) => {}
            Err(_) => return None,
        }
    }
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
    mut spawn: impl FnMut(&mut ThreadRng) -> (Child, mpsc::Receiver<String>),
) -> Result<(), EndedEarly> {
    let mut rng = rand::rng();
    for done in 0..kills {
        let (mut child, rx) = spawn(&mut rng);
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
                    ok = ok && next_event(&rx, "triggered", EVENT_TIMEOUT).is_some();
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
                    ok = ok && next_event(&rx, "completed", EVENT_TIMEOUT).is_some();
                }
                ok
            }
        };
        if !alive || child.try_wait().expect("try_wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(EndedEarly { kills_done: done });
        }
        child.kill().expect("SIGKILL child");
        let _ = child.wait();
    }
    Ok(())
}
