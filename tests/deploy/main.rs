//! The deployment recipes under `deploy/` checked against the job binary they deploy.
//!
//! - Every flag and `ONCEFLOW_*` variable of the Dockerfile, the Kubernetes manifests and the
//!   systemd unit is one the job's `--help` lists (`ONCEFLOW_KAFKA_PROPERTY_*` must name a
//!   property librdkafka accepts), and each recipe's whole configuration is one the job
//!   accepts: started with it against a closed loopback port, the job stops with exit code 6
//!   (cluster unreachable, so the configuration passed), not 2 (configuration error).
//! - The unit passes `systemd-analyze verify`; the rules file `promtool check rules`.
//! - One running job (the StatefulSet's settings, on the embedded broker) answers 200 on every
//!   probe path of the manifests, and a real Prometheus server scraping it resolves every
//!   alert rule and dashboard query, finds every metric name they use, evaluates the rules
//!   without error and fires none but the dead-letter alert (the demo input writes dead
//!   letters).
//!
//! promtool, prometheus and systemd-analyze come from Debian packages
//! (`scripts/ci-setup.sh`); without them a check prints `SKIPPED: ...`, except under `CI`,
//! where a missing tool fails it. Every wait is a poll bounded by a generous timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use onceflow::connectors::kafka::metrics::job_catalogue;
use onceflow::runtime::metrics::MetricKind;
use onceflow_testkit::bins::{bins, find_on_path, workspace_root};
use onceflow_testkit::child::{run_bounded, Proc};
use onceflow_testkit::http::{free_port, try_get};
use serde::Deserialize;
use serde_json::Value;

/// Longest wait for anything a healthy job or Prometheus does within seconds.
const WAIT: Duration = Duration::from_secs(120);

/// Prefix of the variables that set a Kafka client property.
const PROPERTY_PREFIX: &str = "ONCEFLOW_KAFKA_PROPERTY_";

/// Metric names the rules or the dashboard use that a healthy two-phase-commit job does not
/// export: they are checked against the job's catalogue only.
const NOT_ON_A_HEALTHY_TWO_PHASE_COMMIT_JOB: &[(&str, &str)] = &[
    (
        "onceflow_scale_tasks_owned",
        "exported by scaled-out (transactional-offsets) instances only",
    ),
    (
        "onceflow_checkpoints_failed_total",
        "appears with the first failed checkpoint",
    ),
];

/// The one alert that holds on the demo job: its input has a record that does not parse
/// every 500 records, written to the dead-letter topic.
const FIRES_ON_THE_DEMO: &str = "OnceflowDeadLetters";

fn deploy_path(rel: &str) -> PathBuf {
    workspace_root().join("deploy").join(rel)
}

fn read(rel: &str) -> String {
    let path = deploy_path(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// True if every tool in `names` is on PATH. Otherwise prints `SKIPPED: ...` and returns
/// false, or, under `CI`, fails: CI installs them (`scripts/ci-setup.sh`).
fn tools_present(names: &[&str], skipped: &str) -> bool {
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| find_on_path(&[n]).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    assert!(
        !ci,
        "CI is set and {missing:?} is not installed: scripts/ci-setup.sh installs it"
    );
    eprintln!("SKIPPED: {skipped} not installed ({missing:?} not on PATH; bash scripts/ci-setup.sh installs it)");
    false
}

// ---------------------------------------------------------------------------------------
// What the job binary accepts
// ---------------------------------------------------------------------------------------

/// The job's flags (with whether each takes a value) and variables, from its `--help`.
struct Cli {
    flags: BTreeMap<String, bool>,
    env: BTreeSet<String>,
}

fn cli() -> &'static Cli {
    static CLI: OnceLock<Cli> = OnceLock::new();
    CLI.get_or_init(|| {
        let out = Command::new(&bins().job)
            .arg("--help")
            .output()
            .expect("run the job's --help");
        assert!(out.status.success(), "--help failed: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        let mut flags = BTreeMap::new();
        let mut env = BTreeSet::new();
        for line in help.lines() {
            let t = line.trim_start();
            let t = t.strip_prefix("-h, ").unwrap_or(t);
            if let Some(rest) = t.strip_prefix("--") {
                let name = rest.split_whitespace().next().unwrap_or_default();
                flags.insert(
                    format!("--{name}"),
                    rest[name.len()..].trim_start().starts_with('<'),
                );
            }
            let mut at = line;
            while let Some(i) = at.find("[env: ") {
                let var = &at[i + 6..];
                let end = var.find('=').expect("[env: NAME=] in --help");
                env.insert(var[..end].to_string());
                at = &var[end..];
            }
        }
        assert!(
            flags.contains_key("--brokers") && env.contains("ONCEFLOW_BROKERS"),
            "{help}"
        );
        Cli { flags, env }
    })
}

/// Checks a command line's arguments against `--help`: each a known flag (`--f v` or
/// `--f=v`), a value after a flag that takes one, and no positional argument.
fn check_args(args: &[String], what: &str) {
    let cli = cli();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline_value) = match arg.split_once('=') {
            Some((f, _)) => (f, true),
            None => (arg.as_str(), false),
        };
        let takes_value = *cli
            .flags
            .get(flag)
            .unwrap_or_else(|| panic!("{what}: `{arg}` is not a flag of the job (see its --help)"));
        if takes_value && !inline_value {
            assert!(i + 1 < args.len(), "{what}: `{flag}` needs a value");
            i += 1;
        }
        assert!(
            takes_value || !inline_value,
            "{what}: `{flag}` takes no value"
        );
        i += 1;
    }
}

