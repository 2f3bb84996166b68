//! What `/healthz` and `/readyz` answer: liveness of the process, and readiness of the job
//! (its dataflow runs, and its last checkpoint is recent).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use onceflow_runtime::CheckpointId;

/// The job's readiness, updated by the job as its dataflow starts, checkpoints and stops.
///
/// Ready means: state restored and every sink recovered (`job started`), the input assigned
/// (a scaled-out instance is not ready between two dataflows), and the newest completed
/// checkpoint (or, before the first, the start of the dataflow) no older than the bound.
#[derive(Debug)]
pub(crate) struct Health {
    bound: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the running dataflow printed `job started`; `None` while none runs.
    running_since: Option<Instant>,
    /// The newest completed checkpoint of the running dataflow and when it completed.
    last_checkpoint: Option<(CheckpointId, Instant)>,
    /// Why the job is not running, shown by `/readyz`.
    phase: &'static str,
}

impl Health {
    /// Readiness with `bound` as the largest age of the last completed checkpoint.
    pub(crate) fn new(bound: Duration) -> Self {
        Health {
            bound,
            state: Mutex::new(State {
                phase: "restoring state and recovering the sinks",
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The dataflow runs: state restored, sinks recovered, input assigned.
    pub(crate) fn running(&self) {
        let mut s = self.state();
        s.running_since = Some(Instant::now());
        s.last_checkpoint = None;
    }

    /// The dataflow stopped (`phase` says why, e.g. a new assignment being built).
    pub(crate) fn stopped(&self, phase: &'static str) {
        let mut s = self.state();
        s.running_since = None;
        s.last_checkpoint = None;
        s.phase = phase;
    }

    /// Checkpoint `n` completed.
    pub(crate) fn checkpoint_completed(&self, n: CheckpointId) {
        self.state().last_checkpoint = Some((n, Instant::now()));
    }

    /// `Ok(why ready)` or `Err(why not)`, as `/readyz` says it.
    pub(crate) fn readiness(&self) -> Result<String, String> {
        self.readiness_at(Instant::now())
    }

    fn readiness_at(&self, now: Instant) -> Result<String, String> {
        let s = self.state();
        let Some(since) = s.running_since else {
            return Err(format!("not ready: {}", s.phase));
        };
        let bound = self.bound.as_secs_f64();
        match s.last_checkpoint {
            Some((n, at)) => {
                let age = now.saturating_duration_since(at).as_secs_f64();
                if age <= bound {
                    Ok(format!(
                        "ready: checkpoint {n} completed {age:.1} s ago (bound {bound:.1} s)"
                    ))
                } else {
                    Err(format!(
                        "not ready: the last checkpoint, {n}, completed {age:.1} s ago (bound {bound:.1} s)"
                    ))
                }
            }
            None => {
                let age = now.saturating_duration_since(since).as_secs_f64();
                if age <= bound {
                    Ok(format!(
                        "ready: started {age:.1} s ago, no checkpoint completed yet (bound {bound:.1} s)"
                    ))
                } else {
                    Err(format!(
                        "not ready: started {age:.1} s ago and no checkpoint completed since (bound {bound:.1} s)"
                    ))
                }
            }
        }
    }
}

/// The default bound of `/readyz`: two checkpoint rounds (interval plus checkpoint timeout
/// each), so one slow or failed checkpoint does not turn the job unready, a second does.
pub(crate) fn default_bound(interval: Duration, checkpoint_timeout: Duration) -> Duration {
    (interval + checkpoint_timeout) * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_running_with_a_recent_checkpoint() {
        let h = Health::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(h.readiness_at(t0).unwrap_err().contains("restoring state"));
        h.running();
        let since = h.state().running_since.unwrap();
        assert!(h.readiness_at(since + Duration::from_secs(9)).is_ok());
        let late = h.readiness_at(since + Duration::from_secs(11)).unwrap_err();
        assert!(late.contains("no checkpoint completed"), "{late}");
        h.checkpoint_completed(7);
        let at = h.state().last_checkpoint.unwrap().1;
        assert!(h.readiness_at(at).unwrap().contains("checkpoint 7"));
        let stale = h.readiness_at(at + Duration::from_secs(11)).unwrap_err();
        assert!(stale.contains("the last checkpoint, 7"), "{stale}");
        h.stopped("building the dataflow of a new assignment");
        assert!(h.readiness_at(at).unwrap_err().contains("new assignment"));
    }

    #[test]
    fn the_default_bound_is_two_checkpoint_rounds() {
        assert_eq!(
            default_bound(Duration::from_secs(1), Duration::from_secs(29)),
            Duration::from_secs(60)
        );
    }
}
