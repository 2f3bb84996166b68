//! Apache Kafka 4.4 as a child process of a test: one KRaft node (broker and controller in one
//! JVM) on free loopback ports, started through `scripts/apache-kafka.sh run` (which resolves
//! the jars with Maven from `testkit/apache-kafka/pom.xml`, formats the storage once and
//! `exec`s java, so this child's pid is the JVM's), kill -9, SIGTERM, and restart on the same
//! data and the same ports.
//!
//! Readiness is Kafka's own `Kafka Server started` line on stdout; a node that does not print
//! it within [`STARTUP_TIMEOUT`] fails the test with the tail of its log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};

use crate::bins::workspace_root;
use crate::child::Proc;

/// How long a node may take to print `Kafka Server started` (a cold JVM on a loaded 2-core
/// machine takes 5-15 s; the first run also waits for Maven).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

/// The Kafka release the launcher resolves (testkit/apache-kafka/pom.xml).
pub const KAFKA_VERSION: &str = "4.4.0";

/// How a node is configured at its first start (format time) and every start.
#[derive(Clone, Debug)]
pub struct KafkaOptions {
    /// The cluster's `transaction.version` feature: 2 (transactions v2, KIP-890, the 4.x
    /// default) or 0 (the 3.x rules).
    pub transaction_version: u8,
    /// Extra `server.properties` lines (`key=value`).
    pub properties: Vec<String>,
    /// Extra launcher flags (see `scripts/apache-kafka.sh`).
    pub launcher_args: Vec<String>,
    /// A secured node: the client listener speaks SASL_SSL with the StandardAuthorizer and
    /// `allow.everyone.if.no.acl.found=false`, its certificate and users from this TLS
    /// directory (`server.pem`, `server.key`, `ca.pem`, `scram-users.txt`); next to it a
    /// PLAINTEXT listener for the harness, whose anonymous principal is a super user, is what
    /// [`KafkaNode::bootstrap`] names ([`KafkaNode::client_bootstrap`] names the secured one).
    pub sasl_ssl_tls_dir: Option<PathBuf>,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        KafkaOptions {
            transaction_version: 2,
            properties: Vec::new(),
            launcher_args: Vec::new(),
            sasl_ssl_tls_dir: None,
        }
    }
}

/// A running (or killed) Apache Kafka node; SIGKILLed on drop.
pub struct KafkaNode {
    proc: Option<Proc>,
    dir: PathBuf,
    port: u16,
    controller_port: u16,
    options: KafkaOptions,
    log: PathBuf,
    generation: u32,
    /// The PLAINTEXT harness listener of a secured node.
    harness_port: Option<u16>,
    bootstrap: String,
    client_bootstrap: String,
}

/// The launcher script.
pub fn launcher() -> PathBuf {
    workspace_root().join("scripts/apache-kafka.sh")
}

/// A free port on 127.0.0.1 (bound and released; the node binds it a moment later).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a free port")?;
    Ok(l.local_addr()?.port())
}

