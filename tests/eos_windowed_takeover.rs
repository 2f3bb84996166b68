//! `examples/windowed_counts` taken over while it runs: a second instance (same checkpoint
//! directory, group and prefix) starts once the first committed checkpoint 2; the first must
//! notice it was fenced and stop, and every tumbling window and session of the input must be
//! in the read_committed output exactly once, with the right count and sum. Both exactly-once
//! modes. The same exactness holds for two scaled-out instances (`--instance-id`) on an input
//! partitioned by user while they are SIGKILLed and restarted: the windows move between them
//! through their changelog. And in every mode, a job SIGKILLed once one partition was read to
//! its end and that position committed closes the windows of that partition after its
//! restart: the partition's watermark resumes from the event time stored with its position,
//! as no record of it is left to advance it (in at-least-once mode too, whose positions and
//! event times come from the checkpoint). Runs the broker and the jobs as child processes
//! on 127.0.0.1.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rdkafka::consumer::Consumer;

use onceflow_testkit::bins::*;
use onceflow_testkit::checkpoints::{latest_complete, try_source_positions};
use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;
use onceflow_testkit::jobs::*;
use onceflow_testkit::test_broker::TestBroker;

const USERS: u64 = 20;
const EVENTS: u64 = 6_000;
const BASE_TS: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;
const SESSION_GAP: i64 = 30_000;

/// Event `i`: user `i % USERS` on partition `user % 4`, event time 50 ms apart, and a pause of
/// 120 s every 1000 events, so each user has a session per burst (gaps within a burst are 1 s,
/// far from the 30 s session gap) and windows close while the job runs.
fn event(i: u64) -> (u64, i64, i64) {
    let ts = BASE_TS + i as i64 * 50 + (i / 1000) as i64 * 120_000;
    (i % USERS, ts, (i % 100) as i64 - 20)
}

/// A window: (kind, user, start).
type WindowId = (String, String, i64);
/// A window's result: (end, count, sum).
type WindowResult = (i64, u64, i64);

/// Every window the input closes, with its result.
fn expected() -> BTreeMap<WindowId, WindowResult> {
    let mut out = BTreeMap::new();
    let mut sessions: HashMap<u64, (i64, i64, u64, i64)> = HashMap::new();
    for i in 0..EVENTS {
        let (u, ts, amount) = event(i);
        let start = ts - ts.rem_euclid(MINUTE);
        let e = out
            .entry(("minute".to_string(), format!("user-{u}"), start))
            .or_insert((start + MINUTE, 0, 0));
        e.1 += 1;
        e.2 += amount;
        let s = sessions.entry(u).or_insert((ts, ts, 0, 0));
        if ts >= s.1 + SESSION_GAP {
            out.insert(
                ("session".to_string(), format!("user-{u}"), s.0),
                (s.1 + SESSION_GAP, s.2, s.3),
            );
            *s = (ts, ts, 0, 0);
        }
        s.1 = ts;
        s.2 += 1;
        s.3 += amount;
    }
    for (u, s) in sessions {
        out.insert(
            ("session".to_string(), format!("user-{u}"), s.0),
            (s.1 + SESSION_GAP, s.2, s.3),
        );
    }
    out
}

/// The partition of the events of `user-N` (or `flush-N`): `N % 4`.
fn by_user_number(user: &str) -> i32 {
    let n: i32 = user
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    n % PARTITIONS
}

/// The partition Kafka's default partitioner gives `user` (murmur2 of the key bytes).
fn by_key(user: &str) -> i32 {
    onceflow::connectors::kafka::scale::task_of(user.as_bytes(), PARTITIONS as u32) as i32
}

/// A user name of the flush events for partition `p` that `partition_of` puts on `p`.
fn flush_user(p: i32, partition_of: fn(&str) -> i32) -> String {
    (0..)
        .map(|j| format!("flush-{j}"))
        .find(|u| partition_of(u) == p)
        .expect("some name lands on every partition")
}

