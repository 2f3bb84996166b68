//! The broker is killed with -9 and restarted on the same data dir and port under a running
//! job (twice, with a kill -9 of the job in between); the job must ride through each broker
//! restart without exiting, and the output stays exactly-once. Its probes follow: `/readyz`
//! turns unready while the broker is away (no checkpoint completes) and ready again once a
//! checkpoint completed after the restart; `/healthz` answers throughout.
//!
//! And network drops: every client talks to the broker through a TCP proxy (the broker
//! advertises it) that cuts all connections, or partitions the network for up to 3 s, six
//! times, each at a random delay after the job committed a checkpoint since the previous one.
//! Same outcome required.
//!
//! And a stall longer than the transaction timeout: the job is frozen (SIGSTOP) while the
//! broker aborts its open transactions, then resumes. It must notice (a refused seal, or a
//! fenced producer) and fail without losing anything, or, if it held no broker-side
//! transaction, go on; restarted by the test from the last sealed checkpoint, the output is
//! exact.

use std::time::{Duration, Instant};

use onceflow_testkit::bins::*;
use onceflow_testkit::checkpoints::*;
use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;
use onceflow_testkit::http;
use onceflow_testkit::proxy::Proxy;
use onceflow_testkit::test_broker::TestBroker;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Broker kills per run.
const BROKER_KILLS: usize = 2;

/// The job rides through broker restarts: the broker is killed with -9 and restarted on the
/// same data and port [`BROKER_KILLS`] times at random moments while input arrives, and between
/// two broker restarts the job itself is killed with -9 once (at a random moment after it came
/// through the restart) and restarted from its checkpoint. The job must not exit across any
/// broker restart: it waits for the coordinators (docs/JOBS.md, "When the cluster is away")
/// and commits a later checkpoint. The output is checked record by record.
fn broker_kill_run(test: &str, mode: &str) {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let mut args = JobArgs::new(mode, dir.path());
    let probes = http::free_port();
    args.extra_args = vec![
        "--metrics-listen".into(),
        format!("127.0.0.1:{probes}"),
        "--ready-checkpoint-age-ms".into(),
        READY_BOUND_MS.to_string(),
    ];
    let n = env_u64("ONCEFLOW_EOS_BROKER_KILL_RECORDS", 40_000);
    let (mut broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    let mut rng = StdRng::seed_from_u64(seed);
    // Input keeps arriving through the broker kills (the idempotent input producer retries
    // across them), so the job is busy whenever the broker dies.
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        60,
        Duration::from_millis(250),
    );

    let mut runs = 1;
    let mut job = spawn_job(&bootstrap, &args, "1");
    let committed_after = |job: &mut Proc, broker: &TestBroker, before: Option<u64>, what: &str| {
        let line = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "committed").is_some_and(|n| Some(n) > before)
        });
        assert!(
            line.is_some(),
            "{what}: the job committed no checkpoint after {before:?} within {START_TIMEOUT:?} \
             (exit status {:?}; a job must ride through a broker restart, not exit)\n{}\n{}",
            job.try_status(),
            job.describe(),
            broker.describe()
        );
    };
    committed_after(&mut job, &broker, None, "start");
    let mut restores = 0;
    for k in 1..=BROKER_KILLS {
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
        let before = last_committed(&job.lines());
        kill9_broker(&mut broker);
        // the broker stays away until the job says it is not ready (no checkpoint can
        // complete without it), and a little longer
        wait_probe(&mut job, probes, "/readyz", 503, "while the broker is away");
        assert_eq!(
            http::get(probes, "/healthz").0,
            200,
            "/healthz while the broker is away"
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        broker.restart_same_port().expect("broker restarts");
        assert_eq!(
            broker.bootstrap(),
            bootstrap,
            "restarted on another address"
        );
        committed_after(&mut job, &broker, before, &format!("broker restart {k}"));
        wait_probe(
            &mut job,
            probes,
            "/readyz",
            200,
            "after the broker came back",
        );
        eprintln!(
            "[eos] {test}: broker restart {k}: the job rode through (committed {:?})",
            last_committed(&job.lines())
        );
        if k < BROKER_KILLS {
            // a job kill -9 between two broker restarts: the next run restores the checkpoint
            std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
            assert!(
                job.kill9(),
                "the job exited before its kill -9\n{}",
                job.describe()
            );
            runs += 1;
            restores += 1;
            job = spawn_job(&bootstrap, &args, &format!("{runs}"));
            committed_after(&mut job, &broker, None, &format!("restore {restores}"));
        }
    }
    producer.join().expect("input producer");
    finish_exact(
        test,
        &format!(
            "{BROKER_KILLS} broker kill -9 restarts (0 job exits), {restores} job kill -9 restores"
        ),
        &bootstrap,
        &args,
        &data,
        Some(job),
        FINISH_TIMEOUT,
        0,
    );
    drop(broker);
    finish_dir(dir);
}

