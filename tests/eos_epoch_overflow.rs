//! Producer-epoch exhaustion in two-phase commit. Every InitProducerId of a transactional id
//! bumps its epoch; once the epoch is exhausted (Kafka's rule: at `i16::MAX - 1`) the
//! coordinator moves the id to a new producer id at epoch 0. A job's ids see an
//! InitProducerId at every start (the recovery fences them, a fresh producer initializes),
//! so a long-lived job crosses that line, and a pre-committed transaction recorded before it
//! must still be committed by the recovery after it, under the recorded producer id and
//! epoch, and the next ones under the new id.
//!
//! The test raises the epochs of the job's transactional ids close to the top the way any
//! client does (InitProducerId on the ids, thousands of times, before the job starts), then
//! kills the job with kill -9 at random points after reported checkpoints while input
//! arrives, so that the ids are exhausted and moved during the kill sequence. The output is
//! checked record by record, and every raised id must have moved to a new producer id.

use std::time::Duration;

use onceflow_testkit::eos::*;
use onceflow_testkit::raw::{describe_transaction, raise_epoch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where the raised epochs start: each run of the job bumps an id's epoch once or twice, so
/// the ids are exhausted after about three runs of [`KILLS`].
const START_EPOCH: i16 = i16::MAX - 7;

/// kill -9s of the job.
const KILLS: usize = 8;

pub(crate) fn epoch_overflow_run(test: &str) {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    // one sink subtask: its ring of three ids and the seal's id are all raised
    args.parallelism = 1;
    let n = env_u64("ONCEFLOW_EOS_EPOCH_RECORDS", 20_000);
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();

    let ids: Vec<String> = (0..3)
        .map(|slot| format!("{}-0-{slot}", args.prefix))
        .chain([format!("{}-checkpoints", args.prefix)])
        .collect();
    let raised: Vec<(String, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = ids
            .iter()
            .map(|id| {
                let bootstrap = &bootstrap;
                s.spawn(move || {
                    let (pid, epoch) = raise_epoch(bootstrap, id, START_EPOCH)
                        .unwrap_or_else(|e| panic!("raising the epoch of {id}: {e:#}"));
                    eprintln!("[eos] {test}: {id} at producer id {pid}, epoch {epoch}");
                    (id.clone(), pid)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("raise thread"))
            .collect()
    });

    let mut rng = StdRng::seed_from_u64(seed);
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        40,
        Duration::from_millis(300),
    );
    for run in 1..=KILLS {
        let mut job = spawn_job(&bootstrap, &args, &format!("{run}"));
        let line = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "complete").is_some()
        });
        assert!(
            line.is_some(),
            "run {run}: no checkpoint completed within {START_TIMEOUT:?} (status {:?})\n{}",
            job.try_status(),
            job.describe()
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        assert!(
            job.kill9(),
            "run {run}: the job exited by itself before the SIGKILL ({:?})\n{}",
            job.try_status(),
            job.describe()
        );
        eprintln!(
            "[eos] {test}: kill {run}, last committed {:?}",
            last_committed(&job.lines())
        );
    }
    producer.join().expect("input producer");
    // the recoveries committed transactions recorded both before and after an id moved
    let mut recovered = (0, 0);
    for run in 2..=KILLS {
        let log = std::fs::read_to_string(args.log_dir.join(format!("job-{run}.stderr.log")))
            .unwrap_or_default();
        for line in log
            .lines()
            .filter(|l| l.contains("recovery committed a pre-committed transaction"))
        {
            let field = |name: &str| -> Option<i64> {
                let rest = line.split(&format!(" {name}=")).nth(1)?;
                rest.split(' ').next()?.parse().ok()
            };
            let (Some(pid), Some(epoch)) = (field("producer_id"), field("epoch")) else {
                continue;
            };
            if raised.iter().any(|(_, p)| *p == pid) && epoch >= START_EPOCH as i64 {
                recovered.0 += 1;
            } else {
                recovered.1 += 1;
            }
        }
    }
    eprintln!(
        "[eos] {test}: recovery commits: {} under a raised producer id near the top of its epochs, {} under a moved one",
        recovered.0, recovered.1
    );
    assert!(
        recovered.0 > 0 && recovered.1 > 0,
        "the kills did not make the recovery commit transactions on both sides of an epoch exhaustion: {recovered:?}"
    );
    finish_exact(
        test,
        &format!("{KILLS} job kill -9s across producer-epoch exhaustion"),
        &bootstrap,
        &args,
        &data,
        None,
        FINISH_TIMEOUT,
        0,
    );
    for (id, before) in &raised {
        let (pid, epoch, state) = describe_transaction(&bootstrap, id)
            .unwrap_or_else(|e| panic!("describing {id}: {e:#}"));
        eprintln!("[eos] {test}: {id} now at producer id {pid}, epoch {epoch} ({state})");
        assert_ne!(
            pid, *before,
            "{id} was never moved to a new producer id (epoch {epoch}): the runs did not exhaust its epoch, so the test did not cross the overflow"
        );
    }
    drop(broker);
    finish_dir(dir);
}

#[test]
fn two_phase_commit_recovers_across_producer_epoch_exhaustion() {
    epoch_overflow_run("eos_epoch_overflow_2pc");
}
