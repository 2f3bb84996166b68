//! A job pointed at a cluster it cannot reach stops within its connect timeout (plus a
//! margin) with one line that names the address and the cause, and its documented exit
//! code: 2 for a `--brokers` value that is not `HOST:PORT` (refused with the flags), 6 for a
//! refused port or a name that does not resolve. Nothing is printed after that line: no
//! Kafka client was made. The TLS and SASL cases run against a secured broker in
//! `tests/eos_security.rs`.

use std::time::Duration;

use onceflow_testkit::child::Proc;
use onceflow_testkit::eos::*;

/// `--connect-timeout-ms` of these runs.
const CONNECT_TIMEOUT_MS: u64 = 3000;

/// The margin past the connect timeout within which the job must have exited.
const MARGIN: Duration = Duration::from_secs(5);

fn run_against(test: &str, brokers: &str) -> (Proc, ScenarioDir) {
    let dir = scenario_dir(test);
    let mut args = JobArgs::new("two-phase-commit", dir.path());
    args.brokers = Some(brokers.to_string());
    args.extra_args = vec![
        "--connect-timeout-ms".into(),
        CONNECT_TIMEOUT_MS.to_string(),
    ];
    let job = spawn_job(brokers, &args, "reach");
    (job, dir)
}

/// The job exits within the connect timeout plus [`MARGIN`] with `code`, and its last stderr
/// line names `cause`.
fn assert_stops(job: &mut Proc, code: i32, cause: &str) {
    let status = job.wait_exit(Duration::from_millis(CONNECT_TIMEOUT_MS) + MARGIN);
    assert!(
        status.is_some(),
        "the job still runs {MARGIN:?} past its connect timeout\n{}",
        job.describe()
    );
    assert_eq!(status.unwrap().code(), Some(code), "{}", job.describe());
    let stderr = job.stderr_tail(50);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
        .unwrap_or_default();
    assert!(
        last.contains(cause),
        "the last line does not name `{cause}`: {last}\n{}",
        job.describe()
    );
    assert!(
        !stderr.contains("librdkafka"),
        "a Kafka client printed something: none should have been made\n{}",
        job.describe()
    );
    assert!(
        !job.lines().iter().any(|l| l.contains("job started")),
        "{}",
        job.describe()
    );
}

#[test]
fn brokers_that_are_not_host_port_are_refused_with_the_flags() {
    let (mut job, _dir) = run_against("eos_reach_notaport", "notaport");
    assert_stops(&mut job, 2, "`notaport` is not HOST:PORT");
}

#[test]
fn a_refused_port_stops_the_job_naming_it() {
    // a port nothing listens on: bind one, then close it
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let (mut job, _dir) = run_against("eos_reach_refused", &addr);
    assert_stops(&mut job, 6, &format!("{addr}: connection refused"));
}

#[test]
fn a_name_that_does_not_resolve_stops_the_job_naming_it() {
    // `.invalid` never resolves (RFC 2606)
    let (mut job, _dir) = run_against("eos_reach_unresolved", "nosuchhost.invalid:9092");
    assert_stops(&mut job, 6, "nosuchhost.invalid:9092: name not resolved");
}

/// Every flag can come from an `ONCEFLOW_*` variable, `--help` names it, and a bad value
/// from the environment is refused like the same flag (exit 2, naming the entry).
#[test]
fn flags_come_from_the_environment_and_help_names_each_variable() {
    let job = &onceflow_testkit::bins::bins().job;
    let help = std::process::Command::new(job)
        .arg("--help")
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '=']).next())
        .filter(|f| *f != "help")
        .collect();
    assert!(flags.len() > 20, "flags in --help: {flags:?}\n{help}");
    for flag in &flags {
        let var = format!("ONCEFLOW_{}", flag.to_ascii_uppercase().replace('-', "_"));
        let var = if var == "ONCEFLOW_KAFKA_PROPERTY" {
            // repeatable: one variable per property instead
            "ONCEFLOW_KAFKA_PROPERTY_<NAME>".to_string()
        } else {
            format!("[env: {var}=")
        };
        assert!(
            help.contains(&var),
            "--help does not name {var} for --{flag}\n{help}"
        );
    }
    let out = std::process::Command::new(job)
        .env("ONCEFLOW_BROKERS", "notaport")
        .output()
        .expect("run the job");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`notaport` is not HOST:PORT"),
        "the refusal does not name the entry: {stderr}"
    );
}
