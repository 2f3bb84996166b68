//! A stop requested while the job is still being set up (its sinks recovering) is not lost:
//! the job takes a final checkpoint as soon as it runs and ends cleanly. Job binaries report
//! that they started from inside the sinks' recovery, and a supervisor may send SIGTERM from
//! that moment on; before, such a SIGTERM killed the process (no handler yet) and a stop
//! handle's request went unseen (the coordinator subscribed after it).
//!
//! Each test runs an endless source, so a lost stop shows as a job that never ends; the
//! thread running it is given a generous bound to fail the test instead of hanging it.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceflow_runtime::{
    async_trait, CheckpointId, JobConfig, JobResult, Result, Sink, Source, SourcePoll, StopHandle,
    StreamEnvironment, SubtaskInfo,
};

/// Never exhausted.
struct Endless(u64);

#[async_trait]
impl Source<u64> for Endless {
    type Position = u64;
    fn restore(&mut self, p: Vec<u64>) -> Result<()> {
        self.0 = p.into_iter().max().unwrap_or(0);
        Ok(())
    }
    async fn poll(&mut self, out: &mut Vec<u64>, _max: usize) -> Result<SourcePoll> {
        out.push(self.0);
        self.0 += 1;
        Ok(SourcePoll::Idle(Duration::from_millis(1)))
    }
    fn snapshot_position(&mut self, _c: CheckpointId) -> Result<u64> {
        Ok(self.0)
    }
}

/// Runs `on_recover` in its recovery (the moment a job binary reports it started) and
/// records the checkpoints it commits.
struct StopInRecovery {
    on_recover: Arc<dyn Fn() + Send + Sync>,
    committed: Arc<Mutex<Vec<CheckpointId>>>,
}

#[async_trait]
impl Sink<u64> for StopInRecovery {
    type Pending = ();
    async fn recover(&mut self, _p: Vec<()>) -> Result<()> {
        (self.on_recover)();
        Ok(())
    }
    async fn write_batch(&mut self, _r: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn pre_commit(&mut self, _c: CheckpointId) -> Result<Option<()>> {
        Ok(Some(()))
    }
    async fn commit(&mut self, c: CheckpointId, _p: ()) -> Result<()> {
        self.committed.lock().unwrap().push(c);
        Ok(())
    }
    async fn abort(&mut self, _p: ()) -> Result<()> {
        Ok(())
    }
}

/// Runs a job whose sink calls `on_recover(stop handle)` during set-up; returns its result
/// and the checkpoints the sink committed.
fn run(
    config: JobConfig,
    on_recover: impl Fn(&StopHandle) + Send + Sync + 'static,
) -> (JobResult, Vec<CheckpointId>) {
    let (tx, rx) = mpsc::channel();
    let committed = Arc::new(Mutex::new(Vec::new()));
    let seen = committed.clone();
    std::thread::spawn(move || {
        let env = StreamEnvironment::new(config);
        let stop = env.stop_handle();
        let on_recover: Arc<dyn Fn() + Send + Sync> = Arc::new(move || on_recover(&stop));
        env.source("endless", |_: &SubtaskInfo| Ok(Endless(0)))
            .sink("stopper", move |_: &SubtaskInfo| {
                Ok(StopInRecovery {
                    on_recover: on_recover.clone(),
                    committed: seen.clone(),
                })
            });
        let _ = tx.send(env.execute_blocking());
    });
    let result = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the job did not end: the stop requested during set-up was lost")
        .expect("the job failed");
    let committed = committed.lock().unwrap().clone();
    (result, committed)
}

#[test]
fn a_stop_handle_used_during_set_up_ends_the_job_with_a_final_checkpoint() {
    // a long interval: only the stop can make a checkpoint happen soon
    let config = JobConfig::new("stop-in-setup").checkpoint_interval(Duration::from_secs(3600));
    let (result, committed) = run(config, |stop| stop.stop());
    assert_eq!(result.completed_checkpoints, 1, "{result:?}");
    assert_eq!(committed.len(), 1, "the final checkpoint was not committed");
}

#[test]
fn sigterm_during_set_up_ends_the_job_with_a_final_checkpoint() {
    let config = JobConfig::new("sigterm-in-setup")
        .checkpoint_interval(Duration::from_secs(3600))
        .stop_on_sigterm(true);
    let (result, committed) = run(config, |_| {
        let pid = std::process::id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM {pid}: {status}");
    });
    assert_eq!(result.completed_checkpoints, 1, "{result:?}");
    assert_eq!(committed.len(), 1, "the final checkpoint was not committed");
}
