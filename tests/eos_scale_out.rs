//! Scaled-out instances of the example job (`--instance-id`, transactional-offsets mode):
//! three instances share an input of 6 partitions that is not partitioned by the totals' key
//! (so every record crosses the repartition topic) while instances are SIGKILLed and new ones
//! start, each change made on an event an instance reported; afterwards a read_committed
//! consumer must see every id exactly once and every key's last total equal to the sum of its
//! inputs. The keyed totals move between instances through the changelog: an instance never
//! restores from another's checkpoint directory. The moved-task and zombie scenarios run on
//! an input partitioned by the key (`--input-partitioned-by-key`: no repartition topic).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::create_topics;
use onceflow_testkit::eos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Flags of instance `name` of the scaled-out job.
fn instance_args(base: &JobArgs, dir: &std::path::Path, name: &str) -> JobArgs {
    let mut args = base.clone();
    args.checkpoint_dir = dir.join(format!("checkpoints-{name}"));
    args.extra_args.extend(
        [
            "--instance-id",
            name,
            "--session-timeout-ms",
            "6000",
            "--recovery-allowance-ms",
            "3000",
        ]
        .map(String::from),
    );
    args
}

/// Starts instance `name` (run `run` names its log) and waits until its first dataflow
/// started.
fn start(bootstrap: &str, base: &JobArgs, dir: &std::path::Path, name: &str, run: &str) -> Proc {
    let mut p = spawn_job(bootstrap, &instance_args(base, dir, name), run);
    let started = p.wait_line(Duration::from_secs(120), |l| l == "job started");
    assert!(started.is_some(), "{run} did not start\n{}", p.describe());
    p
}

#[test]
fn instances_killed_and_started_keep_the_output_exact() {
    let _machine = exclusive();
    let test = "eos_scale_out";
    let dir = scenario_dir(test);
    let mut base = JobArgs::new("transactional-offsets", dir.path());
    base.prefix = "scale-etl".into();
    base.group = "scale-etl".into();
    // a killed instance's open transaction blocks the output until it is aborted: by the
    // instance's next incarnation, or by the broker after this timeout
    base.transaction_timeout_ms = Some(8_000);
    let (broker, data) = setup(dir.path(), &base, 200_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    // an input of 6 partitions whose records are keyed by their id's partition, not by the
    // key the totals are kept by: every record goes through the repartition topic
    base.input = "scale-input-6".into();
    create_topics(&bootstrap, &[&base.input], 6);
    let data = data.spread_over(6);
    let mut rng = StdRng::seed_from_u64(seed(test));
    // consumed repartition records are deleted every 2 s
    base.extra_args
        .extend(["--repartition-purge-interval-ms", "2000"].map(String::from));

    let producer = produce_paced(
        &bootstrap,
        &base.input,
        &data,
        60,
        Duration::from_millis(300),
    );
    let mut running: BTreeMap<String, Proc> = BTreeMap::new();
    let mut runs = 0usize;
    for name in ["node-a", "node-b", "node-c"] {
        runs += 1;
        let p = start(
            &bootstrap,
            &base,
            dir.path(),
            name,
            &format!("{name}-{runs}"),
        );
        running.insert(name.to_string(), p);
    }

    // membership changes: kill one of the running instances right after it reported a
    // commit, or start a stopped (or new) one; at least two stay alive
    let mut changes = 0usize;
    let mut next_name = 0usize;
    let mut stopped: Vec<String> = Vec::new();
    while changes < 10 {
        let kill = running.len() > 2 || (running.len() == 2 && rng.random_bool(0.3));
        if kill && running.len() > 1 {
            let names: Vec<String> = running.keys().cloned().collect();
            let name = names[rng.random_range(0..names.len())].clone();
            let p = running.get_mut(&name).expect("running");
            // on an event it reports: its next commit (none if it owns nothing)
            skip_to_end(p);
            let _ = p.next_line(Duration::from_secs(30), |l| {
                checkpoint_number(l, "committed").is_some()
            });
            assert!(p.kill9(), "{name} had exited by itself\n{}", p.describe());
            eprintln!("[eos] {test}: SIGKILL {name}");
            running.remove(&name);
            stopped.push(name);
        } else {
            let name = if !stopped.is_empty() && rng.random_bool(0.6) {
                stopped.remove(rng.random_range(0..stopped.len()))
            } else {
                next_name += 1;
                format!("node-x{next_name}")
            };
            runs += 1;
            let p = start(
                &bootstrap,
                &base,
                dir.path(),
                &name,
                &format!("{name}-{runs}"),
            );
            eprintln!("[eos] {test}: started {name}");
            running.insert(name, p);
        }
        changes += 1;
    }
    producer.join().expect("input producer");

    // the instances still running read the rest
    let mut tail = Tail::new(&bootstrap, &base.output, &base.dlq());
    let deadline = Instant::now() + Duration::from_secs(240);
    while !tail.complete(&data) && Instant::now() < deadline {
        tail.poll_for(&data, Duration::from_secs(1));
        for (name, p) in running.iter_mut() {
            assert!(p.try_status().is_none(), "{name} exited\n{}", p.describe());
        }
    }
    for p in running.values_mut() {
        p.stop_gracefully(Duration::from_secs(60));
    }
    let report = check_output(&bootstrap, &base, &data);
    eprintln!("[eos] {test}: {changes} membership changes, {runs} instance runs\n{report}");
    assert!(
        report.is_exact(),
        "output after {changes} membership changes:\n{report}"
    );
    // the instances deleted what they had consumed from the repartition topic
    let purged = repartition_low_watermarks(&bootstrap, "scale-etl-key-by-0-repartition", 6);
    eprintln!("[eos] {test}: repartition partitions start at {purged:?}");
    assert!(
        purged.iter().all(|&low| low > 0),
        "a repartition partition was never purged: low watermarks {purged:?}"
    );
    drop(broker);
    finish_dir(dir);
}

/// The first offset still stored in each partition of `topic`.
fn repartition_low_watermarks(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    use rdkafka::consumer::Consumer;
    let c = onceflow_testkit::clients::consumer_with(bootstrap, true, false);
    (0..partitions)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks of the repartition topic")
                .0
        })
        .collect()
}

