//! Test hooks at the steps of the commit protocol. With the `failpoints` feature the
//! environment variable `ONCEFLOW_FAILPOINT=<name>:<checkpoint>` aborts the process at that
//! step of that checkpoint, so end-to-end tests can crash a job at an exact moment:
//!
//! - `after-checkpoint-complete:N`: checkpoint N is complete (sealed), the sinks have not
//!   committed it;
//! - `before-seal:N`: checkpoint N's metadata is durable, it is not sealed (it never counts).
//!
//! Without the feature every hook is a no-op and the variable is ignored.

/// Aborts the process if the failpoint `name` is armed for `checkpoint`.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str, checkpoint: u64) {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        let v = std::env::var("ONCEFLOW_FAILPOINT").ok()?;
        let (n, c) = v.rsplit_once(':')?;
        Some((n.trim().to_string(), c.trim().parse().ok()?))
    });
    if armed
        .as_ref()
        .is_some_and(|(n, c)| n == name && *c == checkpoint)
    {
        eprintln!("failpoint {name}:{checkpoint}: aborting the process");
        std::process::abort();
    }
}

/// Failpoints are compiled out without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &str, _checkpoint: u64) {}
