//! `onceflow transactions` on a job's lingering transactions: a two-phase-commit job dies at
//! a failpoint right after a checkpoint completed (its transactions pre-committed, not
//! committed), which holds back the last stable offset of its output. While an instance
//! holds the prefix, `abort` is refused; `list` shows the open transactions and their
//! partitions; `abort` refuses two-phase-commit transactions without
//! `--discard-pre-committed` (a restart would commit them); with it, every open transaction
//! ends and read_committed readers reach the end of every partition.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use onceflow_testkit::clients::consumer_with;
use onceflow_testkit::eos::*;
use rdkafka::consumer::Consumer;

fn onceflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(args)
        .output()
        .expect("run onceflow")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Output partitions whose last stable offset is below their high watermark: an open
/// transaction holds read_committed readers back there.
fn held_back(bootstrap: &str, topic: &str) -> Vec<(i32, i64, i64)> {
    let committed = consumer_with(bootstrap, true, false);
    let uncommitted = consumer_with(bootstrap, false, false);
    let t = Duration::from_secs(15);
    (0..PARTITIONS)
        .filter_map(|p| {
            let (_, lso) = committed.fetch_watermarks(topic, p, t).expect("LSO");
            let (_, hw) = uncommitted.fetch_watermarks(topic, p, t).expect("HW");
            (lso < hw).then_some((p, lso, hw))
        })
        .collect()
}

/// The checkpoint after whose completion the job dies.
const CRASH_AT: u64 = 12;

#[test]
fn lingering_transactions_are_listed_and_aborted() {
    let _machine = exclusive();
    let test = "ops_transactions";
    let dir = scenario_dir(test);
    let args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 20_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    let cluster = [
        "--brokers",
        bootstrap.as_str(),
        "--prefix",
        args.prefix.as_str(),
    ];

    // a live job: abort is refused
    let mut crashing = args.clone();
    crashing.env.push((
        "ONCEFLOW_FAILPOINT".into(),
        format!("after-checkpoint-complete:{CRASH_AT}"),
    ));
    let mut job = spawn_job(&bootstrap, &crashing, "1");
    // input from the job's start on, for about 15 s: checkpoint CRASH_AT (some 6 s in at a
    // 500 ms interval) writes records into the transactions it pre-commits
    let started = job.wait_line(START_TIMEOUT, |l| l == "job started");
    assert!(started.is_some(), "{}", job.describe());
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        150,
        Duration::from_millis(100),
    );
    let line = job.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some()
    });
    assert!(line.is_some(), "{}", job.describe());
    let refused = onceflow(&[&["transactions", "abort"][..], &cluster[..]].concat());
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("a live instance holds prefix"),
        "{}",
        text(&refused)
    );

    // the job dies with checkpoint 6's transactions pre-committed
    job.expect_failure(Duration::from_secs(120), "the failpoint aborts the job");
    assert!(
        job.stderr_tail(50)
            .contains(&format!("after-checkpoint-complete:{CRASH_AT}")),
        "the job died before its failpoint\n{}",
        job.describe()
    );
    // its registry membership expires (6 s session): then no live instance holds the prefix
    let polling = Instant::now();
    let listed = loop {
        let o = onceflow(&[&["transactions", "list"][..], &cluster[..]].concat());
        assert!(o.status.success(), "{}", text(&o));
        if text(&o).contains("no live instance holds it") {
            break o;
        }
        assert!(polling.elapsed() < START_TIMEOUT, "{}", text(&o));
        std::thread::sleep(Duration::from_millis(500));
    };
    let listed = text(&listed);
    assert!(
        listed.contains("Ongoing") && listed.contains(&format!("{}-0-", args.prefix)),
        "no open ring transaction listed\n{listed}"
    );
    let before = held_back(&bootstrap, &args.output);
    assert!(
        !before.is_empty(),
        "no output partition held back by the open transactions\n{listed}"
    );

    let json = onceflow(&[&["transactions", "list", "--json"][..], &cluster[..]].concat());
    let open: Vec<serde_json::Value> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .filter(|t: &serde_json::Value| t["state"] == "Ongoing")
        .collect();
    assert!(!open.is_empty(), "{}", text(&json));
    assert!(
        open.iter()
            .all(|t| t["partitions"].as_array().is_some_and(|p| !p.is_empty())),
        "{}",
        text(&json)
    );

    // two-phase-commit transactions need the acknowledgement that output may be lost
    let refused = onceflow(&[&["transactions", "abort"][..], &cluster[..]].concat());
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("--discard-pre-committed"),
        "{}",
        text(&refused)
    );

    let aborted = onceflow(
        &[
            &["transactions", "abort", "--discard-pre-committed"][..],
            &cluster[..],
        ]
        .concat(),
    );
    assert!(aborted.status.success(), "{}", text(&aborted));
    assert!(text(&aborted).contains("aborted"), "{}", text(&aborted));
    let after = onceflow(&[&["transactions", "list"][..], &cluster[..]].concat());
    assert!(
        text(&after).contains(" 0 with an open transaction"),
        "{}",
        text(&after)
    );
    let still = held_back(&bootstrap, &args.output);
    assert!(
        still.is_empty(),
        "partitions still held back after the abort (partition, LSO, HW): {still:?} (before: {before:?})\n{}",
        text(&aborted)
    );
    producer.join().expect("input producer");
    drop(broker);
    finish_dir(dir);
}
