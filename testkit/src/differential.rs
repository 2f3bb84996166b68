//! Differential conformance: the same raw request sequences sent to the bundled broker and to
//! Apache Kafka, each response rendered (`{:#?}` of the kafka-protocol struct), normalized and
//! compared line by line.
//!
//! Normalization masks what legitimately differs between two clusters, by field name (see
//! [`MASKED_FIELDS`]): cluster ids, node, broker, controller and leader ids, hosts and ports,
//! throttle times, wall-clock timestamps, topic ids, producer ids (allocated differently),
//! member ids (random), error message texts (only the code is compared) and record bytes
//! (batch CRCs carry timestamps; scenarios compare decoded records as notes instead). Every
//! other field is compared. A scenario lists the differences it expects, each with its reason;
//! any other difference is unexplained.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kafka_protocol::messages::FindCoordinatorRequest;
use kafka_protocol::protocol::{Request, StrBytes};

use crate::raw::RawClient;

/// The protocol crate and byte buffers scenarios are written with, for test binaries that do
/// not depend on them directly.
pub use {bytes, kafka_protocol};

/// Fields whose values differ between any two clusters, and why:
/// - `throttle_time_ms`: quota state, not protocol behaviour;
/// - `cluster_id`, `controller_id`, `node_id`, `broker_id`, `leader_id`, `replica_nodes`,
///   `isr_nodes`, `offline_replicas`, `coordinator_key`-free `host` and `port`: cluster layout;
/// - `topic_id`: a random UUID per topic;
/// - `producer_id`: allocated from different ranges (epochs are compared);
/// - `member_id`: random per join; `leader` in JoinGroup is a member id too;
/// - `error_message`: free text; the error code beside it is compared;
/// - `log_append_time_ms`, `timestamp`, `transaction_start_time_ms`, `last_timestamp`:
///   wall-clock times;
/// - `records`: batch bytes (CRC over timestamps); scenarios note decoded records instead;
/// - `leader_epoch`, `partition_leader_epoch`, `current_leader`: controller-assigned epochs;
/// - `authorized_operations`: Kafka computes them, -2147483648 when not asked for;
/// - `unknown_tagged_fields`: encoding detail.
pub const MASKED_FIELDS: &[&str] = &[
    "throttle_time_ms",
    "cluster_id",
    "controller_id",
    "node_id",
    "broker_id",
    "leader_id",
    "replica_nodes",
    "isr_nodes",
    "offline_replicas",
    "host",
    "port",
    "topic_id",
    "producer_id",
    "member_id",
    "leader",
    "error_message",
    "log_append_time_ms",
    "timestamp",
    "transaction_start_time_ms",
    "last_timestamp",
    "records",
    "leader_epoch",
    "partition_leader_epoch",
    "current_leader",
    "unknown_tagged_fields",
    "node_endpoints",
    "brokers",
    "coordinator_epoch",
];

/// A difference a scenario expects: at step `step` ("*" for any), on a line whose
/// `field path = line text` contains `field`, for `reason`.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    /// The step's name, or "*".
    pub step: &'static str,
    /// A substring of the differing line's `path = text`
    /// (`PartitionProduceResponse.error_code = error_code: 3,`).
    pub field: &'static str,
    /// Why: "by design: ..." or "bundled broker bug, open: ...".
    pub reason: &'static str,
}

/// One named request sequence.
pub struct Scenario {
    /// Unique name; also the prefix of the topics, groups and transactional ids it uses.
    pub name: &'static str,
    /// The requests, sent through a [`Session`].
    pub run: fn(&mut Session) -> Result<()>,
    /// The differences it expects.
    pub expected: &'static [Expected],
}

/// One recorded step: its name and normalized rendering.
#[derive(Clone, Debug)]
pub struct Step {
    /// The step's name.
    pub name: String,
    /// Normalized lines.
    pub lines: Vec<String>,
}

/// A scenario's run against one broker: the connections and the recorded steps.
pub struct Session {
    bootstrap: String,
    scenario: &'static str,
    client: RawClient,
    coordinators: HashMap<(i8, String), RawClient>,
    steps: Vec<Step>,
    api_keys: BTreeSet<i16>,
}