/// Moves `p`'s line cursor past every line printed so far.
fn skip_to_end(p: &mut Proc) {
    while p.next_line(Duration::ZERO, |_| true).is_some() {}
}

/// The partitions an instance's latest dataflow was built for, from its stdout.
fn partitions_of_line(line: &str) -> Option<Vec<i32>> {
    let list = line.split("partitions [").nth(1)?.split(']').next()?;
    Some(
        list.split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect(),
    )
}

fn owns_all(line: &str) -> bool {
    line.contains("dataflow for assignment")
        && partitions_of_line(line).is_some_and(|p| p.len() == PARTITIONS as usize)
}

/// A scenario of two instances on an input partitioned by the key: the broker, the input
/// (produced paced on a thread), and instances `node-a` and `node-b` started, each owning
/// some tasks.
struct TwoInstances {
    dir: onceflow_testkit::eos::ScenarioDir,
    base: JobArgs,
    broker: onceflow_testkit::test_broker::TestBroker,
    data: Dataset,
    bootstrap: String,
    producer: std::thread::JoinHandle<()>,
    a: Proc,
    b: Proc,
}

fn two_instances(test: &str, prefix: &str, checkpoint_interval_ms: u64) -> TwoInstances {
    let dir = scenario_dir(test);
    let mut base = JobArgs::new("transactional-offsets", dir.path());
    base.prefix = prefix.into();
    base.group = prefix.into();
    base.extra_args.push("--input-partitioned-by-key".into());
    base.checkpoint_interval_ms = checkpoint_interval_ms;
    base.transaction_timeout_ms = Some(8_000);
    let (broker, data) = setup(dir.path(), &base, 12_000, seed(test));
    let data = data.partitioned_by_key();
    let bootstrap = broker.bootstrap().to_string();
    let producer = produce_paced(
        &bootstrap,
        &base.input,
        &data,
        40,
        Duration::from_millis(300),
    );
    let mut a = start(&bootstrap, &base, dir.path(), "node-a", "a-1");
    let mut b = start(&bootstrap, &base, dir.path(), "node-b", "b-1");
    for p in [&mut a, &mut b] {
        let shared = p.wait_line(Duration::from_secs(120), |l| {
            l.contains("dataflow for assignment")
                && partitions_of_line(l)
                    .is_some_and(|p| !p.is_empty() && p.len() < PARTITIONS as usize)
        });
        assert!(
            shared.is_some(),
            "the work was never shared\n{}",
            p.describe()
        );
    }
    TwoInstances {
        dir,
        base,
        broker,
        data,
        bootstrap,
        producer,
        a,
        b,
    }
}