/// Checks a variable name: an `ONCEFLOW_*` one must be a flag's variable or name a Kafka
/// property (checked with the values by [`check_kafka_properties`]).
fn check_env_name(name: &str, what: &str) {
    if name.starts_with(PROPERTY_PREFIX) {
        assert!(
            name.len() > PROPERTY_PREFIX.len(),
            "{what}: empty property in `{name}`"
        );
    } else if name.starts_with("ONCEFLOW_") {
        assert!(
            cli().env.contains(name),
            "{what}: `{name}` is not a variable of the job (its --help lists `[env: ...]` for each flag)"
        );
    }
}

/// The Kafka properties `vars` set through `ONCEFLOW_KAFKA_PROPERTY_*` are ones librdkafka
/// accepts with these values (a client is created with them; it connects nowhere).
fn check_kafka_properties(vars: &BTreeMap<String, String>, what: &str) {
    let mut config = rdkafka::ClientConfig::new();
    let mut any = false;
    for (name, value) in vars {
        if let Some(key) = name.strip_prefix(PROPERTY_PREFIX) {
            config.set(key.to_ascii_lowercase().replace('_', "."), value);
            any = true;
        }
    }
    if any {
        if let Err(e) = config.create::<rdkafka::producer::BaseProducer>() {
            panic!("{what}: librdkafka refuses the Kafka properties {config:?}: {e}");
        }
    }
}

/// Starts the job with `vars` and `args` against a loopback port nothing listens on: a
/// configuration it accepts ends with exit code 6 (cluster unreachable), a refused one
/// with 2. The checkpoint directory and the listener move to places of this test.
fn check_accepted(vars: &BTreeMap<String, String>, args: &[String], what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("checkpoints");
    let mut cmd = Command::new(&bins().job);
    cmd.args(relocate_checkpoint_dir(args, &ckpt));
    clear_onceflow_env(&mut cmd);
    cmd.envs(vars)
        .env("ONCEFLOW_BROKERS", format!("127.0.0.1:{}", free_port()))
        .env("ONCEFLOW_CONNECT_TIMEOUT_MS", "1000")
        .env("ONCEFLOW_METRICS_LISTEN", "127.0.0.1:0")
        .env("ONCEFLOW_CHECKPOINT_DIR", &ckpt);
    let (status, _, stderr) = run_bounded(&mut cmd, None, WAIT).unwrap();
    assert_eq!(
        status.code(),
        Some(6),
        "{what}: expected exit 6 (configuration accepted, cluster unreachable); got {status}:\n{stderr}"
    );
}

fn clear_onceflow_env(cmd: &mut Command) {
    for (name, _) in std::env::vars() {
        if name.starts_with("ONCEFLOW_") {
            cmd.env_remove(name);
        }
    }
}

fn relocate_checkpoint_dir(args: &[String], to: &Path) -> Vec<String> {
    let mut out = args.to_vec();
    for i in 0..out.len() {
        if out[i] == "--checkpoint-dir" && i + 1 < out.len() {
            out[i + 1] = to.display().to_string();
        }
    }
    out
}

