//! Test failpoints of the cleaner. With the environment variable
//! `ONCEFLOW_TEST_CLEANER_FAILPOINT` set to `before-swap` or `mid-swap` (read once, at the
//! first point reached), the cleaner logs `test failpoint: cleaner before swap` (or
//! `... mid swap`) at that step and pauses there, so a crash test can kill the process at
//! exactly that moment. Unset, a failpoint costs one cached comparison.

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that arms a failpoint.
pub const ENV: &str = "ONCEFLOW_TEST_CLEANER_FAILPOINT";
/// How long an armed failpoint pauses (long enough for a test to kill the process).
const PAUSE: Duration = Duration::from_secs(60);

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Logs and pauses if the failpoint `name` ("cleaner before swap") is armed
/// (`ONCEFLOW_TEST_CLEANER_FAILPOINT=before-swap`).
pub fn hit(name: &str) {
    let Some(armed) = armed() else {
        return;
    };
    if name.trim_start_matches("cleaner ").replace(' ', "-") == armed {
        tracing::warn!(pause = ?PAUSE, "test failpoint: {name}");
        std::thread::sleep(PAUSE);
    }
}
