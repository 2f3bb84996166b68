//! The broker binary as a child process: spawned on 127.0.0.1 port 0 (the address parsed from
//! its `listening on HOST:PORT` line), kill -9, SIGTERM, restart on the same data dir (on a
//! new port or the same one), and its stderr log to wait on and to quote in failures.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::bins::broker_binary;
use crate::child::Proc;

/// How long a spawned broker may take to print its `listening on` line: generous, so that
/// only a broker that does not start reaches it, not a loaded machine.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a restart on the same port retries while the port is still taken.
pub const SAME_PORT_RETRY: Duration = Duration::from_secs(120);

/// `RUST_LOG` that shows the transaction coordinator's steps (and its test failpoints).
pub const TXN_DEBUG_LOG: &str = "info,onceflow_broker::txn=debug";

/// Where a spawned broker keeps its log.
#[derive(Clone, Debug)]
pub enum Storage {
    /// `--in-memory`.
    InMemory,
    /// `--data-dir PATH --fsync POLICY`.
    Durable {
        /// The data directory (kept across restarts).
        dir: PathBuf,
        /// The `--fsync` flag value, e.g. `every-batch`.
        fsync: String,
    },
}

impl Storage {
    /// A durable data dir with the broker's default fsync policy (`every-batch`).
    pub fn durable(dir: impl Into<PathBuf>) -> Storage {
        Storage::Durable {
            dir: dir.into(),
            fsync: "every-batch".into(),
        }
    }
}

/// How to start a broker: storage, flags, environment, log file.
#[derive(Clone, Debug)]
pub struct BrokerBuilder {
    storage: Storage,
    args: Vec<String>,
    env: Vec<(String, String)>,
    rust_log: Option<String>,
    log: Option<PathBuf>,
}

impl BrokerBuilder {
    /// Extra command-line flags (e.g. `--default-partitions 4`).
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// An extra environment variable (e.g. a test failpoint of the broker).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// `RUST_LOG` of the broker; without it the test's own `RUST_LOG` or `info`.
    pub fn rust_log(mut self, filter: &str) -> Self {
        self.rust_log = Some(filter.to_string());
        self
    }

    /// The file the broker's stderr is appended to, across restarts; without it a file in
    /// a temporary directory owned by the [`BrokerProcess`].
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Spawns the broker on 127.0.0.1 port 0 and waits for its `listening on` line.
    pub fn spawn(self) -> Result<BrokerProcess> {
        let (log, log_dir) = match self.log {
            Some(path) => (path, None),
            None => {
                let dir = tempfile::tempdir().context("log tempdir")?;
                (dir.path().join("broker.log"), Some(dir))
            }
        };
        let mut broker = BrokerProcess {
            proc: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            listeners: Vec::new(),
            bootstrap: String::new(),
            storage: self.storage,
            args: self.args,
            env: self.env,
            rust_log: self.rust_log,
            log,
            _log_dir: log_dir,
            generation: 0,
        };
        broker.spawn_once("127.0.0.1:0")?;
        Ok(broker)
    }
}

/// The broker binary running as a child process of the test; SIGKILLed on drop.
pub struct BrokerProcess {
    proc: Option<Proc>,
    addr: SocketAddr,
    /// `(name, address)` of each listener the broker printed (`listener NAME PROTOCOL on
    /// ADDR` lines, before `listening on`).
    listeners: Vec<(String, SocketAddr)>,
    bootstrap: String,
    storage: Storage,
    args: Vec<String>,
    env: Vec<(String, String)>,
    rust_log: Option<String>,
    log: PathBuf,
    _log_dir: Option<tempfile::TempDir>,
    generation: u32,
}

impl BrokerProcess {
    /// How to start a broker on `storage`; finish with [`BrokerBuilder::spawn`].
    pub fn builder(storage: Storage) -> BrokerBuilder {
        BrokerBuilder {
            storage,
            args: Vec::new(),
            env: Vec::new(),
            rust_log: None,
            log: None,
        }
    }

    /// Spawns the broker on 127.0.0.1 port 0 with `extra_args` and waits for its
    /// `listening on` line.
    pub fn spawn(storage: Storage, extra_args: &[&str]) -> Result<Self> {
        Self::builder(storage).args(extra_args).spawn()
    }

    /// Spawns a broker on the durable `data_dir` with `extra` flags and the transaction
    /// coordinator's debug log (`RUST_LOG=info,onceflow_broker::txn=debug`, for
    /// [`BrokerProcess::wait_for_log`]); panics if it does not start.
    pub fn durable_txn_debug(data_dir: &Path, extra: &[&str]) -> BrokerProcess {
        Self::builder(Storage::durable(data_dir))
            .args(extra)
            .rust_log(TXN_DEBUG_LOG)
            .spawn()
            .expect("broker starts")
    }

