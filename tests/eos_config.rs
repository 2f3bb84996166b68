//! The start-up safety checks: a transaction timeout that does not
//! exceed the checkpoint interval (plus the recovery allowance), or that exceeds the broker's
//! maximum, is refused at start with exit code 2 and a message that says what to change;
//! a valid configuration starts (so the check does not refuse everything). Kafka client
//! properties (`--kafka-property`, `--kafka-properties-file`) reach the job's clients, secret
//! values never appear in its output, and two-phase-commit mode is refused on a secured
//! cluster, whose recovery client it cannot reach.

use std::time::Duration;

use onceflow_testkit::bins::*;
use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;
use onceflow_testkit::http;
use onceflow_testkit::test_broker::TestBroker;

/// Runs the job with `interval_ms` / `timeout_ms` against a fresh broker started with
/// `broker_flags`; returns the process after it exited (or after `job started`).
fn run(
    test: &str,
    broker_flags: &[&str],
    interval_ms: u64,
    timeout_ms: u64,
) -> (Proc, TestBroker, ScenarioDir) {
    let dir = scenario_dir(test);
    bins();
    let broker = scenario_broker(dir.path(), broker_flags);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    create_topics(
        broker.bootstrap(),
        &[&args.input, &args.output, &args.dlq()],
        PARTITIONS,
    );
    args.checkpoint_interval_ms = interval_ms;
    args.transaction_timeout_ms = Some(timeout_ms);
    let mut job = spawn_job(broker.bootstrap(), &args, "config");
    job.wait_line(START_TIMEOUT, |l| l.contains("job started"));
    (job, broker, dir)
}

fn assert_refused(job: &mut Proc, must_mention: &[&[&str]]) {
    let status = job.wait_exit(STOP_TIMEOUT);
    assert!(
        status.is_some(),
        "the job did not refuse the configuration (still running)\n{}",
        job.describe()
    );
    assert_eq!(
        status.unwrap().code(),
        Some(2),
        "exit code of a refused configuration\n{}",
        job.describe()
    );
    assert!(
        !job.lines().iter().any(|l| l.contains("job started")),
        "the job started before refusing\n{}",
        job.describe()
    );
    let stderr = job.stderr_tail(200).to_lowercase();
    for alternatives in must_mention {
        assert!(
            alternatives.iter().any(|a| stderr.contains(a)),
            "the refusal does not mention any of {alternatives:?}\n{}",
            job.describe()
        );
    }
}

/// Mentions of the knob to change.
const TIMEOUT_KNOB: &[&str] = &["transaction-timeout-ms", "transaction.timeout.ms"];
const INTERVAL_KNOB: &[&str] = &["checkpoint-interval-ms", "checkpoint interval"];

#[test]
fn transaction_timeout_below_checkpoint_interval_is_refused() {
    let (mut job, _broker, _dir) = run("eos_config_below", &[], 10_000, 5_000);
    assert_refused(&mut job, &[TIMEOUT_KNOB, INTERVAL_KNOB]);
}

#[test]
fn transaction_timeout_equal_to_checkpoint_interval_is_refused() {
    let (mut job, _broker, _dir) = run("eos_config_equal", &[], 10_000, 10_000);
    assert_refused(&mut job, &[TIMEOUT_KNOB, INTERVAL_KNOB]);
}

#[test]
fn transaction_timeout_above_broker_maximum_is_refused() {
    let (mut job, _broker, _dir) = run(
        "eos_config_above_max",
        &["--max-transaction-timeout-ms", "60000"],
        1_000,
        120_000,
    );
    assert_refused(&mut job, &[TIMEOUT_KNOB, &["max"]]);
}

#[test]
fn valid_transaction_timeout_starts() {
    let (mut job, _broker, _dir) = run("eos_config_valid", &[], 1_000, 60_000);
    assert!(
        job.lines().iter().any(|l| l.contains("job started")),
        "a valid configuration (interval 1000 ms, timeout 60000 ms) did not start (status {:?})\n{}",
        job.try_status(),
        job.describe()
    );
    job.stop_gracefully(STOP_TIMEOUT);
}