/// Error codes that mean "the coordinator is still loading or has moved; ask again".
const COORDINATOR_RETRIABLE: &[i16] = &[14, 15, 16];

/// Error codes a freshly started or freshly created resource answers for a while: the
/// partition's leader not yet serving (NOT_LEADER_OR_FOLLOWER) or the producer id block
/// still loading (COORDINATOR_LOAD_IN_PROGRESS). Asked again, bounded; a broker that keeps
/// answering them has the last answer recorded.
const BOOTSTRAP_RETRIABLE: &[i16] = &[6, 14];

impl Session {
    /// Connects to `bootstrap` for scenario `scenario`.
    pub fn new(bootstrap: &str, scenario: &'static str) -> Result<Session> {
        Ok(Session {
            bootstrap: bootstrap.to_string(),
            scenario,
            client: RawClient::connect(bootstrap)?,
            coordinators: HashMap::new(),
            steps: Vec::new(),
            api_keys: BTreeSet::new(),
        })
    }

    /// `base` made unique to this scenario (a topic, group or transactional id).
    pub fn name(&self, base: &str) -> String {
        format!("{}-{base}", self.scenario)
    }

    /// The bootstrap connection, for requests that are not recorded (set-up).
    pub fn client(&mut self) -> &mut RawClient {
        &mut self.client
    }

    /// Sends `req` at `version` to the bootstrap broker and records the response as `step`.
    /// An answer carrying a code of [`BOOTSTRAP_RETRIABLE`] is asked again, bounded.
    pub fn send<R: Request + Debug>(
        &mut self,
        step: &str,
        req: &R,
        version: i16,
    ) -> Result<R::Response>
    where
        R::Response: Debug,
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let resp = self.client.request(req, version)?;
            let rendered = format!("{resp:#?}");
            let retriable = BOOTSTRAP_RETRIABLE
                .iter()
                .any(|c| rendered.contains(&format!("error_code: {c},")));
            if retriable && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            self.api_keys.insert(R::KEY);
            self.record(step, &resp);
            return Ok(resp);
        }
    }

    /// Like [`Session::send`], but records `render(response)` instead of the whole response:
    /// for answers whose order is not meaningful (config entries, API key lists).
    pub fn send_rendered<R: Request + Debug>(
        &mut self,
        step: &str,
        req: &R,
        version: i16,
        render: impl Fn(&R::Response) -> String,
    ) -> Result<R::Response>
    where
        R::Response: Debug,
    {
        let resp = self.send(step, req, version)?;
        let last = self.steps.last_mut().expect("send records a step");
        last.lines = render(&resp).lines().map(str::to_string).collect();
        Ok(resp)
    }

    /// Records free text (decoded records, a derived value) as `step`.
    pub fn note(&mut self, step: &str, text: &str) {
        self.steps.push(Step {
            name: step.to_string(),
            lines: text.lines().map(str::to_string).collect(),
        });
    }

    /// Records a response as `step`.
    pub fn record<T: Debug>(&mut self, step: &str, resp: &T) {
        self.steps.push(Step {
            name: step.to_string(),
            lines: normalize(&format!("{resp:#?}")),
        });
    }

    /// Sends `req` to the coordinator of `key` (key type 0: group, 1: transaction), found
    /// with FindCoordinator, and records the response as `step`. A response carrying a
    /// coordinator-loading or coordinator-moved code is asked again, a bounded number of
    /// times, after finding the coordinator afresh; the last answer is recorded.
    pub fn send_coordinator<R: Request + Debug>(
        &mut self,
        step: &str,
        key_type: i8,
        key: &str,
        req: &R,
        version: i16,
    ) -> Result<R::Response>
    where
        R::Response: Debug,
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let conn = self.coordinator(key_type, key)?;
            let resp = conn.request(req, version)?;
            let rendered = format!("{resp:#?}");
            let retriable = COORDINATOR_RETRIABLE
                .iter()
                .any(|c| rendered.contains(&format!("error_code: {c},")));
            if retriable && Instant::now() < deadline {
                self.coordinators.remove(&(key_type, key.to_string()));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            self.api_keys.insert(R::KEY);
            self.record(step, &resp);
            return Ok(resp);
        }
    }

    fn coordinator(&mut self, key_type: i8, key: &str) -> Result<&mut RawClient> {
        let k = (key_type, key.to_string());
        if !self.coordinators.contains_key(&k) {
            let deadline = Instant::now() + Duration::from_secs(60);
            let fc = loop {
                let fc = self.client.request(
                    &FindCoordinatorRequest::default()
                        .with_key(StrBytes::from_string(key.to_string()))
                        .with_key_type(key_type),
                    3,
                )?;
                match fc.error_code {
                    0 => break fc,
                    c if COORDINATOR_RETRIABLE.contains(&c) && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    c => bail!("FindCoordinator({key_type}, {key}): error {c}"),
                }
            };
            let conn = RawClient::connect(format!("{}:{}", fc.host.as_str(), fc.port))?;
            self.coordinators.insert(k.clone(), conn);
        }
        Ok(self.coordinators.get_mut(&k).expect("inserted above"))
    }

    /// Forgets the last recorded step (an answer a bounded poll asks again for).
    pub fn drop_last_step(&mut self) {
        self.steps.pop();
    }

    /// The bootstrap address.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The recorded steps and the API keys of the recorded requests.
    pub fn into_steps(self) -> (Vec<Step>, BTreeSet<i16>) {
        (self.steps, self.api_keys)
    }
}

