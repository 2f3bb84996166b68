//! A child process of a test: stdout captured line by line (bounded waits for a line, in
//! order or anywhere), stderr appended to a log file, SIGKILL on drop, SIGTERM / SIGINT /
//! SIGSTOP / SIGCONT; and external commands run to completion within a time bound.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::bins::tail;

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
    stderr_log: Option<PathBuf>,
    status: Option<ExitStatus>,
    /// Lines [`Proc::next_line`] has gone past.
    cursor: usize,
}

impl Proc {
    /// Spawns `cmd` with stdout captured line by line and stderr appended to `stderr_log`;
    /// panics if it cannot be spawned.
    pub fn spawn(name: &str, cmd: Command, stderr_log: &Path) -> Proc {
        Self::try_spawn(name, cmd, Some(stderr_log)).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Proc::spawn`] with stderr discarded.
    pub fn spawn_quiet(name: &str, cmd: Command) -> Proc {
        Self::try_spawn(name, cmd, None).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Spawns `cmd` with stdout captured line by line and stderr appended to `stderr_log`
    /// (discarded if `None`).
    pub fn try_spawn(name: &str, mut cmd: Command, stderr_log: Option<&Path>) -> Result<Proc> {
        let stderr = match stderr_log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("open stderr log {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        let lines = Arc::new(Lines::default());
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout pipe"))?;
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
        Ok(Proc {
            name: name.to_string(),
            child,
            lines,
            stderr_log: stderr_log.map(Path::to_path_buf),
            status: None,
            cursor: 0,
        })
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
    /// `timeout` passes (None). Looks at every line the process printed.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        self.wait_from(0, timeout, pred).map(|(_, line)| line)
    }

    /// [`Proc::wait_line`] over the lines after the one the previous `next_line` returned,
    /// so that successive calls see successive events.
    pub fn next_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let (at, line) = self.wait_from(self.cursor, timeout, pred)?;
        self.cursor = at + 1;
        Some(line)
    }

    /// The first line from index `start` on that satisfies `pred`, with its index.
    fn wait_from(
        &mut self,
        start: usize,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<(usize, String)> {
        let find = |lines: &[String], from: usize| {
            lines
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, l)| pred(l))
                .map(|(i, l)| (i, l.clone()))
        };
        let deadline = Instant::now() + timeout;
        let mut seen = start;
        loop {
            {
                let lines = self.lines.lines.lock().unwrap();
                if let Some(found) = find(&lines, seen) {
                    return Some(found);
                }
                seen = seen.max(lines.len());
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
                return find(&lines, seen);
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
        self.signal("-TERM");
    }

    /// SIGINT (Ctrl-C).
    pub fn interrupt(&mut self) {
        self.signal("-INT");
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
        if let Some(Ok(mut f)) = self.stderr_log.as_ref().map(std::fs::File::open) {
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
            self.stderr_log
                .as_ref()
                .map_or("none".into(), |p| p.display().to_string()),
            self.stderr_tail(40)
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

/// Runs an external command with optional stdin, killing it if it runs past `timeout`.
/// Returns (exit status, stdout, stderr).
pub fn run_bounded(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String)> {
    use std::io::Write;
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
