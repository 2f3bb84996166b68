//! The recipes under `deploy/` read as the job would see them: the Dockerfile's command
//! and environment, the Kubernetes workloads' containers, the systemd unit.

use super::*;

/// The Dockerfile's ENV variables, ENTRYPOINT + CMD, EXPOSE and USER.
pub(super) struct Image {
    pub(super) env: BTreeMap<String, String>,
    pub(super) command: Vec<String>,
    pub(super) expose: Vec<u16>,
    pub(super) user: String,
    pub(super) text: String,
}

pub(super) fn image() -> Image {
    let text = read("Dockerfile");
    // continuation lines joined: one instruction a line
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    // the last stage is the image
    let last = joined
        .rsplit_once("\nFROM ")
        .map(|(_, s)| s)
        .expect("stages");
    let mut img = Image {
        env: BTreeMap::new(),
        command: vec![],
        expose: vec![],
        user: String::new(),
        text,
    };
    let mut entrypoint = vec![];
    let mut cmd = vec![];
    for line in last.lines() {
        let (instr, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let json_array = |s: &str| -> Vec<String> {
            serde_json::from_str(s.trim()).unwrap_or_else(|e| {
                panic!("Dockerfile: {instr} `{s}` is not an exec-form JSON array: {e}")
            })
        };
        match instr {
            "ENV" => {
                for kv in rest.split_whitespace() {
                    let (k, v) = kv.split_once('=').expect("ENV NAME=value");
                    img.env.insert(k.into(), v.into());
                }
            }
            "ENTRYPOINT" => entrypoint = json_array(rest),
            "CMD" => cmd = json_array(rest),
            "EXPOSE" => img.expose.extend(
                rest.split_whitespace()
                    .map(|p| p.parse::<u16>().expect("EXPOSE port")),
            ),
            "USER" => img.user = rest.trim().into(),
            _ => {}
        }
    }
    img.command = entrypoint.into_iter().chain(cmd).collect();
    img
}

/// The YAML documents of a manifest file, as JSON values.
pub(super) fn manifest(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub(super) fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

pub(super) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A workload's container: its command line after the image's entry point, its
/// environment as the container sees it (the image's ENV, then `envFrom` Secrets, then
/// `env`; a `valueFrom` field reference gets a pod name), and its probes.
pub(super) struct Container {
    pub(super) what: String,
    pub(super) args: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) probes: Vec<(String, Value)>,
    pub(super) ports: Vec<(String, u64)>,
    pub(super) pod: Value,
}

pub(super) fn containers(rel: &str, kind: &str) -> Vec<Container> {
    let docs = manifest(rel);
    let secrets = manifest("kubernetes/secret.yaml");
    let mut out = vec![];
    for w in of_kind(&docs, kind) {
        let pod = &w["spec"]["template"]["spec"];
        for c in pod["containers"].as_array().expect("containers") {
            let what = format!("{rel} {kind} container {}", c["name"]);
            let mut env = image().env;
            for from in c["envFrom"].as_array().into_iter().flatten() {
                let name = &from["secretRef"]["name"];
                let secret = of_kind(&secrets, "Secret")
                    .into_iter()
                    .find(|s| s["metadata"]["name"] == *name)
                    .unwrap_or_else(|| {
                        panic!("{what}: Secret {name} is not in kubernetes/secret.yaml")
                    });
                for (k, v) in secret["stringData"].as_object().expect("stringData") {
                    env.insert(k.clone(), v.as_str().expect("a string value").into());
                }
            }
            for e in c["env"].as_array().into_iter().flatten() {
                let name = e["name"].as_str().expect("env name").to_string();
                let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                    (Value::String(v), _) => v.clone(),
                    (_, Value::String(p)) if p == "metadata.name" => {
                        "onceflow-etl-scaled-7d9f8c-x2x7q".into()
                    }
                    _ => panic!("{what}: env {name}: a value or a metadata.name field reference"),
                };
                env.insert(name, value);
            }
            assert!(
                c["command"].is_null(),
                "{what}: keep the image's entry point (no `command`)"
            );
            let probes = ["livenessProbe", "readinessProbe", "startupProbe"]
                .iter()
                .filter(|p| !c[**p].is_null())
                .map(|p| (p.to_string(), c[*p]["httpGet"].clone()))
                .collect();
            let ports = c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_string(),
                        p["containerPort"].as_u64().expect("containerPort"),
                    )
                })
                .collect();
            out.push(Container {
                what,
                args: strings(&c["args"]),
                env,
                probes,
                ports,
                pod: pod.clone(),
            });
        }
    }
    assert!(!out.is_empty(), "{rel}: no {kind}");
    out
}

/// The transaction timeout a configuration sets, in seconds (the job's default: 60).
pub(super) fn transaction_timeout_s(env: &BTreeMap<String, String>) -> u64 {
    env.get("ONCEFLOW_TRANSACTION_TIMEOUT_MS")
        .map_or(60_000, |v| v.parse::<u64>().unwrap())
        / 1000
}

/// A systemd unit's `Key=value` lines of section `[section]`.
pub(super) fn unit_entries(text: &str, section: &str) -> Vec<(String, String)> {
    let mut in_section = false;
    let mut out = vec![];
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == format!("[{section}]");
        } else if in_section && !line.is_empty() && !line.starts_with('#') {
            let (k, v) = line.split_once('=').expect("Key=value");
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

pub(super) fn env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("VAR=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The systemd unit's `[Service]` section.
pub(super) struct Unit {
    /// ExecStart: the binary and its arguments.
    pub(super) exec: Vec<String>,
    /// Its `Environment=` lines over its `EnvironmentFile=`, as systemd applies them.
    pub(super) env: BTreeMap<String, String>,
    pub(super) service: Vec<(String, String)>,
}

pub(super) fn systemd_unit() -> Unit {
    let text = read("systemd/onceflow-job.service");
    let service = unit_entries(&text, "Service");
    let exec: Vec<String> = service
        .iter()
        .find(|(k, _)| k == "ExecStart")
        .expect("ExecStart=")
        .1
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut env = BTreeMap::new();
    for (k, v) in &service {
        if k == "EnvironmentFile" {
            assert_eq!(
                v, "/etc/onceflow/job.env",
                "the installed path of systemd/onceflow-job.env"
            );
            env.extend(env_file(&read("systemd/onceflow-job.env")));
        }
    }
    for (k, v) in &service {
        if k == "Environment" {
            for kv in v.split_whitespace() {
                let (name, value) = kv.split_once('=').expect("Environment=NAME=value");
                env.insert(name.to_string(), value.to_string());
            }
        }
    }
    Unit { exec, env, service }
}

// ---------------------------------------------------------------------------------------
// Metric names in PromQL
// ---------------------------------------------------------------------------------------