    fn spawn_once(&mut self, listen: &str) -> Result<()> {
        let mut cmd = Command::new(broker_binary());
        cmd.arg("--listen").arg(listen);
        match &self.storage {
            Storage::InMemory => {
                cmd.arg("--in-memory");
            }
            Storage::Durable { dir, fsync } => {
                cmd.arg("--data-dir").arg(dir).arg("--fsync").arg(fsync);
            }
        }
        cmd.args(&self.args).env("NO_COLOR", "1");
        match (&self.rust_log, std::env::var_os("RUST_LOG")) {
            (Some(filter), _) => {
                cmd.env("RUST_LOG", filter);
            }
            (None, None) => {
                cmd.env("RUST_LOG", "info");
            }
            (None, Some(_)) => {}
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        // one log across restarts, each run under its own header
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, run_header(self.generation).as_bytes())
            })
            .with_context(|| format!("write {}", self.log.display()))?;
        let mut proc = Proc::try_spawn("broker", cmd, Some(&self.log))?;
        let Some(line) = proc.wait_line(STARTUP_TIMEOUT, |l| l.starts_with("listening on ")) else {
            let status = proc.try_status();
            drop(proc);
            bail!(
                "broker did not print `listening on` within {STARTUP_TIMEOUT:?} (exit status \
                 {status:?}); stderr:\n{}",
                self.log_tail(20_000)
            );
        };
        let rest = line.trim_start_matches("listening on ").trim();
        self.addr = rest.parse().with_context(|| format!("parse {line:?}"))?;
        self.listeners.clear();
        for l in proc.lines() {
            let Some(listener) = l.strip_prefix("listener ") else {
                continue;
            };
            if let [name, _protocol, "on", addr] =
                listener.split_whitespace().collect::<Vec<_>>()[..]
            {
                let addr: SocketAddr = addr.parse().with_context(|| format!("parse {l:?}"))?;
                self.listeners.push((name.to_string(), addr));
            }
        }
        self.bootstrap = rest.to_string();
        self.proc = Some(proc);
        Ok(())
    }

    /// The address the broker printed.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of the listener named `name` (from the broker's `listener NAME
    /// PROTOCOL on ADDR` lines; printed when it has more than one listener).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, addr)| *addr)
    }

    /// `HOST:PORT` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The OS process id of the running child.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// True while the child process has not exited.
    pub fn is_alive(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| p.try_status().is_none())
    }

    /// SIGKILL (kill -9) the child and reap it. Returns true if it was running, false if it
    /// had exited by itself or was not started.
    pub fn kill9(&mut self) -> Result<bool> {
        Ok(self.proc.take().is_some_and(|mut p| p.kill9()))
    }

    /// SIGTERM the child (clean shutdown) and wait up to `timeout` for it to exit.
    /// Returns the exit status; kills it with SIGKILL and fails if it does not exit in time.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let mut proc = self
            .proc
            .take()
            .ok_or_else(|| anyhow!("broker not running"))?;
        proc.term();
        match proc.wait_exit(timeout) {
            Some(status) => Ok(status),
            None => {
                proc.kill9();
                bail!("broker did not exit within {timeout:?} of SIGTERM")
            }
        }
    }

    /// Starts the broker again with the same storage and flags, on the SAME port as before
    /// (clients keep their bootstrap address); kills it first if it runs. Retries the bind
    /// for [`SAME_PORT_RETRY`].
    pub fn restart_same_port(&mut self) -> Result<()> {
        self.kill9()?;
        let listen = self.addr.to_string();
        let deadline = Instant::now() + SAME_PORT_RETRY;
        loop {
            self.generation += 1;
            match self.spawn_once(&listen) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart on {listen} failed, retrying: {e:#}");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(e.context(format!("restart on the same port {listen}"))),
            }
        }
    }

    /// Starts the broker again with the same storage and flags on a new port 0; kills it
    /// first if it runs.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9()?;
        self.generation += 1;
        self.spawn_once("127.0.0.1:0")
    }

    /// The file the broker's stderr goes to (all runs).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The stderr log of the current (or last) run, at most `max` trailing bytes.
    pub fn log_tail(&self, max: usize) -> String {
        let all = self.all_logs();
        let header = run_header(self.generation);
        let text = all
            .rfind(&header)
            .map_or(all.as_str(), |at| &all[at + header.len()..]);
        let start = text.len().saturating_sub(max);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// All stderr logs of all runs, each after a `---- run N ----` line.
    pub fn all_logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log (all runs) holds `needle` (a line the broker logs at the moment a
    /// test wants to act on) `times` times; panics after `timeout`.
    pub fn wait_for_log(&self, needle: &str, times: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.all_logs().matches(needle).count() >= times {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the broker did not log {needle:?} within {timeout:?}; see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The current run's log, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "--- broker log {} (current run, last 8 KiB) ---\n{}",
            self.log.display(),
            self.log_tail(8192)
        )
    }
}

/// The line that opens run `generation` in the broker's log file.
fn run_header(generation: u32) -> String {
    format!("---- run {generation} ----\n")
}
