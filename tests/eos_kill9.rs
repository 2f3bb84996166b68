//! The example job is SIGKILLed at least 10 times (at random delays
//! after its start or after a checkpoint it reported complete) and restarted while input
//! flows; afterwards a read_committed consumer must see every id exactly once and every key's
//! last total equal to the sum of its inputs, in both exactly-once modes. The same run in
//! at-least-once mode must show duplicates, which proves the checker can fail.

use std::time::{Duration, Instant};

use onceflow_testkit::checkpoints::*;
use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a kill -9 run did.
struct KillRun {
    report: Report,
    kills: usize,
    runs: usize,
    checkpoints_completed: usize,
    /// Kills after which a restart had to write some visible output again (see
    /// [`kill_when_replayable`]).
    replaying_kills: usize,
    final_restarts: usize,
    records: u64,
    elapsed: Duration,
}

/// Held-back input chunks of the at-least-once control (see [`kill_run`]).
const HELD_CHUNKS: usize = 10;

/// Looks at a stopped at-least-once job per kill before killing it anyway (see
/// [`kill_when_replayable`]).
const REPLAY_TRIES: usize = 5;

/// Visible output records that came from input at or after the positions of the newest
/// complete checkpoint: a restart restores that checkpoint and writes them again. Only
/// meaningful while the job is stopped (SIGSTOP) or dead. 0 without a complete checkpoint
/// (where a restart starts is then not the checkpoint's to say).
fn replayable_output(bootstrap: &str, args: &JobArgs) -> usize {
    let Some(c) = latest_complete(&args.checkpoint_dir) else {
        return 0;
    };
    let positions = source_positions(&args.checkpoint_dir, c, &args.input);
    let inputs = input_offsets(bootstrap, &args.input);
    let output = read_topic(bootstrap, &args.output, false);
    let ids = output
        .iter()
        .filter_map(|c| parse_output(&c.value).map(|o| o.id));
    replayed_ids(ids, &inputs, &positions).len()
}

/// SIGKILLs a running job once a restart is certain to write some of its visible output
/// again, trying `tries` times: stop it (SIGSTOP), count [`replayable_output`] (what a
/// SIGKILL now leaves behind, whenever it lands), and if there is none let it go on for a
/// random 50-300 ms. The last try kills regardless. Returns the count at the kill.
fn kill_when_replayable(
    job: &mut Proc,
    bootstrap: &str,
    args: &JobArgs,
    rng: &mut StdRng,
    tries: usize,
) -> usize {
    for attempt in 1..=tries {
        assert!(
            job.suspend(),
            "the job exited by itself before the SIGKILL ({:?})\n{}",
            job.try_status(),
            job.describe()
        );
        let replayable = replayable_output(bootstrap, args);
        if replayable > 0 || attempt == tries {
            assert!(job.kill9(), "the stopped job exited before the SIGKILL");
            return replayable;
        }
        job.resume();
        std::thread::sleep(Duration::from_millis(rng.random_range(50..300)));
    }
    unreachable!("the last try kills")
}