fn input_record(partition: i32, user: &str, ts: i64, amount: i64) -> Produced {
    let value = format!(r#"{{"user":"{user}","ts":{ts},"amount":{amount}}}"#);
    (Some(partition), user.to_string(), value.into_bytes())
}

/// The events, each user's on `partition_of(user)`.
fn events(partition_of: fn(&str) -> i32) -> Vec<Produced> {
    (0..EVENTS)
        .map(|i| {
            let (u, ts, amount) = event(i);
            let user = format!("user-{u}");
            input_record(partition_of(&user), &user, ts, amount)
        })
        .collect()
}

/// The far-future event of partition `p` (a `flush-*` user): once every partition has had
/// its own, the watermark passes every window of the real users.
fn flush_event(p: i32, partition_of: fn(&str) -> i32) -> Produced {
    let last = event(EVENTS - 1).1;
    input_record(p, &flush_user(p, partition_of), last + 3_600_000, 0)
}

/// Produces the events in `chunks` chunks `pause` apart, then the flush event of every
/// partition.
fn produce(
    bootstrap: &str,
    topic: &str,
    partition_of: fn(&str) -> i32,
    chunks: usize,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    let mut records = events(partition_of);
    records.extend((0..PARTITIONS).map(|p| flush_event(p, partition_of)));
    produce_records_paced(bootstrap, topic, records, chunks, pause)
}

fn is_flush(user: &str) -> bool {
    user.starts_with("flush")
}

/// The output's windows (the flush user's left out), each with every result emitted for it.
fn windows(records: &[Consumed]) -> BTreeMap<WindowId, Vec<WindowResult>> {
    let mut got: BTreeMap<WindowId, Vec<WindowResult>> = BTreeMap::new();
    for r in records {
        let v: serde_json::Value = serde_json::from_slice(&r.value).expect("output is JSON");
        let user = v["user"].as_str().unwrap_or_default().to_string();
        if is_flush(&user) {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        got.entry((kind, user, v["start"].as_i64().unwrap_or(0)))
            .or_default()
            .push((
                v["end"].as_i64().unwrap_or(0),
                v["count"].as_u64().unwrap_or(0),
                v["sum"].as_i64().unwrap_or(0),
            ));
    }
    got
}

/// The job's flags on the test's topics, with `extra` after them.
fn job_args(
    bootstrap: &str,
    mode: &str,
    checkpoint_dir: &std::path::Path,
    extra: &[&str],
) -> Vec<String> {
    [
        "--brokers",
        bootstrap,
        "--input",
        "clicks",
        "--output",
        "click-counts",
        "--group",
        "windowed-group",
        "--mode",
        mode,
        "--transactional-id-prefix",
        "windowed",
        "--checkpoint-dir",
        checkpoint_dir.to_str().expect("utf-8 path"),
        "--checkpoint-interval-ms",
        "500",
        "--parallelism",
        "2",
        // every partition has data throughout: none may be declared idle (its later records
        // would be late)
        "--idle-timeout-ms",
        "600000",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// The machine to itself, the scenario's directory, a broker on it and the test's topics
/// (input `clicks`, output `click-counts` and its late side output).
fn scenario(test: &str) -> (std::sync::MutexGuard<'static, ()>, ScenarioDir, TestBroker) {
    let machine = exclusive();
    let dir = scenario_dir(test);
    bins();
    let broker = scenario_broker(dir.path(), &[]);
    create_topics(
        broker.bootstrap(),
        &["clicks", "click-counts", "click-counts.late"],
        PARTITIONS,
    );
    (machine, dir, broker)
}

fn takeover(test: &str, mode: &str) {
    let (_machine, dir, broker) = scenario(test);
    let bootstrap = broker.bootstrap().to_string();
    let (input, output) = ("clicks", "click-counts");
    let args = job_args(&bootstrap, mode, &dir.path().join("checkpoints"), &[]);

    let producer = produce(
        &bootstrap,
        input,
        by_user_number,
        30,
        Duration::from_millis(200),
    );
    let mut first = spawn_example("windowed_counts", &args, dir.path(), "first");
    let line = first.wait_line(Duration::from_secs(90), |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
    });
    assert!(
        line.is_some(),
        "the first instance committed no checkpoint 2\n{}",
        first.describe()
    );
    let mut second = spawn_example("windowed_counts", &args, dir.path(), "second");
    let started = second.wait_line(Duration::from_secs(90), |l| l.contains("job started"));
    assert!(
        started.is_some(),
        "the second instance did not start\n{}",
        second.describe()
    );
    first.expect_failure(Duration::from_secs(60), "the second instance fenced it");
    let said = format!("{}\n{}", first.lines().join("\n"), first.stderr_tail(200));
    assert!(
        said.to_lowercase().contains("fenc"),
        "the first instance did not say it was fenced\n{}",
        first.describe()
    );
    producer.join().expect("input producer");

    let mut jobs = [first, second];
    check_windows(
        test,
        &bootstrap,
        output,
        &mut jobs,
        "after the takeover",
        Delivery::ExactlyOnce,
    );
    drop(broker);
    finish_dir(dir);
}

/// How often each window must be in the output.
#[derive(Clone, Copy, PartialEq)]
enum Delivery {
    ExactlyOnce,
    /// At least once: a result may repeat (records replayed after a restore), always with the
    /// same count and sum.
    AtLeastOnce,
}

/// Waits until the read_committed output has a result for every window of the input, stops
/// the jobs still running, and checks that every window is there exactly once (or at least
/// once) with the right count and sum, that no other window is, and that no event went to the
/// late topic.
fn check_windows(
    test: &str,
    bootstrap: &str,
    output: &str,
    jobs: &mut [Proc],
    what: &str,
    delivery: Delivery,
) {
    let want = expected();
    let seen = wait_for(
        Duration::from_secs(120),
        || read_topic(bootstrap, output, true),
        |recs| {
            let got = windows(recs);
            want.keys().all(|k| got.contains_key(k))
        },
    );
    if seen.is_none() {
        let got = windows(&read_topic(bootstrap, output, true));
        let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        panic!(
            "the output did not reach {} windows within 120 s: {} missing, e.g. {:?}\n{}",
            want.len(),
            missing.len(),
            &missing[..missing.len().min(10)],
            jobs.iter()
                .map(|j| j.describe())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    for job in jobs.iter_mut() {
        if job.try_status().is_none() {
            job.stop_gracefully(Duration::from_secs(60));
        }
    }

    let got = windows(&read_topic(bootstrap, output, true));
    let repeated: Vec<_> = got.iter().filter(|(_, v)| v.len() > 1).take(10).collect();
    assert!(
        repeated.is_empty() || delivery == Delivery::AtLeastOnce,
        "windows emitted more than once: {repeated:?}"
    );
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "windows missing from the output: {missing:?}"
    );
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g.iter().any(|r| r != *v)))
        .take(10)
        .map(|(k, v)| (k, v, &got[k]))
        .collect();
    assert!(
        wrong.is_empty(),
        "windows with a wrong result (window, want, got): {wrong:?}"
    );
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(10)
        .collect();
    assert!(
        extra.is_empty(),
        "windows the input does not have: {extra:?}"
    );
    assert!(
        read_topic(bootstrap, &format!("{output}.late"), true).is_empty(),
        "events went to the late topic"
    );
    let how = match delivery {
        Delivery::ExactlyOnce => "exactly once",
        Delivery::AtLeastOnce => "at least once, every result right",
    };
    eprintln!("[eos] {test}: {} windows, each {how} {what}", want.len());
}

#[test]
fn two_phase_commit_takeover_emits_every_window_once() {
    takeover("eos_windowed_takeover_2pc", "two-phase-commit");
}

#[test]
fn transactional_offsets_takeover_emits_every_window_once() {
    takeover("eos_windowed_takeover_txn_offsets", "transactional-offsets");
}

/// The flags of scaled-out instance `name` after the common ones.
fn instance_flags(name: &str) -> [&str; 9] {
    [
        "--instance-id",
        name,
        "--input-partitioned-by-key",
        "--session-timeout-ms",
        "6000",
        "--transaction-timeout-ms",
        "8000",
        "--recovery-allowance-ms",
        "3000",
    ]
}

/// Scaled-out instance `name`: its own checkpoint directory, input partitioned by user.
fn start_instance(bootstrap: &str, dir: &std::path::Path, name: &str, run: &str) -> Proc {
    let args = job_args(
        bootstrap,
        "transactional-offsets",
        &dir.join(format!("checkpoints-{name}")),
        &instance_flags(name),
    );
    let mut p = spawn_example("windowed_counts", &args, dir, run);
    let started = p.wait_line(Duration::from_secs(120), |l| l == "job started");
    assert!(started.is_some(), "{run} did not start\n{}", p.describe());
    p
}

/// Two scaled-out instances share the windows of an input partitioned by user; each in turn
/// is SIGKILLed right after a commit it reported, its checkpoint directory deleted, and
/// started again. The windows of the killed instance's tasks continue on the other instance
/// from their changelog, and come back the same way: every window is emitted exactly once
/// with the right count and sum.
#[test]
fn scaled_out_instances_emit_every_window_once() {
    let test = "eos_windowed_scale_out";
    let (_machine, dir, broker) = scenario(test);
    let bootstrap = broker.bootstrap().to_string();
    let users: std::collections::BTreeSet<i32> =
        (0..USERS).map(|u| by_key(&format!("user-{u}"))).collect();
    assert_eq!(
        users.len(),
        PARTITIONS as usize,
        "every partition has users"
    );
    let producer = produce(&bootstrap, "clicks", by_key, 60, Duration::from_millis(300));
    let mut a = start_instance(&bootstrap, dir.path(), "node-a", "a-1");
    let mut b = start_instance(&bootstrap, dir.path(), "node-b", "b-1");
    let mut changes = Vec::new();
    for (round, victim) in ["node-a", "node-b"].into_iter().enumerate() {
        let (p, other) = if victim == "node-a" {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        // the victim shares the tasks with the other instance and committed some windows
        let shared = p.next_line(Duration::from_secs(120), |l| {
            l.contains("dataflow for assignment")
                && !l.contains("partitions []")
                && !l.contains("partitions [0, 1, 2, 3]")
        });
        assert!(
            shared.is_some(),
            "{victim} never shared the tasks\n{}",
            p.describe()
        );
        let committed = p.next_line(Duration::from_secs(60), |l| {
            checkpoint_number(l, "committed").is_some()
        });
        assert!(
            committed.is_some(),
            "{victim} committed nothing\n{}",
            p.describe()
        );
        assert!(p.kill9(), "{victim} had exited\n{}", p.describe());
        std::fs::remove_dir_all(dir.path().join(format!("checkpoints-{victim}")))
            .expect("delete the killed instance's checkpoint directory");
        changes.push(format!("SIGKILL {victim}"));
        // the other instance takes every task and commits with the moved windows
        let all = other.next_line(Duration::from_secs(90), |l| {
            l.contains("dataflow for assignment") && l.contains("partitions [0, 1, 2, 3]")
        });
        assert!(
            all.is_some(),
            "the killed instance's tasks did not move\n{}",
            other.describe()
        );
        let run = format!("{}-{}", &victim[5..], round + 2);
        *p = start_instance(&bootstrap, dir.path(), victim, &run);
        changes.push(format!("started {victim}"));
    }
    producer.join().expect("input producer");
    check_windows(
        test,
        &bootstrap,
        "click-counts",
        &mut [a, b],
        &format!("through {}", changes.join(", ")),
        Delivery::ExactlyOnce,
    );
    drop(broker);
    finish_dir(dir);
}

/// How [`restart_after_a_partition_was_read_to_its_end`] runs the job.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    TwoPhaseCommit,
    TransactionalOffsets,
    ScaledOut,
    /// The only mode whose source starts from the checkpoint's positions (the others start
    /// from the group's committed offsets), so its event times come from the checkpoint.
    AtLeastOnce,
}

/// Every event is in the input, but only partition 0 has its flush event: the job reads
/// partition 0 to its end while the other partitions hold the watermark before the last
/// windows. Once the job's durable position of partition 0 (its checkpoint's, or the group's
/// committed offset) is that end, it is SIGKILLed and started again, and the other
/// partitions' flush events follow. Partition 0 has no record left for the restarted job: its
/// watermark must resume from the event time stored with the position, or the windows of the
/// job's last minute never close. Every window is then emitted exactly once (at least once, with
/// the right result every time, in at-least-once mode).
fn restart_after_a_partition_was_read_to_its_end(test: &str, run: Run) {
    let (_machine, dir, broker) = scenario(test);
    let bootstrap = broker.bootstrap().to_string();
    let partition_of = if run == Run::ScaledOut {
        by_key
    } else {
        by_user_number
    };
    let mut first = events(partition_of);
    first.push(flush_event(0, partition_of));
    produce_records_paced(&bootstrap, "clicks", first, 1, Duration::ZERO)
        .join()
        .expect("input producer");
    let (_, end) = consumer_with(&bootstrap, true, false)
        .fetch_watermarks("clicks", 0, Duration::from_secs(30))
        .expect("end of partition 0");

    let checkpoints = dir.path().join("checkpoints");
    let (mode, extra) = match run {
        Run::TwoPhaseCommit => ("two-phase-commit", Vec::new()),
        Run::TransactionalOffsets => ("transactional-offsets", Vec::new()),
        Run::ScaledOut => ("transactional-offsets", instance_flags("node-a").to_vec()),
        Run::AtLeastOnce => ("at-least-once", Vec::new()),
    };
    let delivery = if run == Run::AtLeastOnce {
        Delivery::AtLeastOnce
    } else {
        Delivery::ExactlyOnce
    };
    let args = job_args(&bootstrap, mode, &checkpoints, &extra);
    let start = |name: &str| {
        let mut job = spawn_example("windowed_counts", &args, dir.path(), name);
        let started = job.wait_line(Duration::from_secs(120), |l| l == "job started");
        assert!(
            started.is_some(),
            "{name} did not start\n{}",
            job.describe()
        );
        job
    };
    let mut job = start("first");
    // the durable position of partition 0 reaches its end (a checkpoint the running job
    // discarded since it was listed counts as not there yet)
    let durable = || match run {
        Run::TwoPhaseCommit | Run::AtLeastOnce => latest_complete(&checkpoints)
            .and_then(|id| try_source_positions(&checkpoints, id, "clicks").ok())
            .and_then(|positions| positions.get(&0).copied()),
        _ => committed_offsets(&bootstrap, "windowed-group", "clicks", PARTITIONS)
            .get(&0)
            .copied(),
    };
    let at_end = wait_for(Duration::from_secs(120), durable, |at| *at == Some(end));
    assert!(
        at_end.is_some(),
        "the job's durable position of partition 0 did not reach its end {end} (at {:?})\n{}",
        durable(),
        job.describe()
    );
    assert!(job.kill9(), "the job had exited\n{}", job.describe());
    let restarted = start("restarted");
    produce_records_paced(
        &bootstrap,
        "clicks",
        (1..PARTITIONS)
            .map(|p| flush_event(p, partition_of))
            .collect(),
        1,
        Duration::ZERO,
    )
    .join()
    .expect("flush producer");
    check_windows(
        test,
        &bootstrap,
        "click-counts",
        &mut [job, restarted],
        "after a restart with partition 0 read to its end",
        delivery,
    );
    drop(broker);
    finish_dir(dir);
}

#[test]
fn two_phase_commit_restart_closes_the_windows_of_a_partition_read_to_its_end() {
    restart_after_a_partition_was_read_to_its_end("eos_windowed_resume_2pc", Run::TwoPhaseCommit);
}

#[test]
fn transactional_offsets_restart_closes_the_windows_of_a_partition_read_to_its_end() {
    restart_after_a_partition_was_read_to_its_end(
        "eos_windowed_resume_txn_offsets",
        Run::TransactionalOffsets,
    );
}

#[test]
fn scaled_out_restart_closes_the_windows_of_a_partition_read_to_its_end() {
    restart_after_a_partition_was_read_to_its_end("eos_windowed_resume_scaled_out", Run::ScaledOut);
}

#[test]
fn at_least_once_restart_closes_the_windows_of_a_partition_read_to_its_end() {
    restart_after_a_partition_was_read_to_its_end(
        "eos_windowed_resume_at_least_once",
        Run::AtLeastOnce,
    );
}