impl TwoInstances {
    /// Waits for the whole input in the output, stops both instances and checks the output.
    fn finish_exact(mut self, test: &str, what: &str) {
        self.producer.join().expect("input producer");
        let mut tail = Tail::new(&self.bootstrap, &self.base.output, &self.base.dlq());
        let deadline = Instant::now() + Duration::from_secs(180);
        while !tail.complete(&self.data) && Instant::now() < deadline {
            tail.poll_for(&self.data, Duration::from_secs(1));
        }
        self.a.stop_gracefully(Duration::from_secs(60));
        self.b.stop_gracefully(Duration::from_secs(60));
        let report = check_output(&self.bootstrap, &self.base, &self.data);
        eprintln!("[eos] {test}: {what}\n{report}");
        assert!(report.is_exact(), "output after {what}:\n{report}");
        drop(self.broker);
        finish_dir(self.dir);
    }
}

/// An instance stopped on purpose hands its tasks to the other one, which continues their
/// totals from the changelog: the stopped instance's checkpoint directory is deleted first,
/// so nothing can come from its disk. Started again, it takes tasks back the same way.
#[test]
fn a_moved_task_continues_its_totals_from_the_changelog() {
    let _machine = exclusive();
    let test = "eos_scale_out_moved";
    let mut run = two_instances(test, "scale-moved", 500);
    // a has committed some of its keys' totals
    let committed = run.a.next_line(Duration::from_secs(60), |l| {
        checkpoint_number(l, "committed").is_some()
    });
    assert!(
        committed.is_some(),
        "a committed nothing\n{}",
        run.a.describe()
    );
    run.a.stop_gracefully(Duration::from_secs(60));
    std::fs::remove_dir_all(instance_args(&run.base, run.dir.path(), "node-a").checkpoint_dir)
        .expect("delete a's checkpoint directory");
    let all = run.b.next_line(Duration::from_secs(60), owns_all);
    assert!(
        all.is_some(),
        "b never took a's tasks\n{}",
        run.b.describe()
    );
    // a commit of b's new dataflow: its set-up, the restore included, is over
    let committed = run.b.next_line(Duration::from_secs(60), |l| {
        checkpoint_number(l, "committed").is_some()
    });
    assert!(
        committed.is_some(),
        "b committed nothing\n{}",
        run.b.describe()
    );
    let restored = std::fs::read_to_string(run.dir.path().join("job-b-1.stderr.log"))
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("keyed state restored") && !l.contains("from_changelog=0"));
    assert!(restored, "b restored no keyed state from the changelog");

    // a again, with an empty directory: it takes tasks back from b
    run.a = start(&run.bootstrap, &run.base, run.dir.path(), "node-a", "a-2");
    run.finish_exact(test, "a task moved to b and back");
}

/// An instance frozen (SIGSTOP) past its session timeout loses its tasks to the other one;
/// resumed, it cannot commit any more (the group generation of its offsets is refused, its
/// transaction aborts): the first thing it reports is a failed dataflow, then it rejoins, and
/// the output stays exact. Checkpoints are 2 s apart and the freeze follows a commit at
/// once, so the zombie holds no commit already under way.
#[test]
fn a_frozen_instance_cannot_commit_after_its_session_expired() {
    let _machine = exclusive();
    let test = "eos_scale_out_zombie";
    let mut run = two_instances(test, "scale-zombie", 2_000);
    let (a, b) = (&mut run.a, &mut run.b);
    // skip to a's latest line, then freeze it right after its next commit
    skip_to_end(a);
    let committed = a.next_line(Duration::from_secs(60), |l| {
        checkpoint_number(l, "committed").is_some()
    });
    assert!(committed.is_some(), "a committed nothing\n{}", a.describe());
    assert!(a.suspend(), "a had exited\n{}", a.describe());
    let all = b.next_line(Duration::from_secs(90), owns_all);
    assert!(all.is_some(), "b never took a's tasks\n{}", b.describe());
    a.resume();
    let next = a.next_line(Duration::from_secs(120), |l| {
        checkpoint_number(l, "committed").is_some() || l.contains("dataflow failed")
    });
    assert!(
        next.as_deref()
            .is_some_and(|l| l.contains("dataflow failed")),
        "the resumed zombie's next event was {next:?}, not a refused commit\n{}",
        a.describe()
    );
    let rejoined = a.next_line(Duration::from_secs(120), |l| l == "job started");
    assert!(rejoined.is_some(), "a did not rejoin\n{}", a.describe());
    run.finish_exact(
        test,
        &format!("a zombie whose first event after SIGCONT was {next:?}"),
    );
}

