//! The example job against a secured broker (the bundled one, or Apache Kafka with SCRAM users,
//! the StandardAuthorizer and ACLs): a SASL_SSL listener (TLS with a CA made
//! at test time by rcgen, SCRAM-SHA-512 user `alice`) with ACLs, next to a PLAINTEXT listener
//! whose anonymous principal is a super user, over which the harness produces the input and
//! reads the output.
//!
//! - Without an ACL for its transactional id prefix, the job stops at start, before any data
//!   flows, with one message naming the missing permission and the ACL that grants it, in
//!   both exactly-once modes (with DescribeAcls, and with probes when DescribeAcls is refused).
//! - With the ACLs, two-phase commit runs exactly-once through a crash between checkpoint
//!   completion and commit (the restart commits through onceflow's own client over SASL_SSL)
//!   and three SIGKILLs; the output is checked record by record.
//! - The job's debug-level logs never contain the configured password.

use std::path::{Path, PathBuf};
use std::time::Duration;

use onceflow_testkit::apache_kafka::{KafkaNode, KafkaOptions};
use onceflow_testkit::bins::bins;
use onceflow_testkit::checkpoints::highest_checkpoint_id;
use onceflow_testkit::clients::{create_topics, read_topic};
use onceflow_testkit::eos::*;
use onceflow_testkit::security::TestPki;
use onceflow_testkit::test_broker::{on_apache_kafka, transaction_version, TestBroker};

const USER: &str = "alice";
const REGISTRY_TOPIC: &str = "onceflow-prefix-registry";
/// What a restart logs when it commits a crashed checkpoint's pre-committed transaction.
const RECOVERY_COMMITTED: &str = "recovery committed a pre-committed transaction";
/// What the start-up check logs when it cannot read the ACLs and probes instead.
const PROBES: &str = "start-up permission check by probes";
/// What it logs when it passes; the line names the method (`describe-acls`).
const PASSED: &str = "start-up permission check passed";
/// Failpoint crashes before the scenario gives up on one whose checkpoint carried records.
const FAILPOINT_ATTEMPTS: usize = 6;
/// Distinctive, so that a grep of the logs cannot match anything else.
const PASSWORD: &str = "pw-7Hq2-alice-Zr9x";

/// CA, server certificate (localhost, 127.0.0.1) and key as PEM files in `dir`:
/// (ca, certificate, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let pki = TestPki::generate().expect("test certificates");
    let copy = |from: &Path, name: &str| {
        let to = dir.join(name);
        std::fs::copy(from, &to).expect("copy certificate");
        to
    };
    (
        copy(&pki.ca, "ca.pem"),
        copy(&pki.server_cert, "server.pem"),
        copy(&pki.server_key, "server.key"),
    )
}

/// The ACL bindings alice needs, but for the transactional ids unless `txn_ids`, and Describe
/// on the Cluster (DescribeAcls) only if `describe_cluster`.
fn acl_lines(args: &JobArgs, txn_ids: bool, describe_cluster: bool) -> Vec<String> {
    let p = format!("User:{USER}");
    let mut lines = vec![
        acl(&p, "Read", "Topic", &args.input, "literal"),
        acl(&p, "Write", "Topic", &args.output, "literal"),
        acl(&p, "Write", "Topic", &args.dlq(), "literal"),
        acl(&p, "Read", "Group", &args.group, "literal"),
        acl(&p, "Read", "Topic", REGISTRY_TOPIC, "literal"),
        acl(&p, "Read", "Group", "onceflow-prefix.", "prefixed"),
    ];
    if txn_ids {
        lines.push(acl(
            &p,
            "Write",
            "TransactionalId",
            &args.prefix,
            "prefixed",
        ));
    }
    if describe_cluster {
        lines.push(acl(&p, "Describe", "Cluster", "kafka-cluster", "literal"));
    }
    lines
}

/// One ALLOW line of the bundled broker's ACL file
/// (`principal host operation permission resource-type pattern name`).
fn acl(principal: &str, operation: &str, resource_type: &str, name: &str, pattern: &str) -> String {
    format!("{principal} * {operation} Allow {resource_type} {pattern} {name}")
}

