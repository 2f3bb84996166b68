//! Scaled-out instances of the example job (`--instance-id`, transactional-offsets mode):
//! three instances share an input partitioned by the key while instances are SIGKILLed and
//! new ones start, each change made on an event an instance reported; afterwards a
//! read_committed consumer must see every id exactly once and every key's last total equal
//! to the sum of its inputs. The keyed totals move between instances through the changelog:
//! an instance never restores from another's checkpoint directory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use onceflow_testkit::child::Proc;
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
    let (broker, data) = setup(dir.path(), &base, 30_000, seed(test));
    let data = data.partitioned_by_key();
    let bootstrap = broker.bootstrap().to_string();
    let mut rng = StdRng::seed_from_u64(seed(test));

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
            // on an event it reports: its next commit (or its start, if it owns nothing)
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
    drop(broker);
    finish_dir(dir);
}
