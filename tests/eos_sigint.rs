//! Ctrl-C (SIGINT) stops the example job like SIGTERM: a final checkpoint, its commit, the
//! `job stopped:` summary and exit 0 within 10 s; a read_committed reader then sees every
//! record the job reported as processed. `--exit-when-idle-ms` stops it the same way once
//! the input is read.

use std::time::{Duration, Instant};

use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;

#[test]
fn sigint_commits_a_final_checkpoint_and_exits_0() {
    let _machine = exclusive();
    let test = "eos_sigint";
    let dir = scenario_dir(test);
    let args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 20_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        40,
        Duration::from_millis(200),
    );
    let mut job = spawn_job(&bootstrap, &args, "sigint");
    let line = job.wait_line(Duration::from_secs(90), |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
    });
    assert!(
        line.is_some(),
        "no checkpoint 2 committed\n{}",
        job.describe()
    );

    let t0 = Instant::now();
    job.interrupt();
    let status = job.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGINT did not stop the job with exit 0 within 10 s (status {status:?})\n{}",
        job.describe()
    );
    eprintln!("[eos] {test}: exit 0 {:?} after SIGINT", t0.elapsed());
    producer.join().expect("input producer");

    let lines = job.lines();
    let summary = lines
        .iter()
        .find(|l| l.starts_with("job stopped: "))
        .unwrap_or_else(|| panic!("no `job stopped:` summary\n{}", job.describe()));
    let number_before = |word: &str| -> u64 {
        let at = summary
            .find(word)
            .unwrap_or_else(|| panic!("`{word}` in {summary}"));
        summary[..at]
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .expect("a number")
    };
    let processed = number_before(" records processed");
    let last: u64 = summary
        .split("last checkpoint ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no last checkpoint in {summary}"));
    assert_eq!(
        last_committed(&lines),
        Some(last),
        "the final checkpoint {last} was not reported committed\n{}",
        job.describe()
    );
    let committed = read_topic(&bootstrap, &args.output, true).len()
        + read_topic(&bootstrap, &args.dlq(), true).len();
    assert_eq!(
        committed as u64, processed,
        "the job reported {processed} records processed; read_committed sees {committed} output and dead-letter records"
    );
    eprintln!("[eos] {test}: {summary}");
    drop(broker);
    finish_dir(dir);
}

/// `--exit-when-idle-ms`: with all input written before the job starts, the job stops by
/// itself once no input arrived for the idle time (counted from `job started`), with a final
/// checkpoint and exit 0, and its committed output is exact. The idle time is far above the
/// time the job needs to read the input, so the verdict does not depend on the machine's
/// speed.
#[test]
fn exit_when_idle_stops_after_the_input_with_everything_committed() {
    let _machine = exclusive();
    let test = "eos_exit_when_idle";
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    args.extra_args
        .extend(["--exit-when-idle-ms".to_string(), "10000".to_string()]);
    let (broker, data) = setup(dir.path(), &args, 5_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    produce_paced(&bootstrap, &args.input, &data, 1, Duration::ZERO)
        .join()
        .expect("input producer");
    let mut job = spawn_job(&bootstrap, &args, "idle");
    let status = job.wait_exit(Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "the job did not stop by itself with exit 0 (status {status:?})\n{}",
        job.describe()
    );
    assert!(
        job.lines().iter().any(|l| l.starts_with("job stopped: ")),
        "no `job stopped:` summary\n{}",
        job.describe()
    );
    let report = check_output(&bootstrap, &args, &data);
    assert!(report.is_exact(), "output after the idle stop:\n{report}");
    drop(broker);
    finish_dir(dir);
}

/// The README's first command: the example job without `--brokers` starts the bundled broker
/// in-process with a demo input, and (stopped here by `--max-records`) ends with its final
/// output exact and exit 0; a healthy run prints no ERROR or WARN line, its shutdown
/// included (the job's clients leave before the embedded broker stops).
#[test]
fn the_embedded_demo_runs_clean() {
    let _machine = exclusive();
    let dir = scenario_dir("eos_embedded_demo");
    let (status, stdout, stderr) = onceflow_testkit::child::run_bounded(
        std::process::Command::new(&onceflow_testkit::bins::bins().job)
            .args(["--max-records", "3000", "--checkpoint-dir"])
            .arg(dir.path().join("checkpoints"))
            .env_remove("RUST_LOG"),
        None,
        Duration::from_secs(120),
    )
    .expect("the demo runs");
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("0 duplicates") && stdout.contains("job stopped:"),
        "{stdout}"
    );
    let noisy: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
        .collect();
    assert!(
        noisy.is_empty(),
        "a healthy run logged:\n{}",
        noisy.join("\n")
    );
    finish_dir(dir);
}