/// `{:#?}` output with [`MASKED_FIELDS`] replaced by `<masked>` (a masked block, such as a
/// list of replicas, collapses to one line).
pub fn normalize(pretty: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_until_indent: Option<usize> = None;
    for line in pretty.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(i) = skip_until_indent {
            if indent > i {
                continue;
            }
            skip_until_indent = None;
            // the block's closing line
            continue;
        }
        let trimmed = line.trim_start();
        if let Some((field, value)) = trimmed.split_once(": ") {
            if MASKED_FIELDS.contains(&field) {
                out.push(format!("{}{field}: <masked>,", &line[..indent]));
                if value.ends_with('[') || value.ends_with('{') || value.ends_with('(') {
                    skip_until_indent = Some(indent);
                }
                continue;
            }
        }
        out.push(line.to_string());
    }
    out
}

/// Field path of every line: the names of the enclosing fields and the line's own, joined
/// by '.'.
fn paths(lines: &[String]) -> Vec<String> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    lines
        .iter()
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            let trimmed = line.trim_start();
            let field = trimmed
                .split_once(": ")
                .map(|(f, _)| f.to_string())
                .unwrap_or_else(|| {
                    trimmed
                        .trim_end_matches(['{', '[', '(', ','])
                        .trim()
                        .to_string()
                });
            let mut path: Vec<&str> = stack.iter().map(|(_, f)| f.as_str()).collect();
            path.push(&field);
            let joined = path.join(".");
            if trimmed.ends_with('[') || trimmed.ends_with('{') || trimmed.ends_with('(') {
                stack.push((indent, field.clone()));
            }
            joined
        })
        .collect()
}

/// One differing line: which side has it, its field path and text.
#[derive(Clone, Debug)]
pub struct LineDiff {
    /// The step's name.
    pub step: String,
    /// "bundled" or "kafka".
    pub side: &'static str,
    /// Field path.
    pub path: String,
    /// The line.
    pub line: String,
    /// The expected difference that explains it, if any.
    pub explained_by: Option<&'static str>,
}

/// Compares the steps of both runs (by step order; a missing step is a difference).
pub fn compare(bundled: &[Step], kafka: &[Step], expected: &[Expected]) -> Vec<LineDiff> {
    let mut diffs = Vec::new();
    let n = bundled.len().max(kafka.len());
    let empty = Step {
        name: String::new(),
        lines: Vec::new(),
    };
    for i in 0..n {
        let b = bundled.get(i).unwrap_or(&empty);
        let k = kafka.get(i).unwrap_or(&empty);
        let step = if b.name.is_empty() { &k.name } else { &b.name };
        let (bp, kp) = (paths(&b.lines), paths(&k.lines));
        for (side, idx, lines, ps) in lcs_diff(&b.lines, &k.lines).into_iter().map(|(side, idx)| {
            if side == "bundled" {
                (side, idx, &b.lines, &bp)
            } else {
                (side, idx, &k.lines, &kp)
            }
        }) {
            let path = ps[idx].clone();
            let subject = format!("{path} = {}", lines[idx].trim());
            let explained_by = expected
                .iter()
                .find(|e| (e.step == "*" || e.step == step) && subject.contains(e.field))
                .map(|e| e.reason);
            diffs.push(LineDiff {
                step: step.clone(),
                side,
                path,
                line: lines[idx].trim().to_string(),
                explained_by,
            });
        }
    }
    diffs
}