/// A secured broker for `args` with the given ACL lines; returns it with the SASL_SSL
/// address, and writes the job's client properties file (returned as the third value).
fn secured_broker(dir: &Path, acls: &[String]) -> (TestBroker, String, PathBuf) {
    bins();
    let (ca, cert, key) = certificates(dir);
    if on_apache_kafka() {
        return secured_apache_kafka(dir, acls, &ca);
    }
    let users = dir.join("users.txt");
    std::fs::write(&users, format!("{USER}:plain:{PASSWORD}\n")).unwrap();
    let acl_file = dir.join("acls.txt");
    std::fs::write(&acl_file, acls.join("\n") + "\n").unwrap();
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let (cert_s, key_s, users_s, acl_s) = (path(&cert), path(&key), path(&users), path(&acl_file));
    let broker = scenario_broker(
        dir,
        &[
            "--listener",
            "SASL_SSL://127.0.0.1:0",
            "--ssl-certificate",
            &cert_s,
            "--ssl-key",
            &key_s,
            "--sasl-users",
            &users_s,
            "--acl-file",
            &acl_s,
            "--super-user",
            "User:ANONYMOUS",
        ],
    );
    let secured = broker
        .bundled()
        .expect("a bundled broker")
        .listener_addr("SASL_SSL")
        .expect("the broker reports its SASL_SSL listener")
        .to_string();
    (broker, secured, client_properties(dir, &ca))
}

/// [`secured_broker`] on Apache Kafka: SCRAM-SHA-512 user alice written at format time,
/// the StandardAuthorizer, the ACLs created over the PLAINTEXT harness listener.
fn secured_apache_kafka(dir: &Path, acls: &[String], ca: &Path) -> (TestBroker, String, PathBuf) {
    std::fs::write(
        dir.join("scram-users.txt"),
        format!("SCRAM-SHA-512 {USER} {PASSWORD}\n"),
    )
    .unwrap();
    let options = KafkaOptions {
        transaction_version: transaction_version(),
        sasl_ssl_tls_dir: Some(dir.to_path_buf()),
        ..KafkaOptions::default()
    };
    let node = KafkaNode::start(&dir.join("apache-kafka"), options)
        .unwrap_or_else(|e| panic!("start a secured Apache Kafka: {e:#}"));
    node.create_acls(acls).expect("create the ACLs");
    let secured = node.client_bootstrap().to_string();
    (
        TestBroker::ApacheKafka(node),
        secured,
        client_properties(dir, ca),
    )
}

/// The job's client properties file: SASL_SSL as alice, the test CA.
fn client_properties(dir: &Path, ca: &Path) -> PathBuf {
    let props = dir.join("client.properties");
    std::fs::write(
        &props,
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={USER}\nsasl.password={PASSWORD}\nssl.ca.location={}\n",
            ca.display()
        ),
    )
    .unwrap();
    props
}

fn secured_args(mode: &str, dir: &Path, secured: &str, props: &Path) -> JobArgs {
    let mut args = JobArgs::new(mode, dir);
    args.brokers = Some(secured.to_string());
    args.extra_args.push("--kafka-properties-file".into());
    args.extra_args.push(props.display().to_string());
    args.env.push(("RUST_LOG".into(), "debug".into()));
    args
}

/// Every log file under `dir` that contains `needle`.
fn logs_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    logs(dir)
        .into_iter()
        .filter(|(_, text)| text.contains(needle))
        .map(|(path, _)| path)
        .collect()
}

/// How many lines of the log files under `dir` contain every one of `needles`.
fn log_lines_with(dir: &Path, needles: &[&str]) -> usize {
    logs(dir)
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .count()
}

/// Every log file under `dir` with its text.
fn logs(dir: &Path) -> Vec<(PathBuf, String)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned();
            (p, text)
        })
        .collect()
}

/// The job without the transactional id ACL stops at start with the permission named.
fn refused_at_start(test: &str, mode: &str, describe_cluster: bool) {
    let _machine = exclusive();
    let dir = scenario_dir(test);
    let probe = JobArgs::new(mode, dir.path());
    let (broker, secured, props) =
        secured_broker(dir.path(), &acl_lines(&probe, false, describe_cluster));
    let args = secured_args(mode, dir.path(), &secured, &props);
    create_topics(
        broker.bootstrap(),
        &[&args.input, &args.output, &args.dlq()],
        PARTITIONS,
    );
    let mut job = spawn_job(broker.bootstrap(), &args, "refused");
    job.expect_failure(STOP_TIMEOUT, "the permission check refuses the start");
    let stderr = job.stderr_tail(usize::MAX);
    let named = format!("Write on TransactionalId prefix {}", args.prefix);
    let fix = format!(
        "--allow-principal User:{USER} --operation Write --transactional-id {} --resource-pattern-type prefixed",
        args.prefix
    );
    assert!(
        stderr.contains(&named) && stderr.contains(&fix),
        "the start-up error names neither {named:?} nor {fix:?}\n{}",
        job.describe()
    );
    assert!(
        stderr.contains(&format!("User:{USER} lacks 1 permission ")),
        "only the transactional ids are missing\n{stderr}"
    );
    assert!(
        !job.lines().iter().any(|l| l.contains("job started")),
        "the job started although it lacks a permission\n{}",
        job.describe()
    );
    assert!(
        read_topic(broker.bootstrap(), &args.output, false).is_empty(),
        "output was written before the check"
    );
    assert!(logs_containing(dir.path(), PASSWORD).is_empty());
    // with Describe on the cluster the check reads the ACLs; without it, it probes
    let probed = !logs_containing(dir.path(), PROBES).is_empty();
    assert_eq!(
        probed,
        !describe_cluster,
        "the check {} probes\n{stderr}",
        if probed { "used" } else { "did not use" }
    );
    finish_dir(dir);
}

