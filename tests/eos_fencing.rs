//! A second instance of the job with the same transactional id
//! prefix (same checkpoint dir and group: an accidental double start) fences the first,
//! which must stop by itself; the output stays exactly-once.

use std::time::Duration;

use onceflow_testkit::eos::*;

fn fencing_run(test: &str, mode: &str) {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new(mode, dir.path());
    let n = env_u64("ONCEFLOW_EOS_FENCING_RECORDS", 40_000);
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        50,
        Duration::from_millis(200),
    );

    let mut first = spawn_job(&bootstrap, &args, "first");
    let line = first.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
    });
    assert!(
        line.is_some(),
        "the first instance did not commit checkpoint 2 within {START_TIMEOUT:?}\n{}",
        first.describe()
    );
    let mut second = spawn_job(&bootstrap, &args, "second");
    let started = second.wait_line(START_TIMEOUT, |l| l.contains("job started"));
    assert!(
        started.is_some(),
        "the second instance did not start (status {:?})\n{}",
        second.try_status(),
        second.describe()
    );
    // The zombie must notice that it is fenced and stop by itself.
    let status = first.expect_failure(
        STOP_TIMEOUT,
        "the second instance fenced it, so it must notice and stop by itself",
    );
    let said = format!("{}\n{}", first.lines().join("\n"), first.stderr_tail(200));
    assert!(
        said.to_lowercase().contains("fenc"),
        "the fenced instance did not say it was fenced\n{}",
        first.describe()
    );
    eprintln!("[eos] {test}: first instance stopped ({status}) after the second started");
    assert!(
        second.try_status().is_none(),
        "the second instance stopped too\n{}",
        second.describe()
    );

    producer.join().expect("input producer");
    finish_exact(
        test,
        "fencing",
        &bootstrap,
        &args,
        &data,
        Some(second),
        FINISH_TIMEOUT,
        0,
    );
    drop(broker);
    finish_dir(dir);
}

/// The second instance seals nothing until it fenced the first: `init_transactions` on
/// `{prefix}-checkpoints` stops the first from completing more checkpoints, then the second
/// waits for it to stop and restores the checkpoint the group's offsets name.
#[test]
fn second_two_phase_commit_instance_fences_the_first() {
    fencing_run("eos_fencing_2pc", "two-phase-commit");
}

#[test]
fn second_transactional_offsets_instance_fences_the_first() {
    fencing_run("eos_fencing_txn_offsets", "transactional-offsets");
}

/// A different job (its own checkpoint directory, group and output) started
/// with a prefix a live job uses is refused at start with exit code 2 and a message naming the
/// prefix; the running job is not disturbed (it is not fenced and keeps committing).
#[test]
fn another_job_with_the_same_prefix_is_refused() {
    let _machine = exclusive();
    let test = "eos_prefix_in_use";
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 2_000, seed);
    let bootstrap = broker.bootstrap().to_string();
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        20,
        Duration::from_millis(50),
    );
    let mut first = spawn_job(&bootstrap, &args, "first");
    let line = first.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
    });
    assert!(
        line.is_some(),
        "the first job did not commit checkpoint 2 within {START_TIMEOUT:?}\n{}",
        first.describe()
    );

    let mut other = JobArgs::new("two-phase-commit", &dir.path().join("other-job"));
    other.prefix = args.prefix.clone();
    other.output = "eos-other-output".into();
    other.group = "eos-other-group".into();
    other.log_dir = dir.path().to_path_buf();
    let mut second = spawn_job(&bootstrap, &other, "other-job");
    let status = second.wait_exit(STOP_TIMEOUT);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(2),
        "a second job with the same prefix was not refused with exit code 2\n{}",
        second.describe()
    );
    let said = second.stderr_tail(50);
    assert!(
        said.contains(&args.prefix) && said.contains("in use by another live job"),
        "the refusal does not name the prefix\n{}",
        second.describe()
    );
    assert!(
        !second.lines().iter().any(|l| l.contains("job started")),
        "the refused job started\n{}",
        second.describe()
    );

    // the first job was not fenced: it commits further checkpoints and stops cleanly
    let before = last_committed(&first.lines()).unwrap_or(0);
    let later = first.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= before + 2)
    });
    assert!(
        later.is_some() && first.try_status().is_none(),
        "the first job stopped committing after the refused start\n{}",
        first.describe()
    );
    producer.join().expect("input producer");
    finish_exact(
        test,
        "a refused start of another job with its prefix",
        &bootstrap,
        &args,
        &data,
        Some(first),
        FINISH_TIMEOUT,
        0,
    );
    drop(broker);
    finish_dir(dir);
}