/// The port of a `HOST:PORT` listen address.
fn listen_port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not HOST:PORT: {addr}"))
}

// ---------------------------------------------------------------------------------------
// The recipes, parsed
// ---------------------------------------------------------------------------------------

mod queries;
mod recipes;

use queries::*;
use recipes::*;

#[test]
fn dockerfile_builds_the_job_and_runs_it_as_non_root_with_flags_it_knows() {
    let img = image();
    assert!(
        img.text.contains("cargo build --release --locked"),
        "a locked release build"
    );
    assert!(
        img.text.contains("FROM debian:bookworm-slim"),
        "a slim Debian runtime"
    );
    assert!(img.text.contains("libssl3") && img.text.contains("ca-certificates"));
    assert_eq!(
        img.command.first().map(String::as_str),
        Some("/usr/local/bin/onceflow-job")
    );
    let uid = img.user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER numeric and not root: {}",
        img.user
    );
    let args = &img.command[1..];
    check_args(args, "Dockerfile ENTRYPOINT/CMD");
    for name in img.env.keys() {
        check_env_name(name, "Dockerfile ENV");
    }
    let listen = &img.env["ONCEFLOW_METRICS_LISTEN"];
    assert!(
        img.expose.contains(&listen_port(listen)),
        "EXPOSE {:?} must include the metrics port of {listen}",
        img.expose
    );
    check_accepted(&img.env, args, "Dockerfile");
}

/// What each workload must get right: flags and variables the job knows and accepts
/// together, probes on the port the job serves, a grace period above the transaction
/// timeout, and the image's user.
fn check_workload(c: &Container) {
    check_args(&c.args, &c.what);
    for name in c.env.keys() {
        check_env_name(name, &c.what);
    }
    check_kafka_properties(&c.env, &c.what);
    check_accepted(&c.env, &c.args, &c.what);
    let port = u64::from(listen_port(&c.env["ONCEFLOW_METRICS_LISTEN"]));
    assert!(
        c.ports.iter().any(|(_, p)| *p == port),
        "{}: no containerPort {port} (ONCEFLOW_METRICS_LISTEN)",
        c.what
    );
    assert!(
        c.probes.len() >= 2,
        "{}: liveness and readiness probes",
        c.what
    );
    for (kind, get) in &c.probes {
        let probe_port = match &get["port"] {
            Value::String(name) => c.ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p),
            other => other.as_u64(),
        };
        assert_eq!(
            probe_port,
            Some(port),
            "{}: {kind} must probe the metrics port",
            c.what
        );
    }
    let grace = c.pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    let timeout = transaction_timeout_s(&c.env);
    assert!(
        grace > timeout,
        "{}: grace {grace} s must exceed the transaction timeout {timeout} s",
        c.what
    );
    let image_uid: u64 = image().user.split(':').next().unwrap().parse().unwrap();
    assert_eq!(
        c.pod["securityContext"]["runAsUser"].as_u64(),
        Some(image_uid),
        "{}",
        c.what
    );
    assert_eq!(c.pod["securityContext"]["runAsNonRoot"], true, "{}", c.what);
}

fn pod_labels(docs: &[Value], kind: &str) -> Value {
    of_kind(docs, kind)[0]["spec"]["template"]["metadata"]["labels"].clone()
}

#[test]
fn kubernetes_two_phase_commit_statefulset_keeps_checkpoints_on_a_volume() {
    let rel = "kubernetes/statefulset-two-phase-commit.yaml";
    let docs = manifest(rel);
    let sts = of_kind(&docs, "StatefulSet")[0];
    assert_eq!(
        sts["spec"]["replicas"], 1,
        "two-phase commit runs one process per job"
    );
    let labels = pod_labels(&docs, "StatefulSet");
    assert_eq!(of_kind(&docs, "Service")[0]["spec"]["selector"], labels);
    assert_eq!(sts["spec"]["selector"]["matchLabels"], labels);
    for c in containers(rel, "StatefulSet") {
        check_workload(&c);
        assert_eq!(c.env["ONCEFLOW_MODE"], "two-phase-commit");
        let at = c
            .args
            .iter()
            .position(|a| a == "--checkpoint-dir")
            .expect("--checkpoint-dir in args");
        let dir = &c.args[at + 1];
        assert_eq!(dir, "/var/lib/onceflow/checkpoints");
        let claims: Vec<&Value> = sts["spec"]["volumeClaimTemplates"]
            .as_array()
            .expect("volumeClaimTemplates")
            .iter()
            .collect();
        let mounted = sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .find(|m| m["mountPath"] == dir.as_str())
            .expect("a volume mounted at the checkpoint directory");
        assert!(
            claims
                .iter()
                .any(|t| t["metadata"]["name"] == mounted["name"]),
            "the checkpoint directory is a volumeClaimTemplate"
        );
    }
}

