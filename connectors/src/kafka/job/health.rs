//! What `/healthz`, `/readyz` and `/status` answer: liveness of the process, readiness of the
//! job (its dataflow runs, and its last checkpoint is recent), and the job's figures.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::outputs::Progress;

use onceflow_runtime::CheckpointId;

/// The job's readiness, updated by the job as its dataflow starts, checkpoints and stops.
///
/// Ready means: state restored and every sink recovered (`job started`), the input assigned
/// (a scaled-out instance is not ready between two dataflows), and the newest completed
/// checkpoint (or, before the first, the start of the dataflow) no older than the bound.
#[derive(Debug)]
pub(crate) struct Health {
    bound: Duration,
    started: Instant,
    /// What `/status` says of the job's configuration (name, mode, topics, ...).
    identity: Mutex<Value>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Records read when the last dataflow stopped (a scaled-out instance's dataflows carry
    /// the count on, so this is the process's total then).
    processed_at_stop: u64,
    /// The running dataflow's counters.
    processed: Option<Weak<Progress>>,
    completed: u64,
    failed: u64,
    failed_in_a_row: u64,
    /// The newest checkpoint completed by any dataflow of this process, and when (Unix ms).
    newest: Option<(CheckpointId, u128)>,
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
            started: Instant::now(),
            identity: Mutex::new(Value::Null),
            state: Mutex::new(State {
                phase: "restoring state and recovering the sinks",
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets what `/status` reports of the job's configuration.
    pub(crate) fn set_identity(&self, identity: Value) {
        *self.identity.lock().unwrap_or_else(|e| e.into_inner()) = identity;
    }

    /// The dataflow runs: state restored, sinks recovered, input assigned; `processed`
    /// counts the records it reads.
    pub(crate) fn running(&self, processed: Weak<Progress>) {
        let mut s = self.state();
        s.running_since = Some(Instant::now());
        s.last_checkpoint = None;
        s.processed = Some(processed);
    }

    /// The dataflow stopped (`phase` says why, e.g. a new assignment being built).
    pub(crate) fn stopped(&self, phase: &'static str) {
        let mut s = self.state();
        if let Some(p) = s.processed.take() {
            s.processed_at_stop = count(&p);
        }
        s.running_since = None;
        s.last_checkpoint = None;
        s.phase = phase;
    }

    /// Checkpoint `n` completed.
    pub(crate) fn checkpoint_completed(&self, n: CheckpointId) {
        let mut s = self.state();
        s.last_checkpoint = Some((n, Instant::now()));
        s.newest = Some((n, unix_millis()));
        s.completed += 1;
        s.failed_in_a_row = 0;
    }

    /// Checkpoint `n` failed (the job goes on unless the failures exceed its tolerance).
    pub(crate) fn checkpoint_failed(&self, _n: CheckpointId) {
        let mut s = self.state();
        s.failed += 1;
        s.failed_in_a_row += 1;
    }

    /// What `/status` answers: the job's configuration, its state, readiness, records read
    /// and checkpoints.
    pub(crate) fn status(&self) -> Value {
        let readiness = self.readiness();
        let identity = self
            .identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let s = self.state();
        let processed = s.processed.as_ref().map_or(s.processed_at_stop, count);
        let state = if s.running_since.is_some() {
            "running"
        } else {
            s.phase
        };
        let last = s.newest.map(|(id, at)| {
            json!({
                "id": id,
                "completed_at_unix_ms": at,
                "age_seconds": (unix_millis().saturating_sub(at)) as f64 / 1000.0,
            })
        });
        json!({
            "job": identity,
            "state": state,
            "ready": readiness.is_ok(),
            "readiness": match &readiness { Ok(w) | Err(w) => w.clone() },
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "records_processed": processed,
            "checkpoints": {
                "completed": s.completed,
                "failed": s.failed,
                "failed_in_a_row": s.failed_in_a_row,
                "last": last,
                "ready_bound_seconds": self.bound.as_secs_f64(),
            },
        })
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

fn count(p: &Weak<Progress>) -> u64 {
    p.upgrade()
        .map_or(0, |p| p.processed.load(Ordering::Relaxed))
}

fn unix_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The checkpoint listener of a job's dataflow: tells `health`, prints `checkpoint N
/// complete` (the stdout contract), and hits the `after-checkpoint-complete` failpoint.
pub(crate) fn checkpoint_listener(
    health: &std::sync::Arc<Health>,
) -> impl Fn(onceflow_runtime::CheckpointEvent) + Send + Sync + 'static {
    use onceflow_runtime::CheckpointEvent;
    let health = health.clone();
    move |ev| match ev {
        CheckpointEvent::Failed(n) => health.checkpoint_failed(n),
        CheckpointEvent::Completed(n) => {
            health.checkpoint_completed(n);
            super::say(format!("checkpoint {n} complete"));
            super::failpoint::hit("after-checkpoint-complete", n);
        }
        CheckpointEvent::Triggered(_) => {}
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
        let progress = std::sync::Arc::new(Progress::default());
        progress.processed.store(5, Ordering::Relaxed);
        h.running(std::sync::Arc::downgrade(&progress));
        let since = h.state().running_since.unwrap();
        assert!(h.readiness_at(since + Duration::from_secs(9)).is_ok());
        let late = h.readiness_at(since + Duration::from_secs(11)).unwrap_err();
        assert!(late.contains("no checkpoint completed"), "{late}");
        h.checkpoint_completed(7);
        let at = h.state().last_checkpoint.unwrap().1;
        assert!(h.readiness_at(at).unwrap().contains("checkpoint 7"));
        let stale = h.readiness_at(at + Duration::from_secs(11)).unwrap_err();
        assert!(stale.contains("the last checkpoint, 7"), "{stale}");
        h.checkpoint_failed(8);
        let status = h.status();
        assert_eq!(status["state"], "running");
        assert_eq!(status["records_processed"], 5);
        assert_eq!(status["checkpoints"]["completed"], 1);
        assert_eq!(status["checkpoints"]["failed_in_a_row"], 1);
        assert_eq!(status["checkpoints"]["last"]["id"], 7);
        h.stopped("building the dataflow of a new assignment");
        assert!(h.readiness_at(at).unwrap_err().contains("new assignment"));
        let status = h.status();
        assert_eq!(status["state"], "building the dataflow of a new assignment");
        assert_eq!(status["records_processed"], 5, "counted across dataflows");
        assert_eq!(status["ready"], false);
    }

    #[test]
    fn the_default_bound_is_two_checkpoint_rounds() {
        assert_eq!(
            default_bound(Duration::from_secs(1), Duration::from_secs(29)),
            Duration::from_secs(60)
        );
    }
}