impl KafkaNode {
    /// Formats (first start) and starts a node whose data and logs live in `dir`, and waits
    /// until it serves.
    pub fn start(dir: &Path, options: KafkaOptions) -> Result<KafkaNode> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let harness_port = match options.sasl_ssl_tls_dir {
            Some(_) => Some(free_port()?),
            None => None,
        };
        let mut node = KafkaNode {
            proc: None,
            dir: dir.to_path_buf(),
            port: free_port()?,
            controller_port: free_port()?,
            options,
            log: dir.join("kafka.stderr.log"),
            generation: 0,
            harness_port,
            bootstrap: String::new(),
            client_bootstrap: String::new(),
        };
        node.client_bootstrap = format!("127.0.0.1:{}", node.port);
        node.bootstrap = format!("127.0.0.1:{}", harness_port.unwrap_or(node.port));
        node.spawn_once()?;
        Ok(node)
    }

    fn spawn_once(&mut self) -> Result<()> {
        let mut cmd = Command::new("bash");
        cmd.arg(launcher())
            .arg("run")
            .arg("--dir")
            .arg(&self.dir)
            .args(["--port", &self.port.to_string()])
            .args(["--controller-port", &self.controller_port.to_string()])
            .args([
                "--transaction-version",
                &self.options.transaction_version.to_string(),
            ])
            .args(&self.options.launcher_args);
        if let (Some(tls), Some(harness)) = (&self.options.sasl_ssl_tls_dir, self.harness_port) {
            cmd.args(["--security", "sasl-ssl", "--tls-dir"])
                .arg(tls)
                .args(["--plaintext-port", &harness.to_string()]);
        }
        for p in &self.options.properties {
            cmd.args(["--set", p]);
        }
        // Kafka's INFO log, kept with the scenario's other logs (testkit/apache-kafka/log4j2.properties)
        cmd.env("KAFKA_LOG_FILE", self.dir.join("kafka.out.log"));
        let mut proc = Proc::try_spawn(
            &format!("apache-kafka run {}", self.generation),
            cmd,
            Some(&self.log),
        )?;
        let started = proc.wait_line(STARTUP_TIMEOUT, |l| l.contains("Kafka Server started"));
        if started.is_none() {
            let status = proc.try_status();
            let out = proc.lines().join("\n");
            drop(proc);
            bail!(
                "Apache Kafka did not print `Kafka Server started` within {STARTUP_TIMEOUT:?} \
                 (exit status {status:?}); stdout:\n{out}\nstderr:\n{}",
                crate::bins::tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 40)
            );
        }
        self.proc = Some(proc);
        Ok(())
    }

    /// `127.0.0.1:PORT` for `bootstrap.servers` of the harness: the client listener, or on a
    /// secured node the PLAINTEXT harness listener.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// `127.0.0.1:PORT` of the client listener (SASL_SSL on a secured node).
    pub fn client_bootstrap(&self) -> &str {
        &self.client_bootstrap
    }

    /// Creates ACL bindings through CreateAcls over the harness listener. Each line is in the
    /// bundled broker's `--acl-file` format: `principal host operation permission
    /// resource-type pattern-type name`, e.g. `User:alice * Read Allow Topic literal in`.
    pub fn create_acls(&self, lines: &[String]) -> Result<()> {
        use kafka_protocol::messages::create_acls_request::AclCreation;
        use kafka_protocol::messages::CreateAclsRequest;
        use kafka_protocol::protocol::StrBytes;
        let mut creations = Vec::new();
        for line in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [principal, host, operation, permission, resource_type, pattern, name] = f[..]
            else {
                bail!("ACL line {line:?}: expected 7 fields");
            };
            creations.push(
                AclCreation::default()
                    .with_principal(StrBytes::from_string(principal.into()))
                    .with_host(StrBytes::from_string(host.into()))
                    .with_operation(acl_code(ACL_OPERATIONS, operation, line)?)
                    .with_permission_type(acl_code(&[("Deny", 2), ("Allow", 3)], permission, line)?)
                    .with_resource_type(acl_code(ACL_RESOURCE_TYPES, resource_type, line)?)
                    .with_resource_pattern_type(acl_code(
                        &[("literal", 3), ("prefixed", 4)],
                        pattern,
                        line,
                    )?)
                    .with_resource_name(StrBytes::from_string(name.into())),
            );
        }
        let mut c = crate::raw::RawClient::connect(self.bootstrap())?;
        let r = c.request(&CreateAclsRequest::default().with_creations(creations), 3)?;
        for (line, res) in lines.iter().zip(&r.results) {
            if res.error_code != 0 {
                bail!(
                    "CreateAcls refused {line:?}: error {} {:?}",
                    res.error_code,
                    res.error_message
                );
            }
        }
        Ok(())
    }

    /// The client listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's directory (`server.properties`, `data/`, the logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The JVM's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// True while the JVM has not exited.
    pub fn is_alive(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| p.try_status().is_none())
    }

    /// kill -9 of the JVM. Returns true if it was running.
    pub fn kill9(&mut self) -> bool {
        self.proc.take().is_some_and(|mut p| p.kill9())
    }

    /// SIGTERM (Kafka's controlled shutdown) and a wait of up to `timeout`; SIGKILL and an
    /// error past it.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let mut proc = self
            .proc
            .take()
            .ok_or_else(|| anyhow!("Apache Kafka is not running"))?;
        proc.term();
        match proc.wait_exit(timeout) {
            Some(status) => Ok(status),
            None => {
                proc.kill9();
                bail!("Apache Kafka did not exit within {timeout:?} of SIGTERM")
            }
        }
    }

    /// Starts the node again on the same data and ports (kill -9 first if it runs). Retries
    /// while the port is still held by the dead JVM's sockets.
    pub fn restart_same_port(&mut self) -> Result<()> {
        self.kill9();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            self.generation += 1;
            match self.spawn_once() {
                Ok(()) => return Ok(()),
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("Apache Kafka restart failed, retrying: {e:#}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e.context("restart Apache Kafka on the same ports")),
            }
        }
    }

    /// A Kafka command-line tool (`kafka-transactions`, `kafka-topics`, ... or a class name)
    /// against this node, bounded by `timeout`; returns (exit success, stdout, stderr).
    pub fn tool(&self, name: &str, args: &[&str], timeout: Duration) -> Result<ToolOutput> {
        run_tool(name, args, timeout)
    }

    /// The node's stdout (Kafka's WARN and ERROR lines) and stderr, for assertion messages.
    pub fn describe(&self) -> String {
        let out = self
            .proc
            .as_ref()
            .map(|p| crate::bins::tail(&p.lines().join("\n"), 30))
            .unwrap_or_default();
        format!(
            "--- Apache Kafka {KAFKA_VERSION} in {} (run {}; transaction.version={}) ---\n\
             {out}\n--- stderr ---\n{}",
            self.dir.display(),
            self.generation,
            self.options.transaction_version,
            crate::bins::tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 20)
        )
    }
}

