//! Child processes of the exactly-once tests: building the binaries once, the broker child
//! (port 0, restartable on the same port and data dir) and the example job child (stdout
//! lines captured, stderr logged to a file, SIGKILL / SIGTERM, bounded waits).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Paths of the binaries built for this test run.
#[derive(Debug)]
pub struct Bins {
    /// `target/<profile>/onceflow-broker`.
    pub broker: PathBuf,
    /// `target/<profile>/examples/exactly_once_etl`.
    pub job: PathBuf,
}

static BINS: OnceLock<Result<Bins, String>> = OnceLock::new();

/// Builds the broker binary and the example once per test process (same profile and target
/// dir as this test executable) and returns their paths.
pub fn bins() -> &'static Bins {
    match BINS.get_or_init(build) {
        Ok(bins) => bins,
        Err(e) => panic!("{e}"),
    }
}

/// The broker binary. Built together with the example, always: a `cargo build` of the broker
/// package alone resolves other features and recompiled the broker and its dependencies
/// (about 2.5 minutes of CI for `eos_checker`).
pub fn broker_bin() -> &'static Path {
    &bins().broker
}

fn build() -> Result<Bins, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test executable path {}", exe.display()))?
        .to_path_buf();
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("no target dir above {}", profile_dir.display()))?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.arg("build");
    cmd.args(["--example", "exactly_once_etl", "-p", "onceflow"]);
    cmd.args(["--bin", "onceflow-broker", "-p", "onceflow-broker"])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    // ONCEFLOW_EOS_PREBUILT: the binaries are built already (e.g. a loop of test runs while
    // other builds hold the target dir lock for minutes); take them as they are
    let prebuilt = std::env::var_os("ONCEFLOW_EOS_PREBUILT").is_some();
    eprintln!(
        "[eos] {}: {cmd:?}",
        if prebuilt {
            "ONCEFLOW_EOS_PREBUILT, not running"
        } else {
            "building"
        }
    );
    let out = if prebuilt {
        Command::new("true").output()
    } else {
        cmd.output()
    }
    .map_err(|e| format!("cannot run cargo build: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "cargo build of the example and the broker failed ({}):\n{}",
            out.status,
            tail(&stderr, 60)
        ));
    }
    // The target dir is shared with other worktrees, whose builds replace the uplifted
    // binaries; hard links taken right after this build keep this worktree's inodes.
    let exe_name = exe
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("eos")
        .to_string();
    let private = profile_dir.join("eos-test-bins").join(exe_name);
    std::fs::create_dir_all(&private).map_err(|e| format!("{}: {e}", private.display()))?;
    let pin = |built: PathBuf, name: &str| -> Result<PathBuf, String> {
        let link = private.join(name);
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&built, &link)
            .or_else(|_| std::fs::copy(&built, &link).map(|_| ()))
            .map_err(|e| format!("built binary {}: {e}", built.display()))?;
        Ok(link)
    };
    let broker = pin(profile_dir.join("onceflow-broker"), "onceflow-broker")?;
    let job = pin(
        profile_dir.join("examples").join("exactly_once_etl"),
        "exactly_once_etl",
    )?;
    Ok(Bins { broker, job })
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Lines a child printed on stdout, shared with the reader thread.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
    /// Set once stdout reached its end (the process and anything sharing the pipe exited).
    closed: std::sync::atomic::AtomicBool,
}