#[test]
fn kubernetes_scaled_out_deployment_names_instances_after_pods() {
    let rel = "kubernetes/deployment-transactional-offsets.yaml";
    let docs = manifest(rel);
    let container = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0];
    let instance = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "ONCEFLOW_INSTANCE_ID")
        .expect("ONCEFLOW_INSTANCE_ID");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let labels = pod_labels(&docs, "Deployment");
    let pdb = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb.len(), 1, "a PodDisruptionBudget");
    assert_eq!(
        pdb[0]["spec"]["selector"]["matchLabels"], labels,
        "the budget selects the pods"
    );
    for c in containers(rel, "Deployment") {
        check_workload(&c);
        assert_eq!(c.env["ONCEFLOW_MODE"], "transactional-offsets");
    }
    // every Kafka property of the Secret is one librdkafka accepts
    let secret = manifest("kubernetes/secret.yaml");
    let vars: BTreeMap<String, String> =
        serde_json::from_value(secret[0]["stringData"].clone()).unwrap();
    for name in vars.keys() {
        assert!(name.starts_with(PROPERTY_PREFIX), "secret.yaml: {name}");
    }
    check_kafka_properties(&vars, "kubernetes/secret.yaml");
    // the PodMonitor scrapes the pods' metrics port as job="onceflow"
    let monitor = &manifest("kubernetes/podmonitor.yaml")[0];
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        labels["app.kubernetes.io/name"]
    );
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
}

#[test]
fn systemd_unit_runs_known_flags_and_does_not_restart_what_a_restart_cannot_fix() {
    let Unit { exec, env, service } = systemd_unit();
    assert_eq!(exec[0], "/usr/local/bin/onceflow-job");
    check_args(&exec[1..], "ExecStart");
    for name in env.keys() {
        check_env_name(name, "systemd unit");
    }
    check_kafka_properties(&env, "systemd unit");
    check_accepted(&env, &exec[1..], "systemd unit");
    let value = |key: &str| {
        service
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{key}="))
    };
    assert_eq!(value("Restart"), "on-failure");
    let prevent_value = value("RestartPreventExitStatus");
    let prevent: BTreeSet<&str> = prevent_value.split_whitespace().collect();
    for code in ["2", "3"] {
        assert!(
            prevent.contains(code),
            "RestartPreventExitStatus must hold {code}: {prevent:?}"
        );
    }
    let stop: u64 = value("TimeoutStopSec").parse().unwrap();
    assert!(
        stop > transaction_timeout_s(&env),
        "TimeoutStopSec {stop} s must exceed the transaction timeout"
    );

    if !tools_present(&["systemd-analyze"], "systemd-analyze") {
        return;
    }
    // verify a copy that starts the built binary with a copy of the environment file: a
    // missing executable, a misspelt key or a bad value is an error or a warning
    let dir = tempfile::tempdir().unwrap();
    let env_path = dir.path().join("job.env");
    std::fs::write(&env_path, read("systemd/onceflow-job.env")).unwrap();
    let unit = read("systemd/onceflow-job.service")
        .replace(
            "ExecStart=/usr/local/bin/onceflow-job",
            &format!("ExecStart={}", bins().job.display()),
        )
        .replace(
            "EnvironmentFile=/etc/onceflow/job.env",
            &format!("EnvironmentFile={}", env_path.display()),
        );
    let unit_path = dir.path().join("onceflow-job.service");
    std::fs::write(&unit_path, unit).unwrap();
    let (status, stdout, stderr) = run_bounded(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit_path),
        None,
        WAIT,
    )
    .unwrap();
    assert!(
        status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify {}: {status}\n{stdout}{stderr}",
        unit_path.display()
    );
}