/// A second process started under the name of a running instance waits as long as a killed
/// incarnation could stay in the group (three session timeouts plus the transaction timeout),
/// finds the running one still there and is refused with the reason; the running instance
/// is not disturbed and the output stays exact.
#[test]
fn a_second_process_with_a_running_instance_id_is_refused() {
    let _machine = exclusive();
    let test = "eos_scale_out_same_name";
    let dir = scenario_dir(test);
    let mut base = JobArgs::new("transactional-offsets", dir.path());
    base.prefix = "scale-name".into();
    base.group = "scale-name".into();
    base.transaction_timeout_ms = Some(8_000);
    base.extra_args.push("--input-partitioned-by-key".into());
    let (broker, data) = setup(dir.path(), &base, 3_000, seed(test));
    let data = data.partitioned_by_key();
    let bootstrap = broker.bootstrap().to_string();
    let mut a = start(&bootstrap, &base, dir.path(), "node-a", "a-1");
    produce_all(&bootstrap, &base.input, &data);

    // the same --instance-id, its own checkpoint directory (a shared one is refused sooner)
    let mut args = instance_args(&base, dir.path(), "node-a");
    args.checkpoint_dir = dir.path().join("checkpoints-node-a-again");
    let mut again = spawn_job(&bootstrap, &args, "a-again");
    again.expect_failure(
        Duration::from_secs(90),
        "node-a already runs: the second process must not join",
    );
    let said = again.stderr_tail(100);
    assert!(
        said.contains("instance `node-a` is already running"),
        "the refusal does not say why\n{}",
        again.describe()
    );
    assert!(
        again
            .lines()
            .iter()
            .all(|l| !l.contains("dataflow for assignment")),
        "the second process built a dataflow before it was refused\n{}",
        again.describe()
    );
    assert!(a.try_status().is_none(), "node-a exited\n{}", a.describe());

    let mut tail = Tail::new(&bootstrap, &base.output, &base.dlq());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !tail.complete(&data) && Instant::now() < deadline {
        tail.poll_for(&data, Duration::from_secs(1));
    }
    a.stop_gracefully(Duration::from_secs(60));
    let report = check_output(&bootstrap, &base, &data);
    eprintln!("[eos] {test}: second node-a refused\n{report}");
    assert!(report.is_exact(), "output:\n{report}");
    drop(broker);
    finish_dir(dir);
}

/// `--internal-replication-factor` reaches the CreateTopics of the job's own topics (the
/// registry, the repartition and changelog topics): on Apache Kafka's one node a factor of 3
/// is refused at start with exit code 2 and a message naming the flag; the bundled broker
/// accepts any factor on its one node (broker/README.md), so there the instance starts. The
/// default, -1 (the cluster's `default.replication.factor`), is what every other test runs.
#[test]
fn an_internal_replication_factor_is_asked_of_the_cluster() {
    let _machine = exclusive();
    let test = "eos_scale_out_replication";
    let dir = scenario_dir(test);
    let mut base = JobArgs::new("transactional-offsets", dir.path());
    base.prefix = "scale-replication".into();
    base.group = "scale-replication".into();
    base.extra_args
        .extend(["--internal-replication-factor", "3"].map(String::from));
    let (broker, _data) = setup(dir.path(), &base, 10, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    let args = instance_args(&base, dir.path(), "node-a");
    let mut p = spawn_job(&bootstrap, &args, "a-1");
    if onceflow_testkit::test_broker::on_apache_kafka() {
        let status = p.wait_exit(Duration::from_secs(120));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(2),
            "replication factor 3 on one broker\n{}",
            p.describe()
        );
        let said = p.stderr_tail(20);
        assert!(
            said.contains("replication factor 3") && said.contains("--internal-replication-factor"),
            "the refusal does not name the factor and the flag\n{}",
            p.describe()
        );
    } else {
        let started = p.wait_line(Duration::from_secs(120), |l| l == "job started");
        assert!(started.is_some(), "{}", p.describe());
        p.stop_gracefully(STOP_TIMEOUT);
    }
    drop(broker);
    finish_dir(dir);
}
