//! The job is killed exactly between "checkpoint N complete" and
//! "commit N" (ONCEFLOW_FAILPOINT=after-checkpoint-complete:N aborts the process there). After
//! a restart, checkpoint N's output must be committed once: neither lost nor doubled.
//! Also the window before that in two-phase-commit mode: metadata durable, seal not yet
//! committed (`before-seal:N`): N never counts, the restart restores N-1 and replays.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use onceflow_testkit::checkpoints::*;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;

/// Checkpoint at which the failpoint fires, counted from the first checkpoint of the run.
const N: u64 = 3;

/// Failpoint runs before the scenario gives up on getting a crashed checkpoint that carried
/// records (each attempt crashes at a later checkpoint while input keeps arriving).
const ATTEMPTS: usize = 8;

/// What a failpoint run saw.
struct Outcome {
    /// The final check of the committed output.
    report: Report,
    /// The checkpoint at which the (last) failpoint process died.
    crashed: u64,
    /// Ids written but uncommitted when the process died, with (partition, offset).
    pending: HashMap<u64, (i32, i64)>,
    /// The part of `pending` that checkpoint `crashed` covers: read from the input before its
    /// barrier, so written in the transactions of checkpoint `crashed` or an earlier one.
    pending_in_crashed: HashMap<u64, (i32, i64)>,
    /// The committed output at the end.
    output: Vec<Consumed>,
    /// Stdout of the restarted job up to `job started`.
    restart: Vec<String>,
}

/// Runs the scenario in `mode` with `ONCEFLOW_FAILPOINT={failpoint}:n`, then restarts the job
/// and lets it finish.
///
/// What the assertions need is that the crashed checkpoint n carried records that were still
/// uncommitted at the crash. Input arrives paced, so that is likely but depends on timing;
/// the scenario therefore reads it off the stopped state: checkpoint n's source positions
/// (in its durable metadata) against the uncommitted output. If nothing of checkpoint n is
/// pending, the attempt does not count, and the next one crashes at a later checkpoint (that
/// process first recovers from the previous crash, which the final check covers as well).
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

    let mut attempt = 0;
    let (crashed, pending, pending_in_crashed) = loop {
        attempt += 1;
        // a restore continues numbering after the highest checkpoint id on disk
        let crash_at = highest_checkpoint_id(&args.checkpoint_dir) + N;
        let mut crashing = args.clone();
        crashing.env.push((
            "ONCEFLOW_FAILPOINT".into(),
            format!("{failpoint}:{crash_at}"),
        ));
        let mut job = spawn_job(&bootstrap, &crashing, &format!("failpoint-{attempt}"));
        let status = job.expect_failure(
            Duration::from_secs(600),
            &format!("the failpoint {failpoint}:{crash_at} aborts the process"),
        );
        let lines = job.lines();
        assert!(
            !lines
                .iter()
                .any(|l| checkpoint_number(l, "committed") == Some(crash_at)),
            "checkpoint {crash_at} was reported committed before the failpoint fired\n{}",
            job.describe()
        );
        if !job
            .stderr_tail(50)
            .contains(&format!("failpoint {failpoint}:{crash_at}"))
        {
            // a crash elsewhere is recovered like any other (the final check covers it), but
            // it is not the crash this scenario is about
            eprintln!(
                "[eos] {test}: failpoint process {attempt} died before the failpoint ({status})\n{}",
                job.describe()
            );
            assert!(
                attempt < ATTEMPTS,
                "in {attempt} attempts no process reached the failpoint"
            );
            continue;
        }
        assert_eq!(
            latest_complete(&args.checkpoint_dir),
            Some(crash_at),
            "checkpoint {crash_at}'s metadata is not the newest durable one at the failpoint"
        );
        eprintln!(
            "[eos] {test}: failpoint process {attempt} ended ({status}) at checkpoint {crash_at}; \
             last committed checkpoint {:?}",
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
        let positions = source_positions(&args.checkpoint_dir, crash_at, &args.input);
        let inputs = input_offsets(&bootstrap, &args.input);
        let before_barrier: HashSet<u64> = inputs
            .iter()
            .filter(|(_, (p, o))| positions.get(p).is_some_and(|next| o < next))
            .map(|(id, _)| *id)
            .collect();
        let pending_in_crashed: HashMap<u64, (i32, i64)> = pending
            .iter()
            .filter(|(id, _)| before_barrier.contains(id))
            .map(|(id, at)| (*id, *at))
            .collect();
        eprintln!(
            "[eos] {test}: {} committed and {} pending output records at the crash, {} of \
             them of checkpoint {crash_at} or earlier",
            committed.len(),
            pending.len(),
            pending_in_crashed.len()
        );
        if !pending_in_crashed.is_empty() {
            break (crash_at, pending, pending_in_crashed);
        }
        assert!(
            attempt < ATTEMPTS,
            "test setup: in {attempt} attempts no crashed checkpoint had uncommitted records \
             (the input never arrived between two barriers)"
        );
    };

    producer.join().expect("input producer");
    let mut restarted = spawn_job(&bootstrap, &args, "restarted");
    restarted.wait_line(START_TIMEOUT, |l| l.contains("job started"));
    let restart_lines = restarted.lines();
    finish(&bootstrap, &args, &data, Some(restarted), FINISH_TIMEOUT, 0);
    let output = read_topic(&bootstrap, &args.output, true);
    let dlq = read_topic(&bootstrap, &args.dlq(), true);
    let report = check(&data, &output, &dlq);
    eprintln!("[eos] {test}: {report}");
    drop(broker);
    finish_dir(dir);
    Outcome {
        report,
        crashed,
        pending,
        pending_in_crashed,
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
        crashed,
        pending,
        pending_in_crashed,
        output,
        ..
    } = failpoint_run(
        "eos_failpoint_2pc",
        "two-phase-commit",
        "after-checkpoint-complete",
    );
    assert_pending_once(&pending, &output);
    // Recovery commits the pre-committed transaction of the crashed checkpoint itself (its
    // records become visible where they were written) instead of aborting and replaying them.
    let at: HashSet<(i32, i64)> = output.iter().map(|c| (c.partition, c.offset)).collect();
    let recommitted = pending_in_crashed
        .values()
        .filter(|p| at.contains(p))
        .count();
    assert!(
        recommitted > 0,
        "none of the {} records of the pre-committed transactions was committed in place: \
         recovery did not commit checkpoint {crashed}'s transactions",
        pending_in_crashed.len()
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
        crashed,
        pending,
        output,
        restart,
        ..
    } = failpoint_run("eos_failpoint_2pc_seal", "two-phase-commit", "before-seal");
    assert_pending_once(&pending, &output);
    // The crashed checkpoint's metadata was durable but it was never sealed: the restart
    // restores the one before, fences (aborts) its transactions and replays their input.
    let prev = crashed - 1;
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
        "records of the unsealed checkpoint {crashed}'s transactions became visible"
    );
    assert!(report.is_exact(), "output after the failpoint:\n{report}");
}
