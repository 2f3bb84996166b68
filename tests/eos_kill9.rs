//! Issue 5, "Done when" 1: the example job is SIGKILLed at least 10 times at random moments
//! and restarted while input flows; afterwards a read_committed consumer must see every id
//! exactly once and every key's last total equal to the sum of its inputs, in both
//! exactly-once modes. The same run in at-least-once mode must show duplicates, which proves
//! the checker can fail.

mod eos_common;

use std::time::{Duration, Instant};

use eos_common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a kill -9 run did.
struct KillRun {
    report: Report,
    kills: usize,
    runs: usize,
    checkpoints_completed: usize,
    final_restarts: usize,
    records: u64,
    elapsed: Duration,
}

/// Produces the input paced over the kill phase, SIGKILLs the job `kills` times at random
/// moments (a quarter of them during start-up / recovery, the rest 0.1-2.5 s after
/// `job started`), restarts it each time, lets a final run drain the input and checks.
fn kill_run(test: &str, mode: &str) -> KillRun {
    let _machine = exclusive();
    let started = Instant::now();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new(mode, dir.path());
    let n = env_u64("ONCEFLOW_EOS_RECORDS", 200_000);
    let kills = env_u64("ONCEFLOW_EOS_KILLS", 10) as usize;
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    eprintln!(
        "[eos] {test}: {n} records + {} malformed over {PARTITIONS} partitions, {kills} kills",
        data.bad_markers.len()
    );
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        kills * 4,
        Duration::from_millis(300),
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut killed = 0;
    let mut runs = 0;
    let mut checkpoints_completed = 0;
    while killed < kills || !producer.is_finished() {
        runs += 1;
        assert!(
            runs <= kills * 4,
            "too many runs without reaching {kills} kills"
        );
        let mut job = spawn_job(&bootstrap, &args, &format!("{runs}"));
        let during_startup = rng.random_bool(0.25);
        if during_startup {
            std::thread::sleep(Duration::from_millis(rng.random_range(50..1500)));
        } else {
            let line = job.wait_line(Duration::from_secs(90), |l| l.contains("job started"));
            assert!(
                line.is_some(),
                "run {runs}: no `job started` within 90 s (status {:?})\n{}",
                job.try_status(),
                job.describe()
            );
            std::thread::sleep(Duration::from_millis(rng.random_range(100..2500)));
        }
        assert!(
            job.kill9(),
            "run {runs}: the job exited by itself before the SIGKILL ({:?})\n{}",
            job.try_status(),
            job.describe()
        );
        killed += 1;
        let lines = job.lines();
        let completed = lines
            .iter()
            .filter(|l| checkpoint_number(l, "complete").is_some())
            .count();
        checkpoints_completed += completed;
        eprintln!(
            "[eos] {test}: kill {killed} (run {runs}, {}) after {completed} completed checkpoints, \
             last committed {:?}",
            if during_startup { "during start-up" } else { "while running" },
            last_committed(&lines)
        );
    }
    producer.join().expect("input producer");
    assert!(
        checkpoints_completed > 0,
        "no run completed a checkpoint before its SIGKILL: the kills never hit a running job"
    );
    let final_restarts = finish(&bootstrap, &args, &data, None, Duration::from_secs(180), 0);
    let report = check_output(&bootstrap, &args, &data);
    let run = KillRun {
        report,
        kills: killed,
        runs,
        checkpoints_completed,
        final_restarts,
        records: n,
        elapsed: started.elapsed(),
    };
    eprintln!(
        "[eos] {test}: {} records, {} kills in {} runs, {} checkpoints completed between kills, \
         {} restarts in the final run, {:.1?}\n{}",
        run.records,
        run.kills,
        run.runs,
        run.checkpoints_completed,
        run.final_restarts,
        run.elapsed,
        run.report
    );
    drop(broker);
    finish_dir(dir);
    run
}

#[test]
fn two_phase_commit_survives_random_sigkills_exactly_once() {
    let run = kill_run("eos_kill9_2pc", "two-phase-commit");
    assert!(run.kills >= 10 || env_u64("ONCEFLOW_EOS_KILLS", 10) < 10);
    assert!(
        run.report.is_exact(),
        "two-phase-commit output is not exactly-once after {} SIGKILLs:\n{}",
        run.kills,
        run.report
    );
}

#[test]
fn transactional_offsets_survive_random_sigkills_exactly_once() {
    let run = kill_run("eos_kill9_txn_offsets", "transactional-offsets");
    assert!(run.kills >= 10 || env_u64("ONCEFLOW_EOS_KILLS", 10) < 10);
    assert!(
        run.report.is_exact(),
        "transactional-offsets output is not exactly-once after {} SIGKILLs:\n{}",
        run.kills,
        run.report
    );
}

/// The control run: at-least-once must lose nothing but show duplicates after the same
/// kills, so the exact check above demonstrably can fail.
#[test]
fn at_least_once_shows_duplicates_under_the_same_kills() {
    let run = kill_run("eos_kill9_at_least_once", "at-least-once");
    assert!(
        !run.report.duplicated.is_empty(),
        "at-least-once after {} SIGKILLs shows no duplicate ids: either the kills never hit \
         un-checkpointed output or the checker cannot see duplicates\n{}",
        run.kills,
        run.report
    );
    assert!(
        !run.report.is_exact(),
        "the checker accepted a run with duplicates"
    );
    assert!(
        run.report.nothing_lost(),
        "at-least-once lost records:\n{}",
        run.report
    );
}