#[test]
fn two_phase_commit_without_transactional_id_acl_is_refused_at_start() {
    refused_at_start(
        "two_phase_commit_without_transactional_id_acl_is_refused_at_start",
        "two-phase-commit",
        true,
    );
}

#[test]
fn transactional_offsets_without_transactional_id_acl_is_refused_at_start() {
    refused_at_start(
        "transactional_offsets_without_transactional_id_acl_is_refused_at_start",
        "transactional-offsets",
        true,
    );
}

#[test]
fn without_describe_acls_the_probes_find_the_missing_transactional_id_acl() {
    refused_at_start(
        "without_describe_acls_the_probes_find_the_missing_transactional_id_acl",
        "two-phase-commit",
        false,
    );
}

/// Two-phase commit over SASL_SSL with ACLs: a crash after checkpoint completion (the
/// restart commits the pre-committed transactions through onceflow's own client) and three
/// SIGKILLs, then the exact-output check; the debug logs hold no password.
#[test]
fn sasl_ssl_two_phase_commit_is_exactly_once_through_sigkills() {
    let test = "sasl_ssl_two_phase_commit_is_exactly_once_through_sigkills";
    let _machine = exclusive();
    let seed = seed(test);
    let dir = scenario_dir(test);
    let probe = JobArgs::new("two-phase-commit", dir.path());
    let (broker, secured, props) = secured_broker(dir.path(), &acl_lines(&probe, true, true));
    let bootstrap = broker.bootstrap().to_string();
    let mut args = secured_args("two-phase-commit", dir.path(), &secured, &props);
    args.checkpoint_interval_ms = 1000;
    // the job may Read the prefix registry's topic, not Create it
    create_topics(
        &bootstrap,
        &[&args.input, &args.output, &args.dlq(), REGISTRY_TOPIC],
        PARTITIONS,
    );
    let n = env_u64("ONCEFLOW_EOS_SECURITY_RECORDS", 20_000);
    let data = Dataset::generate(n, seed);
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        100,
        Duration::from_millis(200),
    );

    // A crash between checkpoint completion and commit; the restart must commit the crashed
    // checkpoint's pre-committed transactions over SASL_SSL. Whether that checkpoint carried
    // records depends on how the paced input and the checkpoints interleave, so the restart's
    // own log decides: if it committed nothing, the next attempt crashes at a later checkpoint
    // (each restart still recovers, which the final check covers).
    let mut recovered = false;
    for attempt in 1..=FAILPOINT_ATTEMPTS {
        let crash_at = highest_checkpoint_id(&args.checkpoint_dir) + 3;
        let mut crashing = args.clone();
        crashing.env.push((
            "ONCEFLOW_FAILPOINT".into(),
            format!("after-checkpoint-complete:{crash_at}"),
        ));
        let mut job = spawn_job(&bootstrap, &crashing, &format!("failpoint-{attempt}"));
        job.expect_failure(STOP_TIMEOUT, "the failpoint aborts the job");
        assert!(
            job.stderr_tail(30)
                .contains(&format!("failpoint after-checkpoint-complete:{crash_at}")),
            "the job died before the failpoint\n{}",
            job.describe()
        );
        let name = format!("after-failpoint-{attempt}");
        let mut job = spawn_job(&bootstrap, &args, &name);
        // the restore (and with it the recovery commit) precedes the first new checkpoint
        let complete = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "complete").is_some()
        });
        assert!(
            complete.is_some(),
            "the restart after failpoint {attempt} completed no checkpoint\n{}",
            job.describe()
        );
        let log = std::fs::read_to_string(dir.path().join(format!("job-{name}.stderr.log")))
            .unwrap_or_default();
        recovered = log.contains(RECOVERY_COMMITTED);
        assert!(
            job.kill9(),
            "the restart after failpoint {attempt} exited before the SIGKILL\n{}",
            job.describe()
        );
        if recovered {
            break;
        }
        eprintln!(
            "[eos] {test}: checkpoint {crash_at} carried no transaction to commit; crashing later"
        );
    }
    assert!(
        recovered,
        "test setup: in {FAILPOINT_ATTEMPTS} attempts no crashed checkpoint carried a \
         pre-committed transaction (the input never arrived between two barriers)"
    );

    for kill in 1..=3 {
        let mut job = spawn_job(&bootstrap, &args, &format!("kill-{kill}"));
        let started = job.wait_line(START_TIMEOUT, |l| l.contains("job started"));
        assert!(
            started.is_some(),
            "run {kill} did not start\n{}",
            job.describe()
        );
        let complete = job.wait_line(START_TIMEOUT, |l| {
            checkpoint_number(l, "complete").is_some()
        });
        assert!(
            complete.is_some(),
            "run {kill} completed no checkpoint\n{}",
            job.describe()
        );
        assert!(
            job.kill9(),
            "run {kill} exited before the SIGKILL\n{}",
            job.describe()
        );
    }
    producer.join().expect("input producer");
    finish_exact(
        test,
        "a failpoint crash and 3 SIGKILLs on SASL_SSL",
        &bootstrap,
        &args,
        &data,
        None,
        FINISH_TIMEOUT,
        3,
    );

    // the log is coloured, so the method is looked for on the line, not as `method="..."`
    let by_acls = log_lines_with(dir.path(), &[PASSED, "\"describe-acls\""]);
    assert!(
        by_acls > 0 && logs_containing(dir.path(), PROBES).is_empty(),
        "the start-up check did not verify every permission from the ACLs"
    );
    let leaked = logs_containing(dir.path(), PASSWORD);
    assert!(leaked.is_empty(), "the password is in {leaked:?}");
    let debug_lines = logs_containing(dir.path(), "DEBUG");
    assert!(
        !debug_lines.is_empty(),
        "the job logs were not at debug level"
    );
    finish_dir(dir);
}