/// Lines of `a` and `b` outside their longest common subsequence: ("bundled", index in a) or
/// ("kafka", index in b).
fn lcs_diff(a: &[String], b: &[String]) -> Vec<(&'static str, usize)> {
    let (n, m) = (a.len(), b.len());
    let mut t = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i][j] = if a[i] == b[j] {
                t[i + 1][j + 1] + 1
            } else {
                t[i + 1][j].max(t[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i] == b[j] {
            i += 1;
            j += 1;
        } else if t[i + 1][j] >= t[i][j + 1] {
            out.push(("bundled", i));
            i += 1;
        } else {
            out.push(("kafka", j));
            j += 1;
        }
    }
    out.extend((i..n).map(|i| ("bundled", i)));
    out.extend((j..m).map(|j| ("kafka", j)));
    out
}

/// A scenario's verdict.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The scenario.
    pub name: &'static str,
    /// Steps recorded (the larger side).
    pub steps: usize,
    /// Every differing line.
    pub diffs: Vec<LineDiff>,
    /// A run that failed outright (connection, decode), per side.
    pub failure: Option<String>,
    /// API keys of the requests recorded on the bundled broker.
    pub api_keys: BTreeSet<i16>,
}

impl Outcome {
    /// "same", "expected differences" or "UNEXPLAINED".
    pub fn verdict(&self) -> &'static str {
        if self.failure.is_some() || self.diffs.iter().any(|d| d.explained_by.is_none()) {
            "UNEXPLAINED"
        } else if self.diffs.is_empty() {
            "same"
        } else {
            "expected differences"
        }
    }
}

/// Runs `scenario` against both brokers and compares; `common` are differences every
/// scenario may show (a field the bundled broker renders differently in every answer).
pub fn run(scenario: &Scenario, common: &[Expected], bundled: &str, kafka: &str) -> Outcome {
    let side = |addr: &str| -> Result<(Vec<Step>, BTreeSet<i16>)> {
        let mut s = Session::new(addr, scenario.name)?;
        (scenario.run)(&mut s)?;
        Ok(s.into_steps())
    };
    match (side(bundled), side(kafka)) {
        (Ok((b, api_keys)), Ok((k, _))) => Outcome {
            name: scenario.name,
            steps: b.len().max(k.len()),
            diffs: compare(&b, &k, &[scenario.expected, common].concat()),
            failure: None,
            api_keys,
        },
        (b, k) => Outcome {
            name: scenario.name,
            steps: 0,
            diffs: Vec::new(),
            failure: Some(format!(
                "bundled: {:?}; kafka: {:?}",
                b.err().map(|e| format!("{e:#}")),
                k.err().map(|e| format!("{e:#}"))
            )),
            api_keys: BTreeSet::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_fields_and_blocks() {
        let text = "X {\n    throttle_time_ms: 5,\n    replica_nodes: [\n        BrokerId(1),\n    ],\n    error_code: 3,\n}";
        assert_eq!(
            normalize(text),
            [
                "X {",
                "    throttle_time_ms: <masked>,",
                "    replica_nodes: <masked>,",
                "    error_code: 3,",
                "}"
            ]
        );
    }

    #[test]
    fn differences_carry_paths_and_reasons() {
        let a = Step { name: "s".into(), lines: normalize("X {\n    topics: [\n        T {\n            error_code: 0,\n        },\n    ],\n}") };
        let b = Step { name: "s".into(), lines: normalize("X {\n    topics: [\n        T {\n            error_code: 3,\n        },\n    ],\n}") };
        let d = compare(std::slice::from_ref(&a), std::slice::from_ref(&b), &[]);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].path, "X.topics.T.error_code");
        let e = [Expected {
            step: "s",
            field: "error_code",
            reason: "r",
        }];
        assert!(compare(&[a], &[b], &e)
            .iter()
            .all(|d| d.explained_by == Some("r")));
    }
}