#[test]
fn promtool_accepts_the_rules_and_the_scrape_config() {
    if !tools_present(&["promtool"], "promtool") {
        return;
    }
    for (check, file) in [
        ("rules", "prometheus/onceflow-alerts.yml"),
        ("config", "prometheus/prometheus.yml"),
    ] {
        let (status, stdout, stderr) = run_bounded(
            Command::new("promtool")
                .args(["check", check])
                .arg(deploy_path(file)),
            None,
            WAIT,
        )
        .unwrap();
        assert!(
            status.success(),
            "promtool check {check} {file}: {status}\n{stdout}{stderr}"
        );
    }
}

#[test]
fn rules_and_dashboard_use_only_catalogued_metrics() {
    let dash: Value = serde_json::from_str(&read("grafana/onceflow-dashboard.json")).unwrap();
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let vars = dash["templating"]["list"].as_array().expect("templating");
    assert!(vars.iter().any(|v| v["type"] == "datasource"
        && v["query"] == "prometheus"
        && v["name"] == "datasource"));
    let mut ids = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "panel ids unique"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            assert!(
                !strings_of_exprs(panel).is_empty(),
                "{}: no query",
                panel["title"]
            );
        }
    }
    let exprs: Vec<(String, String)> = alert_rules()
        .into_iter()
        .chain(dashboard_queries())
        .collect();
    for (what, expr) in &exprs {
        let names = metric_names(expr);
        assert!(
            !names.is_empty() || expr.contains("up{"),
            "{what}: no metric in {expr}"
        );
        for name in names {
            assert!(
                catalogue_name(&name).is_some(),
                "{what}: `{name}` is not a metric of the job's catalogue"
            );
        }
    }
}

fn strings_of_exprs(panel: &Value) -> Vec<String> {
    panel["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

// ---------------------------------------------------------------------------------------
// A running job, its probes, and Prometheus scraping it
// ---------------------------------------------------------------------------------------

/// Polls `f` until it returns `Some` (returns it), or panics with `what` after [`WAIT`].
fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {} s",
            WAIT.as_secs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server scraping one job every second, with the rules file loaded.
struct Prometheus {
    port: u16,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target_port: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: onceflow\n    static_configs:\n      - targets: [\"127.0.0.1:{target_port}\"]\n",
                deploy_path("prometheus/onceflow-alerts.yml").display()
            ),
        )
        .unwrap();
        let port = free_port();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let proc = Proc::spawn("prometheus", cmd, &dir.path().join("prometheus.log"));
        let p = Prometheus {
            port,
            _proc: proc,
            _dir: dir,
        };
        poll("Prometheus ready", || {
            try_get(p.port, "/-/ready").ok().filter(|(s, _)| *s == 200)
        });
        p
    }

    /// GET an API path: the `data` of a successful answer, or the error Prometheus gave.
    fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = try_get(self.port, path).map_err(|e| format!("GET {path}: {e}"))?;
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("{path}: {status} {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!(
                "{path}: {status} {}: {}",
                v["errorType"], v["error"]
            ));
        }
        Ok(v["data"].clone())
    }

    /// The result of an instant query (panics on a query Prometheus refuses).
    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", percent_encode(expr)))
            .unwrap_or_else(|e| panic!("query `{expr}`: {e}"));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    fn metric_names(&self) -> BTreeSet<String> {
        serde_json::from_value(self.api("/api/v1/label/__name__/values").unwrap()).unwrap()
    }
}