/// Produces the input paced over the kill phase and SIGKILLs the job `kills` times, restarting
/// it each time: every fourth kill during start-up / recovery (a random 50-1500 ms after the
/// spawn), the others 0-1.5 s after the run reported a complete checkpoint. Then a final run
/// drains the input and the output is checked.
///
/// In at-least-once mode the running kills wait for a moment when a kill is certain to
/// duplicate output (see [`kill_when_replayable`]) until one was. A quarter of the input is
/// held back: if none of the `kills` was (the job had caught up with the input every time),
/// extra runs get a held-back chunk each once they completed a checkpoint, and are killed
/// likewise, until one is. The final run then goes on until the tail saw a duplicate (the
/// restart that replays may be the final one).
fn kill_run(test: &str, mode: &str) -> KillRun {
    let _machine = exclusive();
    let started = Instant::now();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new(mode, dir.path());
    let n = env_u64("ONCEFLOW_EOS_RECORDS", 200_000);
    let kills = env_u64("ONCEFLOW_EOS_KILLS", 10) as usize;
    let control = mode == "at-least-once";
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    eprintln!(
        "[eos] {test}: {n} records + {} malformed over {PARTITIONS} partitions, {kills} kills",
        data.bad_markers.len()
    );
    let paced_len = if control {
        data.records.len() * 3 / 4
    } else {
        data.records.len()
    };
    let held = data.part(paced_len..data.records.len());
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data.part(0..paced_len),
        kills * 4,
        Duration::from_millis(300),
    );
    let mut held_chunks = held
        .records
        .chunks(held.records.len().div_ceil(HELD_CHUNKS).max(1))
        .map(|c| Dataset {
            records: c.to_vec(),
            ..held.clone()
        })
        .collect::<Vec<_>>()
        .into_iter();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut killed = 0;
    let mut runs = 0;
    let mut checkpoints_completed = 0;
    let mut replaying_kills = 0;
    let mut held_chunk = None;
    while killed < kills || (control && replaying_kills == 0) {
        if killed >= kills {
            let Some(chunk) = held_chunks.next() else {
                panic!(
                    "at-least-once: none of {killed} kills left visible output beyond the \
                     newest complete checkpoint, even with fresh backlog at each of the last \
                     {HELD_CHUNKS} ({runs} runs)"
                );
            };
            held_chunk = Some(chunk);
        }
        runs += 1;
        let mut job = spawn_job(&bootstrap, &args, &format!("{runs}"));
        let during_startup = killed < kills && killed % 4 == 1;
        if during_startup {
            std::thread::sleep(Duration::from_millis(rng.random_range(50..1500)));
        } else {
            let line = job.wait_line(START_TIMEOUT, |l| {
                checkpoint_number(l, "complete").is_some()
            });
            assert!(
                line.is_some(),
                "run {runs}: no checkpoint completed within {START_TIMEOUT:?} (status {:?})\n{}",
                job.try_status(),
                job.describe()
            );
            match held_chunk.take() {
                // fresh backlog for a job that runs: output beyond its checkpoints follows
                Some(chunk) => produce_all(&bootstrap, &args.input, &chunk),
                None => std::thread::sleep(Duration::from_millis(rng.random_range(0..1500))),
            }
        }
        // one certain replay is all the control needs; later kills are plain ones
        let replayed = if control && !during_startup && replaying_kills == 0 {
            Some(kill_when_replayable(
                &mut job,
                &bootstrap,
                &args,
                &mut rng,
                REPLAY_TRIES,
            ))
        } else {
            assert!(
                job.kill9(),
                "run {runs}: the job exited by itself before the SIGKILL ({:?})\n{}",
                job.try_status(),
                job.describe()
            );
            None
        };
        killed += 1;
        if replayed.is_some_and(|r| r > 0) {
            replaying_kills += 1;
        }
        let lines = job.lines();
        let completed = lines
            .iter()
            .filter(|l| checkpoint_number(l, "complete").is_some())
            .count();
        checkpoints_completed += completed;
        eprintln!(
            "[eos] {test}: kill {killed} (run {runs}, {}) after {completed} completed checkpoints, \
             last committed {:?}{}",
            if during_startup { "during start-up" } else { "while running" },
            last_committed(&lines),
            match replayed {
                Some(r) => format!(", {r} visible output records beyond the newest checkpoint"),
                None => String::new(),
            }
        );
    }
    producer.join().expect("input producer");
    for chunk in held_chunks {
        produce_all(&bootstrap, &args.input, &chunk);
    }
    assert!(
        checkpoints_completed > 0,
        "no run completed a checkpoint before its SIGKILL: the kills never hit a running job"
    );
    let final_restarts = finish_when(&bootstrap, &args, &data, None, FINISH_TIMEOUT, 0, |tail| {
        !control || tail.duplicates() > 0
    });
    let report = check_output(&bootstrap, &args, &data);
    let run = KillRun {
        report,
        kills: killed,
        runs,
        checkpoints_completed,
        replaying_kills,
        final_restarts,
        records: n,
        elapsed: started.elapsed(),
    };
    eprintln!(
        "[eos] {test}: {} records, {} kills in {} runs ({} replaying), {} checkpoints completed \
         between kills, {} restarts in the final run, {:.1?}\n{}",
        run.records,
        run.kills,
        run.runs,
        run.replaying_kills,
        run.checkpoints_completed,
        run.final_restarts,
        run.elapsed,
        run.report
    );
    drop(broker);
    finish_dir(dir);
    run
}

/// A kill -9 run of an exactly-once `mode`: at least 10 kills, and the output exact.
pub(crate) fn exact_kill_run(test: &str, mode: &str) {
    let run = kill_run(test, mode);
    assert!(run.kills >= 10 || env_u64("ONCEFLOW_EOS_KILLS", 10) < 10);
    assert!(
        run.report.is_exact(),
        "{mode} output is not exactly-once after {} SIGKILLs:\n{}",
        run.kills,
        run.report
    );
}

#[test]
fn two_phase_commit_survives_random_sigkills_exactly_once() {
    exact_kill_run("eos_kill9_2pc", "two-phase-commit");
}

#[test]
fn transactional_offsets_survive_random_sigkills_exactly_once() {
    exact_kill_run("eos_kill9_txn_offsets", "transactional-offsets");
}

/// The control run: at-least-once must lose nothing but show duplicates after the same
/// kills, so the exact check above demonstrably can fail. At least one kill left output
/// visible beyond the checkpoint a restart restores (checked while the job was stopped), so
/// the duplicates are certain, not a matter of when the kills landed.
#[test]
fn at_least_once_shows_duplicates_under_the_same_kills() {
    let run = kill_run("eos_kill9_at_least_once", "at-least-once");
    assert!(run.replaying_kills > 0);
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
