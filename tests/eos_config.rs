//! Issue 5, "Done when" 5 and the start-up safety checks: a transaction timeout that does not
//! exceed the checkpoint interval (plus the recovery allowance), or that exceeds the broker's
//! maximum, is refused at start with exit code 2 and a message that says what to change;
//! a valid configuration starts (so the check does not refuse everything).

mod eos_common;

use std::time::Duration;

use eos_common::*;

/// Runs the job with `interval_ms` / `timeout_ms` against a fresh broker started with
/// `broker_flags`; returns the process after it exited (or after `job started`).
fn run(
    test: &str,
    broker_flags: &[&str],
    interval_ms: u64,
    timeout_ms: u64,
) -> (Proc, Broker, tempfile::TempDir) {
    let dir = scenario_dir(test);
    bins();
    let broker = Broker::start(dir.path(), broker_flags);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    create_topics(
        broker.bootstrap(),
        &[&args.input, &args.output, &args.dlq()],
    );
    args.checkpoint_interval_ms = interval_ms;
    args.transaction_timeout_ms = Some(timeout_ms);
    let mut job = spawn_job(broker.bootstrap(), &args, "config");
    job.wait_line(Duration::from_secs(60), |l| l.contains("job started"));
    (job, broker, dir)
}

fn assert_refused(job: &mut Proc, must_mention: &[&[&str]]) {
    let status = job.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some(),
        "the job did not refuse the configuration (still running)\n{}",
        job.describe()
    );
    assert_eq!(
        status.unwrap().code(),
        Some(2),
        "exit code of a refused configuration\n{}",
        job.describe()
    );
    assert!(
        !job.lines().iter().any(|l| l.contains("job started")),
        "the job started before refusing\n{}",
        job.describe()
    );
    let stderr = job.stderr_tail(200).to_lowercase();
    for alternatives in must_mention {
        assert!(
            alternatives.iter().any(|a| stderr.contains(a)),
            "the refusal does not mention any of {alternatives:?}\n{}",
            job.describe()
        );
    }
}

/// Mentions of the knob to change.
const TIMEOUT_KNOB: &[&str] = &["transaction-timeout-ms", "transaction.timeout.ms"];
const INTERVAL_KNOB: &[&str] = &["checkpoint-interval-ms", "checkpoint interval"];

#[test]
fn transaction_timeout_below_checkpoint_interval_is_refused() {
    let (mut job, _broker, _dir) = run("eos_config_below", &[], 10_000, 5_000);
    assert_refused(&mut job, &[TIMEOUT_KNOB, INTERVAL_KNOB]);
}

#[test]
fn transaction_timeout_equal_to_checkpoint_interval_is_refused() {
    let (mut job, _broker, _dir) = run("eos_config_equal", &[], 10_000, 10_000);
    assert_refused(&mut job, &[TIMEOUT_KNOB, INTERVAL_KNOB]);
}

#[test]
fn transaction_timeout_above_broker_maximum_is_refused() {
    let (mut job, _broker, _dir) = run(
        "eos_config_above_max",
        &["--max-transaction-timeout-ms", "60000"],
        1_000,
        120_000,
    );
    assert_refused(&mut job, &[TIMEOUT_KNOB, &["max"]]);
}

#[test]
fn valid_transaction_timeout_starts() {
    let (mut job, _broker, _dir) = run("eos_config_valid", &[], 1_000, 60_000);
    assert!(
        job.lines().iter().any(|l| l.contains("job started")),
        "a valid configuration (interval 1000 ms, timeout 60000 ms) did not start (status {:?})\n{}",
        job.try_status(),
        job.describe()
    );
    job.term();
    let status = job.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM of an idle job: {status:?}\n{}",
        job.describe()
    );
}