impl Lines {
    /// Waits until the reader saw the end of stdout (bounded against a grandchild holding the
    /// pipe open), so that the lines are all a dead process printed.
    fn wait_closed(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut lines = self.lines.lock().unwrap();
        while !self.closed.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
            lines = self
                .changed
                .wait_timeout(lines, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

/// A child process that is SIGKILLed when dropped (no leaked processes on panics).
pub struct Proc {
    name: String,
    child: Child,
    lines: Arc<Lines>,
    stderr_log: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `cmd` with stdout captured line by line and stderr appended to `stderr_log`.
    pub fn spawn(name: &str, mut cmd: Command, stderr_log: &Path) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr_log)
            .expect("open stderr log");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let lines = Arc::new(Lines::default());
        let stdout = child.stdout.take().expect("piped stdout");
        let reader_lines = Arc::clone(&lines);
        let tag = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if std::env::var_os("ONCEFLOW_EOS_VERBOSE").is_some() {
                    eprintln!("[{tag}] {line}");
                }
                reader_lines.lines.lock().unwrap().push(line);
                reader_lines.changed.notify_all();
            }
            let _guard = reader_lines.lines.lock().unwrap();
            reader_lines
                .closed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            reader_lines.changed.notify_all();
        });
        Proc {
            name: name.to_string(),
            child,
            lines,
            stderr_log: stderr_log.to_path_buf(),
            status: None,
        }
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A copy of the stdout lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lines.lock().unwrap().clone()
    }

    /// Waits until a stdout line satisfies `pred` (returns it), the process exits (None) or
    /// `timeout` passes (None).
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            {
                let lines = self.lines.lines.lock().unwrap();
                if let Some(l) = lines[seen..].iter().find(|l| pred(l)) {
                    return Some(l.clone());
                }
                seen = lines.len();
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                let wait = (deadline - now).min(Duration::from_millis(100));
                drop(self.lines.changed.wait_timeout(lines, wait).unwrap());
            }
            if self.try_status().is_some() {
                // try_status waited for the end of stdout: look once more at the last lines
                let lines = self.lines.lines.lock().unwrap();
                return lines[seen..].iter().find(|l| pred(l)).cloned();
            }
        }
    }

    /// The exit status if the process has exited.
    /// Once it reports an exit, [`Self::lines`] holds every line the process printed.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
            if self.status.is_some() {
                self.lines.wait_closed();
            }
        }
        self.status
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_status() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `timeout` for the process to exit by itself with a failure (non-zero code or
    /// a signal); panics, saying `why` it should have, if it runs on or succeeds.
    pub fn expect_failure(&mut self, timeout: Duration, why: &str) -> ExitStatus {
        let Some(status) = self.wait_exit(timeout) else {
            panic!(
                "{} still runs after {} s; expected it to stop: {why}\n{}",
                self.name,
                timeout.as_secs(),
                self.describe()
            );
        };
        assert!(
            !status.success(),
            "{} exited with success ({status}); expected a failure: {why}\n{}",
            self.name,
            self.describe()
        );
        status
    }

    /// SIGKILL (kill -9) and reap. Returns false if it had already exited.
    pub fn kill9(&mut self) -> bool {
        if self.try_status().is_some() {
            return false;
        }
        let _ = self.child.kill();
        self.status = Some(self.child.wait().expect("wait after kill"));
        self.lines.wait_closed();
        true
    }

    /// SIGTERM (graceful stop request).
    pub fn term(&mut self) {
        if self.try_status().is_some() {
            return;
        }
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
    }

    /// SIGTERM, then waits up to `timeout` for exit code 0 (a final checkpoint and commit).
    pub fn stop_gracefully(&mut self, timeout: Duration) {
        self.term();
        let status = self.wait_exit(timeout);
        assert!(
            status.is_some_and(|s| s.success()),
            "SIGTERM did not stop {} with exit 0 within {} s (status {status:?})\n{}",
            self.name,
            timeout.as_secs(),
            self.describe()
        );
    }

    /// Sends `sig` (e.g. `-STOP`) with kill(1).
    fn signal(&self, sig: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    /// SIGSTOP, then waits until every thread of the process is stopped (kill(2) only queues
    /// the signal), so that nothing it does changes state any more: files, sockets and stdout
    /// are what they will be at a SIGKILL now. Returns false if the process had exited.
    pub fn suspend(&mut self) -> bool {
        if self.try_status().is_some() {
            return false;
        }
        self.signal("-STOP");
        let tasks = PathBuf::from(format!("/proc/{}/task", self.pid()));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let stopped = std::fs::read_dir(&tasks).ok().is_some_and(|dir| {
                dir.flatten().all(|t| {
                    // `pid (comm) S ...`: the state follows the last ')'
                    std::fs::read_to_string(t.path().join("stat"))
                        .ok()
                        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
                        .is_none_or(|r| r.starts_with('T') || r.starts_with('t'))
                })
            });
            if stopped {
                return true;
            }
            if self.try_status().is_some() {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not stop within 120 s of SIGSTOP",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGCONT after [`Self::suspend`].
    pub fn resume(&mut self) {
        if self.try_status().is_none() {
            self.signal("-CONT");
        }
    }

    /// Freezes the process (SIGSTOP) for `d`, then lets it go on (SIGCONT): a stall such as a
    /// long GC pause or an overloaded host.
    pub fn freeze(&mut self, d: Duration) {
        if self.suspend() {
            std::thread::sleep(d);
            self.resume();
        }
    }

    /// The last `n` lines of the stderr log (for failure messages).
    pub fn stderr_tail(&self, n: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr_log) {
            let _ = f.read_to_string(&mut s);
        }
        tail(&s, n)
    }

    /// Everything this process printed (stdout lines and stderr tail), for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "--- {} stdout (last 30) ---\n{}\n--- {} stderr (last 40, log {}) ---\n{}",
            self.name,
            tail(&self.lines().join("\n"), 30),
            self.name,
            self.stderr_log.display(),
            self.stderr_tail(40)
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

/// The broker child: `onceflow-broker --listen ... --data-dir ...`.
pub struct Broker {
    proc: Option<Proc>,
    addr: String,
    data_dir: PathBuf,
    log: PathBuf,
    extra: Vec<String>,
}

impl Broker {
    /// Starts a broker on port 0 with a durable data dir under `dir` (4 partitions per
    /// auto-created topic) and `extra` flags.
    pub fn start(dir: &Path, extra: &[&str]) -> Broker {
        let data_dir = dir.join("broker-data");
        std::fs::create_dir_all(&data_dir).expect("broker data dir");
        let mut b = Broker {
            proc: None,
            addr: "127.0.0.1:0".to_string(),
            data_dir,
            log: dir.join("broker.stderr.log"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        b.spawn_once().expect("broker starts");
        b
    }

    fn spawn_once(&mut self) -> Result<(), String> {
        let mut cmd = Command::new(broker_bin());
        cmd.args(["--listen", &self.addr, "--data-dir"])
            .arg(&self.data_dir)
            .args(["--default-partitions", "4"])
            .args(&self.extra)
            .env(
                "RUST_LOG",
                std::env::var("ONCEFLOW_EOS_BROKER_LOG").unwrap_or_else(|_| "warn".into()),
            );
        let mut p = Proc::spawn("broker", cmd, &self.log);
        match p.wait_line(Duration::from_secs(120), |l| l.starts_with("listening on ")) {
            Some(line) => {
                self.addr = line.trim_start_matches("listening on ").trim().to_string();
                self.proc = Some(p);
                Ok(())
            }
            None => Err(format!("broker did not start listening\n{}", p.describe())),
        }
    }

    /// The address of the broker's listener of `protocol` (`SASL_SSL`, ...), from its
    /// `listener NAME PROTOCOL on ADDR` start-up lines.
    pub fn listener(&mut self, protocol: &str) -> Option<String> {
        let parse = |l: &str| -> Option<String> {
            let mut words = l.strip_prefix("listener ")?.split_whitespace();
            let (_name, proto, on, addr) =
                (words.next()?, words.next()?, words.next()?, words.next()?);
            (proto.eq_ignore_ascii_case(protocol) && on == "on").then(|| addr.to_string())
        };
        let line = self
            .proc
            .as_mut()?
            .wait_line(Duration::from_secs(60), |l| parse(l).is_some())?;
        parse(&line)
    }

    /// `127.0.0.1:PORT` for clients.
    pub fn bootstrap(&self) -> &str {
        &self.addr
    }

    /// The process id of the running broker.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// kill -9 of the broker process.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            assert!(p.kill9(), "broker had exited by itself\n{}", p.describe());
        }
    }

    /// Restarts the broker on the same address and data dir (retries while the port is busy).
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self.spawn_once() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("broker restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
}

/// Flags of one run of the example job.
#[derive(Debug, Clone)]
pub struct JobArgs {
    /// `--mode`.
    pub mode: String,
    /// `--input`.
    pub input: String,
    /// `--output`.
    pub output: String,
    /// `--group`.
    pub group: String,
    /// `--checkpoint-dir`.
    pub checkpoint_dir: PathBuf,
    /// `--checkpoint-interval-ms`.
    pub checkpoint_interval_ms: u64,
    /// `--parallelism`.
    pub parallelism: u32,
    /// `--transactional-id-prefix`.
    pub prefix: String,
    /// `--transaction-timeout-ms` (None: the job's default).
    pub transaction_timeout_ms: Option<u64>,
    /// Extra environment (e.g. ONCEFLOW_FAILPOINT).
    pub env: Vec<(String, String)>,
    /// Extra command-line arguments (e.g. `--metrics-listen ADDR`).
    pub extra_args: Vec<String>,
    /// Directory for the job's stderr logs.
    pub log_dir: PathBuf,
    /// `--brokers` of the job when it differs from the harness's bootstrap (e.g. a secured
    /// listener while the harness reads and writes over PLAINTEXT).
    pub brokers: Option<String>,
}

impl JobArgs {
    /// Defaults for a test scenario rooted at `dir`.
    pub fn new(mode: &str, dir: &Path) -> JobArgs {
        JobArgs {
            mode: mode.to_string(),
            input: "eos-input".into(),
            output: "eos-output".into(),
            group: format!("eos-group-{mode}"),
            checkpoint_dir: dir.join("checkpoints"),
            checkpoint_interval_ms: 500,
            parallelism: 2,
            prefix: format!("eos-{mode}"),
            transaction_timeout_ms: None,
            env: Vec::new(),
            extra_args: Vec::new(),
            log_dir: dir.to_path_buf(),
            brokers: None,
        }
    }

    /// The DLQ topic.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.output)
    }
}

/// Spawns the example job against `bootstrap`; `run` names its stderr log.
pub fn spawn_job(bootstrap: &str, args: &JobArgs, run: &str) -> Proc {
    let mut cmd = Command::new(&bins().job);
    cmd.args(["--brokers", args.brokers.as_deref().unwrap_or(bootstrap)])
        .args(["--input", &args.input])
        .args(["--output", &args.output])
        .args(["--group", &args.group])
        .args(["--mode", &args.mode])
        .arg("--checkpoint-dir")
        .arg(&args.checkpoint_dir)
        .args([
            "--checkpoint-interval-ms",
            &args.checkpoint_interval_ms.to_string(),
        ])
        .args(["--parallelism", &args.parallelism.to_string()])
        .args(["--transactional-id-prefix", &args.prefix])
        .env(
            "RUST_LOG",
            std::env::var("ONCEFLOW_EOS_JOB_LOG").unwrap_or_else(|_| "info".into()),
        );
    if let Some(t) = args.transaction_timeout_ms {
        cmd.args(["--transaction-timeout-ms", &t.to_string()]);
    }
    cmd.args(&args.extra_args);
    for (k, v) in &args.env {
        cmd.env(k, v);
    }
    let log = args.log_dir.join(format!("job-{run}.stderr.log"));
    Proc::spawn(&format!("job {run}"), cmd, &log)
}

/// The largest N of stdout lines containing `checkpoint N committed`.
pub fn last_committed(lines: &[String]) -> Option<u64> {
    lines
        .iter()
        .filter_map(|l| checkpoint_number(l, "committed"))
        .max()
}

/// N if `line` contains `checkpoint N <word>`.
pub fn checkpoint_number(line: &str, word: &str) -> Option<u64> {
    let at = line.find("checkpoint ")?;
    let rest = &line[at + "checkpoint ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let after = rest[digits.len()..].trim_start();
    if digits.is_empty() || !after.starts_with(word) {
        return None;
    }
    digits.parse().ok()
}