/// `/readyz` turns unready once the last checkpoint is older than this.
const READY_BOUND_MS: u64 = 2_000;

/// Polls `path` on the job's listener until it answers `status`; fails once the job exits or
/// after [`START_TIMEOUT`] (a bound against a probe that never changes, not a verdict by time).
fn wait_probe(job: &mut Proc, port: u16, path: &str, status: u16, when: &str) {
    let polling = Instant::now();
    loop {
        let answer = http::try_get(port, path);
        if let Ok((code, _)) = &answer {
            if *code == status {
                return;
            }
        }
        assert!(
            polling.elapsed() < START_TIMEOUT && job.try_status().is_none(),
            "{path} did not answer {status} {when} within {START_TIMEOUT:?}; last answer {answer:?} (job status {:?})\n{}",
            job.try_status(),
            job.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_phase_commit_job_survives_broker_kill9() {
    broker_kill_run("eos_broker_kill_2pc", "two-phase-commit");
}

#[test]
fn transactional_offsets_job_survives_broker_kill9() {
    broker_kill_run("eos_broker_kill_txn_offsets", "transactional-offsets");
}

/// Network drops per run.
const NETWORK_DROPS: usize = 6;

fn network_drop_run(test: &str, mode: &str) {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let args = JobArgs::new(mode, dir.path());
    let n = env_u64("ONCEFLOW_EOS_NETWORK_RECORDS", 30_000);
    // the broker advertises the proxy, so it must forward before any client connects
    let mut proxy = Proxy::bind();
    bins();
    let broker = scenario_broker(dir.path(), &["--advertised-listener", &proxy.addr()]);
    proxy.start(broker.bootstrap());
    let bootstrap = proxy.addr();
    create_topics(
        &bootstrap,
        &[&args.input, &args.output, &args.dlq()],
        PARTITIONS,
    );
    let data = Dataset::generate(n, seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        50,
        Duration::from_millis(250),
    );
    let mut job = spawn_job(&bootstrap, &args, "1");
    let line = job.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some()
    });
    assert!(
        line.is_some(),
        "the job did not commit a checkpoint within {START_TIMEOUT:?}\n{}",
        job.describe()
    );
    let mut job_exits = 0;
    // Each drop comes after the job came through the previous one: it committed a checkpoint
    // since, or it exited and its restart committed one (or exited too, then the next drop's
    // check restarts it).
    for k in 1..=NETWORK_DROPS {
        std::thread::sleep(Duration::from_millis(rng.random_range(300..2000)));
        let (what, cut) = if rng.random_bool(0.5) {
            ("cut", proxy.cut())
        } else {
            let d = Duration::from_millis(rng.random_range(500..3000));
            ("partition", proxy.partition(d))
        };
        eprintln!("[eos] {test}: drop {k}: {what} of {cut} connections");
        let before = last_committed(&job.lines());
        let deadline = Instant::now() + START_TIMEOUT;
        while job.try_status().is_none() && last_committed(&job.lines()) <= before {
            assert!(
                Instant::now() < deadline,
                "drop {k}: the job neither committed a checkpoint nor exited within \
                 {START_TIMEOUT:?} after the network came back (last committed {before:?})\n{}",
                job.describe()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(status) = job.try_status() {
            job_exits += 1;
            eprintln!(
                "[eos] {test}: drop {k}: the job exited ({status}); restarting it\n{}",
                job.describe()
            );
            job = spawn_job(&bootstrap, &args, &format!("{}", job_exits + 1));
            job.wait_line(START_TIMEOUT, |l| {
                checkpoint_number(l, "committed").is_some()
            });
        }
    }
    producer.join().expect("input producer");
    finish_exact(
        test,
        &format!("{NETWORK_DROPS} network drops (the job exited {job_exits} times during them)"),
        &bootstrap,
        &args,
        &data,
        Some(job),
        FINISH_TIMEOUT,
        3,
    );
    drop(broker);
    drop(proxy);
    finish_dir(dir);
}

#[test]
fn two_phase_commit_job_survives_network_drops() {
    network_drop_run("eos_network_2pc", "two-phase-commit");
}

#[test]
fn transactional_offsets_job_survives_network_drops() {
    network_drop_run("eos_network_txn_offsets", "transactional-offsets");
}

/// Attempts at landing the stall outside a seal-to-commit window before giving up.
const STALL_LANDINGS: usize = 50;

/// Restarts allowed in the stall scenario: a heavily loaded machine can make the job refuse a
/// seal by itself now and then (a checkpoint slower than the transaction timeout allows),
/// which is correct.
const STALL_RESTARTS: usize = 5;

/// Transaction timeout of the stall scenario.
const STALL_TXN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the job is frozen: well past [`STALL_TXN_TIMEOUT`].
const STALL: Duration = Duration::from_secs(16);

/// Stalls the job beyond the transaction timeout. The stall must not land between a
/// checkpoint's seal and its sinks' commits: a checkpoint sealed before the stall whose
/// transactions then time out is lost whatever the job does (Kafka aborts them; no job can
/// commit them afterwards), so a stall landing there says nothing about the job. The test
/// therefore stops the job (SIGSTOP) and looks: if its newest durable checkpoint is the last
/// one it reported committed, nothing is being sealed or committed, and the stall goes on for
/// [`STALL`]; otherwise it resumes at once and tries after the next commit.
fn stall_run(test: &str, mode: &str) {
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let mut args = JobArgs::new(mode, dir.path());
    // long enough that a loaded machine does not make the job refuse seals by itself, short
    // enough for a stall well past it
    args.transaction_timeout_ms = Some(STALL_TXN_TIMEOUT.as_millis() as u64);
    args.extra_args = vec!["--recovery-allowance-ms".into(), "1000".into()];
    let n = env_u64("ONCEFLOW_EOS_STALL_RECORDS", 20_000);
    let (broker, data) = setup(dir.path(), &args, n, seed);
    let bootstrap = broker.bootstrap().to_string();
    let mut rng = StdRng::seed_from_u64(seed);
    // half the input before the stall, the rest arriving while the job freezes, so that it
    // holds an open transaction with records in it when it stops
    let half = data.records.len() / 2;
    let (first, second) = (data.part(0..half), data.part(half..data.records.len()));
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &first,
        10,
        Duration::from_millis(100),
    );
    let mut runs = 1;
    let mut job = spawn_job(&bootstrap, &args, "1");
    // a job that exits by itself before the stall (a seal refused on a loaded machine) is
    // restarted like after the stall: it must not have lost anything either
    let restart_if_exited = |job: &mut Proc, runs: &mut usize| {
        if let Some(status) = job.try_status() {
            assert!(
                *runs <= STALL_RESTARTS,
                "the job exited {runs} times before the stall\n{}",
                job.describe()
            );
            eprintln!("[eos] {test}: the job exited before the stall ({status}); restarting it");
            *runs += 1;
            *job = spawn_job(&bootstrap, &args, &format!("{runs}"));
        }
    };
    loop {
        let line = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
        });
        if line.is_some() {
            break;
        }
        assert!(
            job.try_status().is_some(),
            "the job did not commit checkpoint 2 within {START_TIMEOUT:?}\n{}",
            job.describe()
        );
        restart_if_exited(&mut job, &mut runs);
    }
    producer.join().expect("input producer");
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &second,
        200,
        Duration::from_millis(40),
    );
    let mut landings = 0;
    let frozen_at = loop {
        landings += 1;
        assert!(
            landings <= STALL_LANDINGS,
            "no stall landed outside a seal-to-commit window in {STALL_LANDINGS} attempts\n{}",
            job.describe()
        );
        let before = last_committed(&job.lines());
        let line = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "committed").is_some_and(|n| Some(n) > before)
        });
        if line.is_none() {
            assert!(
                job.try_status().is_some(),
                "the job committed nothing for {START_TIMEOUT:?}\n{}",
                job.describe()
            );
            restart_if_exited(&mut job, &mut runs);
            continue;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        if !job.suspend() {
            restart_if_exited(&mut job, &mut runs);
            continue;
        }
        let committed = last_committed(&job.lines()).unwrap_or(0);
        let durable = latest_complete(&args.checkpoint_dir).unwrap_or(0);
        if durable <= committed {
            break committed;
        }
        job.resume();
    };
    let frozen = runs;
    eprintln!(
        "[eos] {test}: stalling run {frozen} after checkpoint {frozen_at} committed (landing \
         attempt {landings})"
    );
    // the broker aborts within 100 ms of the timeout: this is well past it
    std::thread::sleep(STALL);
    job.resume();
    // It fails at its next seal or commit, or (if it held no broker-side transaction) goes on
    // committing; anything else is the stuck job this scenario was written against.
    let since = std::time::Instant::now();
    loop {
        if let Some(status) = job.try_status() {
            eprintln!("[eos] {test}: the frozen job failed by itself after it resumed ({status})");
            assert!(
                !status.success(),
                "the job exited with success after the stall\n{}",
                job.describe()
            );
            runs += 1;
            job = spawn_job(&bootstrap, &args, &format!("{runs}"));
            break;
        }
        if last_committed(&job.lines()) > Some(frozen_at) {
            // nothing it held had started a broker-side transaction when it froze: a valid
            // outcome, the output check below still applies
            eprintln!("[eos] {test}: the job kept running after the stall");
            break;
        }
        assert!(
            since.elapsed() < START_TIMEOUT,
            "after the stall the job neither failed nor committed a checkpoint within \
             {START_TIMEOUT:?}\n{}",
            job.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    producer.join().expect("input producer");
    finish_exact(
        test,
        "the stall",
        &bootstrap,
        &args,
        &data,
        Some(job),
        FINISH_TIMEOUT,
        STALL_RESTARTS,
    );
    // whenever a job of this scenario failed (before, after or long after the stall), it must
    // not have lost committed-checkpoint output
    for entry in std::fs::read_dir(&args.log_dir)
        .expect("scenario dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("job-") && name.ends_with(".stderr.log")) {
            continue;
        }
        let said = std::fs::read_to_string(entry.path()).unwrap_or_default();
        assert!(
            !said.contains("DATA LOSS"),
            "{name} (the stalled run was {frozen}) lost committed-checkpoint output:\n{}",
            tail(&said, 40)
        );
    }
    drop(broker);
    finish_dir(dir);
}

#[test]
fn two_phase_commit_job_survives_a_stall_beyond_the_transaction_timeout() {
    stall_run("eos_stall_2pc", "two-phase-commit");
}

#[test]
fn transactional_offsets_job_survives_a_stall_beyond_the_transaction_timeout() {
    stall_run("eos_stall_txn_offsets", "transactional-offsets");
}