/// The job's Prometheus endpoint (`--metrics-listen`) serves the Kafka
/// transaction metrics (commit latency, open transaction age vs timeout, records per
/// transaction, fencing events), consumer lag and the runtime's checkpoint metrics.
#[test]
fn metrics_endpoint_serves_transaction_lag_and_checkpoint_metrics() {
    let _machine = exclusive();
    let test = "eos_metrics";
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 3_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    let port = http::free_port();
    args.extra_args = vec!["--metrics-listen".into(), format!("127.0.0.1:{port}")];
    let producer = produce_paced(
        &bootstrap,
        &args.input,
        &data,
        10,
        Duration::from_millis(100),
    );
    let mut job = spawn_job(&bootstrap, &args, "metrics");
    let line = job.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 4)
    });
    assert!(
        line.is_some(),
        "no checkpoint 4 committed\n{}",
        job.describe()
    );
    producer.join().expect("input producer");
    // the probes and the router: ready once started, 404 elsewhere
    assert_eq!(http::get(port, "/healthz"), (200, "ok\n".to_string()));
    let (status, why) = http::get(port, "/readyz");
    assert_eq!(status, 200, "/readyz of a running job: {why}");
    assert!(why.starts_with("ready: "), "{why}");
    assert_eq!(http::get(port, "/no-such-path").0, 404);
    // the status: the job's configuration, state, records and checkpoints as JSON
    let status: serde_json::Value =
        serde_json::from_str(&http_get(port, "/status")).expect("/status is JSON");
    assert_eq!(status["job"]["name"], "etl", "{status}");
    assert_eq!(status["job"]["mode"], "two-phase-commit", "{status}");
    assert_eq!(status["job"]["input"], args.input.as_str(), "{status}");
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["ready"], true, "{status}");
    assert!(
        status["checkpoints"]["completed"].as_u64() >= Some(4)
            && status["checkpoints"]["last"]["id"].as_u64() >= Some(4)
            && status["records_processed"].as_u64() > Some(0),
        "{status}"
    );
    // `onceflow status` reads the same endpoint: --json as it is, text for a human
    let url = format!("http://127.0.0.1:{port}");
    let tool = |extra: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .args(["status", "--url", &url])
            .args(extra)
            .output()
            .expect("run onceflow status");
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let json: serde_json::Value =
        serde_json::from_str(&tool(&["--json"])).expect("onceflow status --json");
    assert_eq!(json["job"], status["job"], "{json}");
    let text = tool(&[]);
    assert!(
        text.contains("job etl (two-phase-commit)") && text.contains("state: running"),
        "{text}"
    );
    // Gauges such as the consumer lag are set by the job's own loops (the lag at most once a
    // second, once the partition ends are known): poll until every series is there, bounded
    // only against a job that never reports them.
    let polling = std::time::Instant::now();
    loop {
        let body = http_get(port, "/metrics");
        let missing: Vec<&str> = METRICS
            .iter()
            .copied()
            .filter(|name| !body.lines().any(|l| l.starts_with(name)))
            .collect();
        // one lag series per input partition, none negative
        let lag: Vec<f64> = body
            .lines()
            .filter(|l| l.starts_with("onceflow_kafka_consumer_lag{") && l.contains("eos-input"))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
            .collect();
        assert!(
            lag.iter().all(|v| *v >= 0.0),
            "negative consumer lag: {lag:?}\n{body}"
        );
        if missing.is_empty() && lag.len() >= 4 {
            assert_exposition_conventions(&body);
            break;
        }
        assert!(
            polling.elapsed() < START_TIMEOUT && job.try_status().is_none(),
            "after {:?} the metrics endpoint still lacks {missing:?}; consumer lag series of \
             the 4 input partitions: {lag:?} (job status {:?})\n{body}",
            polling.elapsed(),
            job.try_status()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    job.stop_gracefully(STOP_TIMEOUT);
    drop(broker);
    finish_dir(dir);
}

/// Every metric has `# HELP` and `# TYPE`; durations are histograms (buckets, not the
/// quantiles of a summary, so the instances of a scaled-out job aggregate); names are in base
/// units under one `onceflow_` scheme.
fn assert_exposition_conventions(body: &str) {
    let typed: Vec<(&str, &str)> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(!typed.is_empty(), "no # TYPE lines\n{body}");
    for (name, kind) in &typed {
        assert!(
            body.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "{name} has no # HELP\n{body}"
        );
        assert!(
            name.starts_with("onceflow_"),
            "{name}: not in the onceflow_ scheme"
        );
        assert_ne!(
            *kind, "summary",
            "{name} is a summary: durations must be histograms"
        );
        if DURATIONS.contains(name) {
            assert_eq!(*kind, "histogram", "{name}");
        }
        assert!(!name.contains("micro"), "{name}: not in base units");
    }
    assert!(
        body.contains("onceflow_kafka_txn_commit_seconds_bucket{"),
        "no commit latency buckets\n{body}"
    );
    assert!(!body.contains("quantile=\""), "quantiles served\n{body}");
}

/// Durations that must be histograms.
const DURATIONS: &[&str] = &[
    "onceflow_checkpoint_duration_seconds",
    "onceflow_alignment_seconds",
    "onceflow_kafka_txn_commit_seconds",
    "onceflow_kafka_output_latency_seconds",
];

/// Series the metrics endpoint must serve.
const METRICS: &[&str] = &[
    "onceflow_kafka_txn_commit_seconds",
    "onceflow_kafka_txn_open_age_seconds",
    "onceflow_kafka_txn_timeout_seconds",
    "onceflow_kafka_records_per_txn",
    "onceflow_kafka_fencing_events_total",
    "onceflow_kafka_consumer_lag",
    "onceflow_checkpoint_duration_seconds",
    "onceflow_checkpoint_seal_seconds",
    "onceflow_alignment_seconds",
    "onceflow_records_in_total",
    "onceflow_records_out_total",
    "onceflow_kafka_output_latency_seconds",
    "onceflow_last_checkpoint_completed_timestamp_seconds",
    "onceflow_busy_seconds",
];

/// The body of a GET that must answer 200.
fn http_get(port: u16, path: &str) -> String {
    let (status, body) = http::get(port, path);
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// Bad input: the group's offsets name a checkpoint the checkpoint directory does not hold
/// (the directory was deleted). The job must not start from scratch (that would duplicate
/// committed output); it exits with code 2 and says what to do.
#[test]
fn group_offsets_without_their_checkpoint_are_refused() {
    let _machine = exclusive();
    let test = "eos_config_missing_checkpoint";
    let dir = scenario_dir(test);
    let args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 2_000, seed(test));
    let bootstrap = broker.bootstrap().to_string();
    produce_paced(&bootstrap, &args.input, &data, 1, Duration::ZERO)
        .join()
        .expect("input producer");
    let mut job = spawn_job(&bootstrap, &args, "first");
    let line = job.wait_line(START_TIMEOUT, |l| {
        checkpoint_number(l, "committed").is_some_and(|n| n >= 2)
    });
    assert!(
        line.is_some(),
        "no checkpoint 2 committed\n{}",
        job.describe()
    );
    job.stop_gracefully(STOP_TIMEOUT);

    std::fs::remove_dir_all(&args.checkpoint_dir).expect("delete the checkpoint directory");
    let mut again = spawn_job(&bootstrap, &args, "without-checkpoints");
    assert_refused(
        &mut again,
        &[&["holds no complete checkpoint"], &["--group"]],
    );
    drop(broker);
    finish_dir(dir);
}

/// Reads the whole stderr log of a job (not only the tail).
fn all_output(job: &Proc) -> String {
    format!(
        "{}\n{}",
        job.lines().join("\n"),
        job.stderr_tail(usize::MAX)
    )
}

/// Two-phase-commit recovery uses onceflow's own client, which speaks PLAIN and SCRAM but
/// not GSSAPI: the mode is refused at start with the reason and the way out.
#[test]
fn two_phase_commit_with_a_sasl_mechanism_recovery_cannot_speak_is_refused() {
    let dir = scenario_dir("eos_config_secured_2pc");
    bins();
    let broker = scenario_broker(dir.path(), &[]);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    args.extra_args = vec![
        "--kafka-property".into(),
        "security.protocol=SASL_SSL".into(),
        "--kafka-property".into(),
        "sasl.mechanism=GSSAPI".into(),
    ];
    let mut job = spawn_job(broker.bootstrap(), &args, "secured");
    assert_refused(&mut job, &[&["transactional-offsets"], &["gssapi"]]);
}

#[test]
fn an_unknown_kafka_property_is_refused_by_name() {
    let dir = scenario_dir("eos_config_unknown_property");
    let mut args = JobArgs::new("transactional-offsets", dir.path());
    let (broker, _data) = setup(dir.path(), &args, 10, seed("eos_config_unknown_property"));
    args.extra_args = vec![
        "--kafka-property".into(),
        "no.such.librdkafka.property=1".into(),
    ];
    let mut job = spawn_job(broker.bootstrap(), &args, "unknown-property");
    let status = job.wait_exit(STOP_TIMEOUT);
    assert!(
        status.is_some_and(|s| !s.success()),
        "a job with an unknown client property must fail (status {status:?})\n{}",
        job.describe()
    );
    assert!(
        all_output(&job).contains("no.such.librdkafka.property"),
        "the failure must name the property\n{}",
        job.describe()
    );
}

#[test]
fn kafka_properties_reach_the_clients_and_secrets_never_print() {
    let test = "eos_config_properties";
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("transactional-offsets", dir.path());
    let (broker, data) = setup(dir.path(), &args, 300, seed(test));
    produce_all(broker.bootstrap(), &args.input, &data);
    const SECRET: &str = "pa55-never-in-logs-7f3a";
    let props = dir.path().join("client.properties");
    std::fs::write(&props, "# test credentials\nsasl.username=onceflow\n")
        .expect("write properties file");
    args.extra_args = vec!["--kafka-property".into(), "client.rack=rack-7".into()];
    // flags and secrets from the environment: the file's name, a property (the password, as
    // a Kubernetes secret would set it), and a job flag
    args.env = vec![
        // debug level: the most a user would turn on while chasing a problem
        ("RUST_LOG".into(), "debug".into()),
        (
            "ONCEFLOW_KAFKA_PROPERTIES_FILE".into(),
            props.display().to_string(),
        ),
        (
            "ONCEFLOW_KAFKA_PROPERTY_SASL_PASSWORD".into(),
            SECRET.into(),
        ),
        (
            "ONCEFLOW_MAX_RECORDS".into(),
            data.records.len().to_string(),
        ),
    ];
    let mut job = spawn_job(broker.bootstrap(), &args, "properties");
    let status = job.wait_exit(STOP_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "the job with client properties did not finish (status {status:?})\n{}",
        job.describe()
    );
    let output = all_output(&job);
    assert!(
        output.contains("client.rack=rack-7") && output.contains("sasl.password=[redacted]"),
        "the job does not report its client properties\n{}",
        job.describe()
    );
    assert!(
        !output.contains(SECRET),
        "the configured password appears in the job's output"
    );
    let report = check_output(broker.bootstrap(), &args, &data);
    assert!(report.is_exact(), "output not exact: {report:?}");
}

/// `--log-format json` (here from `ONCEFLOW_LOG_FORMAT`): every stderr line is one JSON
/// object with the job's name, a level, a target and a message; checkpoint lines carry the
/// checkpoint's id as a number.
#[test]
fn json_logs_carry_the_job_and_checkpoint_fields() {
    let test = "eos_config_json_logs";
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    let (broker, data) = setup(dir.path(), &args, 300, seed(test));
    produce_all(broker.bootstrap(), &args.input, &data);
    args.env = vec![
        ("ONCEFLOW_LOG_FORMAT".into(), "json".into()),
        (
            "ONCEFLOW_MAX_RECORDS".into(),
            data.records.len().to_string(),
        ),
    ];
    let mut job = spawn_job(broker.bootstrap(), &args, "json-logs");
    let status = job.wait_exit(STOP_TIMEOUT);
    assert!(status.is_some_and(|s| s.success()), "{}", job.describe());
    let stderr = job.stderr_tail(100_000);
    let mut checkpoints = 0;
    // log lines only: a Rust panic report (a shutdown race in a producer's DescribeTransactions
    // retry, tracked separately) is written by the panic hook, not the log
    for line in stderr.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v.get(key).is_some(), "no `{key}` in {line}");
        }
        assert_eq!(v["job"], "etl", "{line}");
        if v["message"] == "checkpoint complete" {
            assert!(v["checkpoint"].is_u64(), "{line}");
            checkpoints += 1;
        }
    }
    assert!(checkpoints > 0, "no checkpoint line\n{stderr}");
    let report = check_output(broker.bootstrap(), &args, &data);
    assert!(report.is_exact(), "output not exact: {report:?}");
}