/// What a Kafka command-line tool printed.
#[derive(Debug)]
pub struct ToolOutput {
    /// Exit status 0.
    pub success: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs a Kafka command-line tool through the launcher (`scripts/apache-kafka.sh tool`),
/// against any broker the arguments name; SIGKILLed past `timeout`.
pub fn run_tool(name: &str, args: &[&str], timeout: Duration) -> Result<ToolOutput> {
    let mut cmd = Command::new("bash");
    cmd.arg(launcher()).arg("tool").arg(name).args(args);
    let (status, stdout, stderr) = crate::child::run_bounded(&mut cmd, None, timeout)
        .with_context(|| format!("run the Kafka tool {name} {args:?}"))?;
    Ok(ToolOutput {
        success: status.success(),
        stdout,
        stderr,
    })
}

/// Kafka's AclOperation codes by name.
const ACL_OPERATIONS: &[(&str, i8)] = &[
    ("All", 2),
    ("Read", 3),
    ("Write", 4),
    ("Create", 5),
    ("Delete", 6),
    ("Alter", 7),
    ("Describe", 8),
    ("ClusterAction", 9),
    ("DescribeConfigs", 10),
    ("AlterConfigs", 11),
    ("IdempotentWrite", 12),
];

/// Kafka's ResourceType codes by name.
const ACL_RESOURCE_TYPES: &[(&str, i8)] = &[
    ("Topic", 2),
    ("Group", 3),
    ("Cluster", 4),
    ("TransactionalId", 5),
];

fn acl_code(table: &[(&str, i8)], name: &str, line: &str) -> Result<i8> {
    table
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, c)| *c)
        .ok_or_else(|| anyhow!("ACL line {line:?}: unknown {name:?}"))
}