/// A job that cannot reach the secured cluster stops with exit code 6 (cluster unreachable)
/// and one line naming the address and the cause, before any Kafka client is made.
fn unreachable_run(
    test: &str,
    brokers_of: impl Fn(&TestBroker, &str) -> String,
    props: impl Fn(&Path) -> PathBuf,
    cause: &str,
) {
    let _machine = exclusive();
    let dir = scenario_dir(test);
    let (broker, secured, good_props) = secured_broker(dir.path(), &[]);
    let brokers = brokers_of(&broker, &secured);
    let props = props(&good_props);
    let mut args = JobArgs::new("transactional-offsets", dir.path());
    args.brokers = Some(brokers.clone());
    args.extra_args = vec![
        "--kafka-properties-file".into(),
        props.display().to_string(),
        "--connect-timeout-ms".into(),
        "3000".into(),
    ];
    let mut job = spawn_job(&brokers, &args, "unreachable");
    let status = job.wait_exit(Duration::from_secs(8));
    assert!(
        status.is_some(),
        "the job still runs 5 s past its connect timeout\n{}",
        job.describe()
    );
    assert_eq!(status.unwrap().code(), Some(6), "{}", job.describe());
    let stderr = job.stderr_tail(50);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    assert!(
        last.contains("cluster unreachable") && last.contains(&brokers) && last.contains(cause),
        "the last line does not name {brokers} and `{cause}`: {last}\n{}",
        job.describe()
    );
    assert!(!stderr.contains("librdkafka"), "{}", job.describe());
    drop(broker);
    finish_dir(dir);
}

#[test]
fn a_wrong_sasl_password_stops_the_job_naming_the_cause() {
    unreachable_run(
        "a_wrong_sasl_password_stops_the_job_naming_the_cause",
        |_, secured| secured.to_string(),
        |good| {
            let wrong = good.with_file_name("wrong-password.properties");
            let text = std::fs::read_to_string(good).expect("client properties");
            let text = text.replace(
                &format!("sasl.password={PASSWORD}"),
                "sasl.password=not-the-password",
            );
            std::fs::write(&wrong, text).expect("write properties");
            wrong
        },
        "SASL authentication failed",
    );
}

#[test]
fn tls_to_a_plaintext_port_stops_the_job_naming_the_cause() {
    unreachable_run(
        "tls_to_a_plaintext_port_stops_the_job_naming_the_cause",
        |broker, _| broker.bootstrap().to_string(),
        |good| good.to_path_buf(),
        "TLS handshake failed",
    );
}
