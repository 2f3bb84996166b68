//! Issue 5, "Done when" 2: the job is killed exactly between "checkpoint N complete" and
//! "commit N" (ONCEFLOW_FAILPOINT=after-checkpoint-complete:N aborts the process there). After
//! a restart, checkpoint N's output must be committed once: neither lost nor doubled.
//! Also the window before that in two-phase-commit mode: metadata durable, seal not yet
//! committed (`before-seal:N`): N never counts, the restart restores N-1 and replays.

mod eos_common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eos_common::*;

/// Checkpoint at which the failpoint fires.
const N: u64 = 3;

/// What a failpoint run saw.
struct Outcome {
    /// The final check of the committed output.
    report: Report,
    /// Ids written but uncommitted when the process died, with (partition, offset).
    pending: HashMap<u64, (i32, i64)>,
    /// The committed output at the end.
    output: Vec<Consumed>,
    /// Stdout of the restarted job up to `job started`.
    restart: Vec<String>,
}

/// Runs the scenario in `mode` with `ONCEFLOW_FAILPOINT={failpoint}:N`, then restarts the job
/// and lets it finish.
fn failpoint_run(test: &str, mode: &str, failpoint: &str) -> Outcome {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let mut args = JobArgs::new(mode, dir.path());
    args.checkpoint_interval_ms = 1000;
    let n = env_u64("ONCEFLOW_EOS_FAILPOINT_RECORDS", 30_000);
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    // Input keeps arriving for ~12 s so that checkpoint N carries records.
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        60,
        Duration::from_millis(200),
    );

    let mut crashing = args.clone();
    crashing
        .env
        .push(("ONCEFLOW_FAILPOINT".into(), format!("{failpoint}:{N}")));
    let mut job = spawn_job(&bootstrap, &crashing, "failpoint");
    let status = job.expect_failure(
        Duration::from_secs(120),
        &format!("the failpoint {failpoint}:{N} aborts the process"),
    );
    let lines = job.lines();
    assert!(
        !lines
            .iter()
            .any(|l| checkpoint_number(l, "committed") == Some(N)),
        "checkpoint {N} was reported committed before the failpoint fired\n{}",
        job.describe()
    );
    eprintln!(
        "[eos] {test}: failpoint process ended ({status}); last committed checkpoint {:?}",
        last_committed(&lines)
    );

    // What was written but not committed when the process died.
    let committed = read_topic(&bootstrap, &args.output, true);
    let uncommitted = read_topic(&bootstrap, &args.output, false);
    let committed_ids: HashSet<u64> = committed
        .iter()
        .filter_map(|c| parse_output(&c.value).map(|o| o.id))
        .collect();
    let pending: HashMap<u64, (i32, i64)> = uncommitted
        .iter()
        .filter_map(|c| parse_output(&c.value).map(|o| (o.id, (c.partition, c.offset))))
        .filter(|(id, _)| !committed_ids.contains(id))
        .collect();
    eprintln!(
        "[eos] {test}: {} committed and {} pending output records at the crash",
        committed.len(),
        pending.len()
    );
    assert!(
        !pending.is_empty(),
        "test setup: no uncommitted output at the failpoint (checkpoint {N} carried no records)"
    );

    producer.join().expect("input producer");
    let mut restarted = spawn_job(&bootstrap, &args, "restarted");
    restarted.wait_line(Duration::from_secs(90), |l| l.contains("job started"));
    let restart_lines = restarted.lines();
    finish(
        &bootstrap,
        &args,
        &data,
        Some(restarted),
        Duration::from_secs(120),
        0,
    );
    let output = read_topic(&bootstrap, &args.output, true);
    let dlq = read_topic(&bootstrap, &args.dlq(), true);
    let report = check(&data, &output, &dlq);
    eprintln!("[eos] {test}: {report}");
    drop(broker);
    finish_dir(dir);
    Outcome {
        report,
        pending,
        output,
        restart: restart_lines,
    }
}

/// Every pending id is in the final committed output exactly once.
fn assert_pending_once(pending: &HashMap<u64, (i32, i64)>, output: &[Consumed]) {
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for c in output {
        if let Some(o) = parse_output(&c.value) {
            if pending.contains_key(&o.id) {
                *counts.entry(o.id).or_default() += 1;
            }
        }
    }
    let wrong: Vec<_> = pending
        .keys()
        .filter(|id| counts.get(id).copied().unwrap_or(0) != 1)
        .map(|id| (*id, counts.get(id).copied().unwrap_or(0)))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "ids written in the crashed checkpoint are not committed exactly once (id, count): {wrong:?}"
    );
}

#[test]
fn two_phase_commit_commits_the_crashed_checkpoint_once() {
    let Outcome {
        report,
        pending,
        output,
        ..
    } = failpoint_run(
        "eos_failpoint_2pc",
        "two-phase-commit",
        "after-checkpoint-complete",
    );
    assert_pending_once(&pending, &output);
    // Recovery commits the pre-committed transaction of checkpoint N itself (its records
    // become visible where they were written) instead of aborting and replaying them.
    let at: HashSet<(i32, i64)> = output.iter().map(|c| (c.partition, c.offset)).collect();
    let recommitted = pending.values().filter(|p| at.contains(p)).count();
    assert!(
        recommitted > 0,
        "none of the {} records of the pre-committed transactions was committed in place: \
         recovery did not commit checkpoint {N}'s transactions",
        pending.len()
    );
    assert!(report.is_exact(), "output after the failpoint:\n{report}");
}

#[test]
fn transactional_offsets_keep_the_crashed_checkpoint_once() {
    let Outcome {
        report,
        pending,
        output,
        ..
    } = failpoint_run(
        "eos_failpoint_txn_offsets",
        "transactional-offsets",
        "after-checkpoint-complete",
    );
    assert_pending_once(&pending, &output);
    assert!(report.is_exact(), "output after the failpoint:\n{report}");
}

#[test]
fn two_phase_commit_does_not_restore_an_unsealed_checkpoint() {
    let Outcome {
        report,
        pending,
        output,
        restart,
    } = failpoint_run("eos_failpoint_2pc_seal", "two-phase-commit", "before-seal");
    assert_pending_once(&pending, &output);
    // Checkpoint N's metadata was durable but it was never sealed: the restart restores N-1,
    // fences (aborts) N's transactions and replays their input.
    let prev = N - 1;
    assert!(
        restart
            .iter()
            .any(|l| l.contains(&format!("restoring checkpoint {prev} "))),
        "the restart did not restore checkpoint {prev}: {restart:?}"
    );
    let at: HashSet<(i32, i64)> = output.iter().map(|c| (c.partition, c.offset)).collect();
    let in_place = pending.values().filter(|p| at.contains(p)).count();
    assert_eq!(
        in_place, 0,
        "records of the unsealed checkpoint {N}'s transactions became visible"
    );
    assert!(report.is_exact(), "output after the failpoint:\n{report}");
}