/// Checks what Prometheus makes of the rules and the dashboard against the scraped job.
fn check_with_prometheus(metrics_port: u16) {
    let prom = Prometheus::start(metrics_port);
    poll("the job scraped (up == 1)", || {
        (prom.query("up{job=\"onceflow\"} == 1").len() == 1).then_some(())
    });
    let rules = alert_rules();
    let queries = dashboard_queries();
    let all: Vec<&(String, String)> = rules.iter().chain(&queries).collect();

    // every series name the expressions use is scraped, but for the ones a healthy
    // two-phase-commit job does not export
    let wanted: BTreeSet<String> = all
        .iter()
        .flat_map(|(_, e)| metric_names(e))
        .filter(|n| {
            !NOT_ON_A_HEALTHY_TWO_PHASE_COMMIT_JOB
                .iter()
                .any(|(m, _)| m == n)
        })
        .collect();
    let mut missing = BTreeSet::new();
    let scraped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll(
            "every metric name the rules and the dashboard use, scraped",
            || {
                let have = prom.metric_names();
                missing = wanted.difference(&have).cloned().collect();
                missing.is_empty().then_some(())
            },
        )
    }));
    assert!(
        scraped.is_ok(),
        "not exported by the running job: {missing:?}"
    );
    for (name, why) in NOT_ON_A_HEALTHY_TWO_PHASE_COMMIT_JOB {
        eprintln!("[deploy] {name}: checked against the catalogue only ({why})");
    }

    // every expression resolves; every dashboard query of scraped series returns data
    for (what, expr) in &all {
        prom.query(expr);
        let is_dashboard = queries.iter().any(|(_, q)| q == expr);
        if is_dashboard && uses_only_healthy_job_names(expr) {
            poll(&format!("{what}: `{expr}` returns data"), || {
                (!prom.query(expr).is_empty()).then_some(())
            });
        }
    }

    // Prometheus evaluates every rule without error
    poll("every rule evaluated without error", || {
        let data = prom.api("/api/v1/rules").ok()?;
        let evaluated: Vec<&Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        for r in &evaluated {
            assert_ne!(
                r["health"], "err",
                "rule {} fails: {}",
                r["name"], r["lastError"]
            );
        }
        (evaluated.len() == rules.len() && evaluated.iter().all(|r| r["health"] == "ok"))
            .then_some(())
    });

    // on the healthy demo job only the dead-letter alert holds (it waits out its `for`)
    poll(
        &format!("{FIRES_ON_THE_DEMO} pending or firing on the demo's dead letters"),
        || {
            let alerts = prom.api("/api/v1/alerts").ok()?;
            alerts["alerts"]
                .as_array()?
                .iter()
                .any(|a| a["labels"]["alertname"] == FIRES_ON_THE_DEMO)
                .then_some(())
        },
    );
    for (name, expr) in &rules {
        if name != FIRES_ON_THE_DEMO {
            let result = prom.query(expr);
            assert!(
                result.is_empty(),
                "{name} holds on a healthy job: `{expr}` = {result:?}"
            );
        }
    }
}

#[test]
fn a_running_job_answers_the_probes_and_prometheus_resolves_rules_and_dashboard() {
    let sts = containers(
        "kubernetes/statefulset-two-phase-commit.yaml",
        "StatefulSet",
    )
    .remove(0);
    let scaled = containers(
        "kubernetes/deployment-transactional-offsets.yaml",
        "Deployment",
    )
    .remove(0);
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    // the StatefulSet's settings, on the embedded broker (no brokers, no credentials: it
    // listens on PLAINTEXT) with the demo input
    let mut cmd = Command::new(&bins().job);
    cmd.args(relocate_checkpoint_dir(
        &sts.args,
        &dir.path().join("checkpoints"),
    ));
    clear_onceflow_env(&mut cmd);
    for (k, v) in &sts.env {
        if k != "ONCEFLOW_BROKERS" && !k.starts_with(PROPERTY_PREFIX) {
            cmd.env(k, v);
        }
    }
    cmd.env(
        "ONCEFLOW_METRICS_LISTEN",
        format!("127.0.0.1:{metrics_port}"),
    )
    .env("ONCEFLOW_CHECKPOINT_DIR", dir.path().join("checkpoints"));
    let mut job = Proc::spawn("job", cmd, &dir.path().join("job.stderr.log"));
    assert!(
        job.wait_line(WAIT, |l| l == "job started").is_some(),
        "no `job started`\n{}",
        job.describe()
    );

    let paths: BTreeSet<String> = sts
        .probes
        .iter()
        .chain(&scaled.probes)
        .map(|(_, get)| get["path"].as_str().expect("httpGet path").to_string())
        .collect();
    assert!(
        paths.contains("/healthz") && paths.contains("/readyz"),
        "{paths:?}"
    );
    for path in &paths {
        let body = poll(&format!("GET {path} answers 200"), || {
            try_get(metrics_port, path)
                .ok()
                .filter(|(s, _)| *s == 200)
                .map(|(_, b)| b)
        });
        eprintln!("[deploy] GET {path}: 200 {}", body.trim());
    }

    if tools_present(&["prometheus"], "prometheus") {
        check_with_prometheus(metrics_port);
    }

    let grace = sts.pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    job.stop_gracefully(Duration::from_secs(grace));
}
