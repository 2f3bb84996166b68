//! The broker binary as a child process: spawn on port 0 (parsing `listening on HOST:PORT`),
//! kill -9, SIGTERM, restart on the same data dir (and optionally the same port).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// How long a spawned broker may take to print its `listening on` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable naming a broker binary to run instead of the one cargo built.
pub const BROKER_BIN_ENV: &str = "ONCEFLOW_BROKER_BIN";

/// Path of the broker binary: `$ONCEFLOW_BROKER_BIN` if set, else the one cargo built for
/// these tests.
pub fn broker_binary() -> PathBuf {
    match std::env::var_os(BROKER_BIN_ENV) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_BIN_EXE_onceflow-broker")),
    }
}

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

/// The broker binary running as a child process of the test.
pub struct BrokerProcess {
    child: Option<Child>,
    addr: SocketAddr,
    listeners: Vec<(String, SocketAddr)>,
    storage: Storage,
    extra_args: Vec<String>,
    log_dir: tempfile::TempDir,
    generation: u32,
}

impl BrokerProcess {
    /// Spawns the broker on 127.0.0.1 port 0 and waits for its `listening on` line.
    pub fn spawn(storage: Storage, extra_args: &[&str]) -> Result<Self> {
        let log_dir = tempfile::tempdir().context("log tempdir")?;
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let (child, addr, listeners) = spawn_child(
            &storage,
            &extra_args,
            "127.0.0.1:0",
            &log_dir.path().join("broker-0.log"),
        )?;
        Ok(Self {
            child: Some(child),
            addr,
            listeners,
            storage,
            extra_args,
            log_dir,
            generation: 0,
        })
    }

    /// The address the broker printed.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of the listener named `name` (from the broker's
    /// `listener NAME PROTOCOL on ADDR` lines).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, addr)| *addr)
    }

    /// `HOST:PORT` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    /// The OS process id of the running child.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True while the child process has not exited.
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL (kill -9) the child and reap it.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().context("SIGKILL broker")?;
            child.wait().context("reap broker")?;
        }
        Ok(())
    }

    /// SIGTERM the child (clean shutdown) and wait up to `timeout` for it to exit.
    /// Returns the exit status; kills it with SIGKILL and fails if it does not exit in time.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("broker not running"))?;
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .context("run kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM failed: {status}");
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("broker did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the broker again with the same storage and flags, on the SAME port as before
    /// (clients keep their bootstrap address). Retries the bind for a few seconds.
    pub fn restart_same_port(&mut self) -> Result<()> {
        self.kill9()?;
        let listen = self.addr.to_string();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            self.generation += 1;
            let log = self
                .log_dir
                .path()
                .join(format!("broker-{}.log", self.generation));
            match spawn_child(&self.storage, &self.extra_args, &listen, &log) {
                Ok((child, addr, listeners)) => {
                    self.child = Some(child);
                    self.addr = addr;
                    self.listeners = listeners;
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart on {listen} failed, retrying: {e:#}");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(e.context(format!("restart on the same port {listen}"))),
            }
        }
    }

    /// Starts the broker again with the same storage and flags on a new port 0.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9()?;
        self.generation += 1;
        let log = self
            .log_dir
            .path()
            .join(format!("broker-{}.log", self.generation));
        let (child, addr, listeners) =
            spawn_child(&self.storage, &self.extra_args, "127.0.0.1:0", &log)?;
        self.listeners = listeners;
        self.child = Some(child);
        self.addr = addr;
        Ok(())
    }

    /// The stderr log of the current (or last) run, at most `max` trailing bytes.
    pub fn log_tail(&self, max: usize) -> String {
        let path = self
            .log_dir
            .path()
            .join(format!("broker-{}.log", self.generation));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let start = text.len().saturating_sub(max);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// All stderr logs of all runs, concatenated.
    pub fn all_logs(&self) -> String {
        let mut out = String::new();
        for g in 0..=self.generation {
            let path = self.log_dir.path().join(format!("broker-{g}.log"));
            out.push_str(&format!("---- run {g} ----\n"));
            out.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
        out
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_child(
    storage: &Storage,
    extra: &[String],
    listen: &str,
    log: &Path,
) -> Result<(Child, SocketAddr, Vec<(String, SocketAddr)>)> {
    let mut cmd = Command::new(broker_binary());
    cmd.arg("--listen").arg(listen);
    match storage {
        Storage::InMemory => {
            cmd.arg("--in-memory");
        }
        Storage::Durable { dir, fsync } => {
            cmd.arg("--data-dir").arg(dir).arg("--fsync").arg(fsync);
        }
    }
    cmd.args(extra);
    cmd.env("NO_COLOR", "1");
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    let log_file = File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", broker_binary().display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    let (tx, rx) = mpsc::channel::<String>();
    // Reads stdout until EOF so the pipe never fills; forwards the `listening on` line.
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        while let Ok(n) = reader.read_line(&mut line) {
            if n == 0 {
                break;
            }
            let _ = tx.send(line.trim_end().to_string());
            line.clear();
        }
    });
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    // `listener NAME PROTOCOL on ADDR` lines come before `listening on`.
    let mut listeners = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("listener ") {
                    let parts: Vec<&str> = rest.split_whitespace().collect();
                    if let [name, _protocol, "on", addr] = parts[..] {
                        let addr: SocketAddr =
                            addr.parse().with_context(|| format!("parse {line:?}"))?;
                        listeners.push((name.to_string(), addr));
                    }
                }
                if let Some(rest) = line.strip_prefix("listening on ") {
                    let addr: SocketAddr = rest
                        .trim()
                        .parse()
                        .with_context(|| format!("parse {line:?}"))?;
                    return Ok((child, addr, listeners));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait()?;
                let log = std::fs::read_to_string(log).unwrap_or_default();
                bail!("broker exited ({status}) before listening; stderr:\n{log}");
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            bail!("broker exited ({status}) before listening; stderr:\n{log}");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(log).unwrap_or_default();
            bail!("broker did not print `listening on` within {STARTUP_TIMEOUT:?}; stderr:\n{log}");
        }
    }
}

/// Runs an external command with optional stdin, killing it if it runs past `timeout`.
/// Returns (exit status, stdout, stderr).
pub fn run_bounded(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String)> {
    use std::io::{Read, Write};
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawn {cmd:?}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).context("write stdin")?;
    }
    let mut out_pipe = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut err_pipe = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err_reader.join().unwrap_or_default();
            bail!("{cmd:?} ran past {timeout:?}; stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

/// The first of `names` found as an executable on PATH.
pub fn find_on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// The workspace root (the broker crate's parent directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
