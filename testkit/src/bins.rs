//! The binaries the tests run as child processes: the broker and the example jobs.
//!
//! A test finds them whether cargo built them for it or not: `ONCEFLOW_BROKER_BIN` names a
//! broker binary to use as it is; the integration tests of `onceflow-broker` get the binary
//! cargo built for them (`CARGO_BIN_EXE_onceflow-broker`, which cargo sets while it builds
//! and runs them); every other test builds the broker and the examples once per test process
//! with `cargo build` (same profile and target dir as the test executable, so a fresh clone's
//! `cargo test --workspace` works). Built binaries are hard-linked into a private directory
//! right after the build: the target dir may be shared with other worktrees whose builds
//! replace the uplifted binaries while the tests run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Environment variable naming a broker binary to run instead of the one cargo built.
pub const BROKER_BIN_ENV: &str = "ONCEFLOW_BROKER_BIN";

/// Environment variable that skips `cargo build` and takes the binaries as built (e.g. a loop
/// of test runs while other builds hold the target dir lock for minutes).
pub const PREBUILT_ENV: &str = "ONCEFLOW_EOS_PREBUILT";

/// The broker binary: `$ONCEFLOW_BROKER_BIN` if set, else the one cargo built for the
/// running integration test of `onceflow-broker`, else [`bins`]' pinned build.
pub fn broker_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(BROKER_BIN_ENV) {
        return PathBuf::from(path);
    }
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_onceflow-broker") {
        return PathBuf::from(path);
    }
    bins().broker.clone()
}

/// Paths of the binaries built for this test run.
#[derive(Debug)]
pub struct Bins {
    /// The pinned `target/<profile>/onceflow-broker`.
    pub broker: PathBuf,
    /// The pinned `target/<profile>/examples/exactly_once_etl`.
    pub job: PathBuf,
}

static BINS: OnceLock<Result<Bins, String>> = OnceLock::new();

/// Builds the broker binary and the example `exactly_once_etl` once per test process and
/// returns their pinned paths. The broker is built together with the example, always: a
/// `cargo build` of the broker package alone resolves other features and recompiles the
/// broker and its dependencies (minutes of CI).
pub fn bins() -> &'static Bins {
    match BINS.get_or_init(build_bins) {
        Ok(bins) => bins,
        Err(e) => panic!("{e}"),
    }
}

/// Builds `examples/<name>.rs` of the `onceflow` package (same profile and target dir as the
/// test executable) once per test process and returns a pinned copy of the binary.
pub fn example_bin(name: &str) -> PathBuf {
    if name == "exactly_once_etl" {
        return bins().job.clone();
    }
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    bins();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let layout = TargetLayout::of_test().unwrap_or_else(|e| panic!("{e}"));
    layout
        .cargo_build(&["--example", name, "-p", "onceflow"])
        .unwrap_or_else(|e| panic!("{e}"));
    let pinned = layout
        .pin(&layout.profile_dir.join("examples").join(name), name)
        .unwrap_or_else(|e| panic!("{e}"));
    built.insert(name.to_string(), pinned.clone());
    pinned
}

fn build_bins() -> Result<Bins, String> {
    let layout = TargetLayout::of_test()?;
    layout.cargo_build(&[
        "--example",
        "exactly_once_etl",
        "-p",
        "onceflow",
        "--bin",
        "onceflow-broker",
        "-p",
        "onceflow-broker",
    ])?;
    let broker = layout.pin(
        &layout.profile_dir.join("onceflow-broker"),
        "onceflow-broker",
    )?;
    let job = layout.pin(
        &layout.profile_dir.join("examples").join("exactly_once_etl"),
        "exactly_once_etl",
    )?;
    Ok(Bins { broker, job })
}

/// Where the running test executable was built: `target/<profile>/deps/<test>-<hash>`.
struct TargetLayout {
    profile_dir: PathBuf,
    target_dir: PathBuf,
    profile: String,
    /// Private directory of this test executable's pinned binaries.
    private: PathBuf,
}

impl TargetLayout {
    fn of_test() -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| format!("unexpected test executable path {}", exe.display()))?
            .to_path_buf();
        let target_dir = profile_dir
            .parent()
            .ok_or_else(|| format!("no target dir above {}", profile_dir.display()))?
            .to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debug")
            .to_string();
        let exe_name = exe
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("test")
            .to_string();
        let private = profile_dir.join("eos-test-bins").join(exe_name);
        std::fs::create_dir_all(&private).map_err(|e| format!("{}: {e}", private.display()))?;
        Ok(Self {
            profile_dir,
            target_dir,
            profile,
            private,
        })
    }

    /// `cargo build ARGS` in this profile and target dir (not run under `ONCEFLOW_EOS_PREBUILT`).
    fn cargo_build(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.arg("build")
            .args(args)
            .arg("--target-dir")
            .arg(&self.target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        match self.profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let prebuilt = std::env::var_os(PREBUILT_ENV).is_some();
        eprintln!(
            "[testkit] {}: {cmd:?}",
            if prebuilt {
                "ONCEFLOW_EOS_PREBUILT, not running"
            } else {
                "building"
            }
        );
        if prebuilt {
            return Ok(());
        }
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run cargo build: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "cargo build {args:?} failed ({}):\n{}",
                out.status,
                tail(&stderr, 60)
            ));
        }
        Ok(())
    }

    /// Hard-links (or copies) `built` into the private directory as `name`.
    fn pin(&self, built: &Path, name: &str) -> Result<PathBuf, String> {
        let link = self.private.join(name);
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(built, &link)
            .or_else(|_| std::fs::copy(built, &link).map(|_| ()))
            .map_err(|e| format!("built binary {}: {e}", built.display()))?;
        Ok(link)
    }
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The workspace root (the test kit's parent directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
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
