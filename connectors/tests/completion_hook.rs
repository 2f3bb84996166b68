//! The runtime's [`CompletionHook`]: checkpoint n is published as complete (listener event,
//! sink commit) only after the hook sealed it; a failing seal fails the job, no sink commits
//! that checkpoint and its files stay on disk for the next run to judge.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use onceflow_connectors::{read_committed_lines, CollectSink, FileSink, Generator};
use onceflow_operators::Map;
use onceflow_runtime::{
    async_trait, CheckpointEvent, CheckpointId, CompletionHook, Error, JobConfig, RestoreMode,
    StopHandle, StreamEnvironment,
};
use parking_lot::Mutex;

/// Records what happened, in order; refuses to seal `refuse`.
struct Hook {
    log: Arc<Mutex<Vec<String>>>,
    refuse: Option<CheckpointId>,
}

#[async_trait]
impl CompletionHook for Hook {
    async fn seal(&self, id: CheckpointId) -> onceflow_runtime::Result<()> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if Some(id) == self.refuse {
            self.log.lock().push(format!("refused {id}"));
            return Err(Error::Connector(format!("fenced: checkpoint {id} refused")));
        }
        self.log.lock().push(format!("sealed {id}"));
        Ok(())
    }
}

/// Runs the job. With `hold`, the source holds back the second half of its input and the job
/// stops (final checkpoint) once checkpoint 3 completed: it cannot end before checkpoint 3
/// however fast or loaded the machine is.
fn job(
    dir: &std::path::Path,
    refuse: Option<CheckpointId>,
    restore: RestoreMode,
    hold: bool,
) -> (
    onceflow_runtime::Result<onceflow_runtime::JobResult>,
    Vec<String>,
) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (l2, l3) = (log.clone(), log.clone());
    let stop: Arc<OnceLock<StopHandle>> = Arc::new(OnceLock::new());
    let s2 = stop.clone();
    let config = JobConfig::new("hooked")
        .parallelism(2)
        .checkpoint_interval(Duration::from_millis(30))
        .checkpoint_dir(dir)
        .retained_checkpoints(10)
        .restore(restore)
        .completion_hook(Arc::new(Hook { log: l2, refuse }))
        .checkpoint_listener(move |ev| {
            if let CheckpointEvent::Completed(n) = ev {
                l3.lock().push(format!("complete {n}"));
                if hold && n >= 3 {
                    if let Some(h) = s2.get() {
                        h.stop();
                    }
                }
            }
        });
    let env = StreamEnvironment::new(config);
    let _ = stop.set(env.stop_handle());
    let mut numbers = Generator::new(3_000, |i| i)
        .splits(2)
        .rate_per_second(10_000.0);
    if hold {
        numbers = numbers.pause_at(1_500);
    }
    let sink: CollectSink<u64> = CollectSink::new();
    env.source("numbers", numbers)
        .map(|i: u64| i * 2)
        .sink("collect", sink);
    let r = env.execute_blocking();
    let events = log.lock().clone();
    (r, events)
}

#[test]
fn every_checkpoint_is_sealed_before_it_is_complete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, events) = job(dir.path(), None, RestoreMode::None, true);
    let r = r.expect("job");
    assert!(r.completed_checkpoints >= 3, "{events:?}");
    let mut sealed = 0;
    for (i, e) in events.iter().enumerate() {
        if let Some(n) = e.strip_prefix("complete ") {
            assert_eq!(
                events.get(i.wrapping_sub(1)).map(String::as_str),
                Some(format!("sealed {n}").as_str()),
                "checkpoint {n} was published before its seal: {events:?}"
            );
            sealed += 1;
        }
    }
    assert_eq!(sealed as u64, r.completed_checkpoints, "{events:?}");
}

#[test]
fn a_failed_seal_fails_the_job_and_keeps_the_checkpoint_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, events) = job(dir.path(), Some(3), RestoreMode::None, true);
    match r {
        Err(Error::CheckpointFailed { checkpoint, reason }) => {
            assert_eq!(checkpoint, 3);
            assert!(reason.contains("fenced"), "{reason}");
        }
        other => panic!("expected the job to fail at checkpoint 3, got {other:?}; {events:?}"),
    }
    assert!(events.contains(&"complete 2".to_string()), "{events:?}");
    assert!(
        !events.iter().any(|e| e == "complete 3"),
        "checkpoint 3 was published although its seal failed: {events:?}"
    );
    let meta = dir
        .path()
        .join(format!("chk-{:020}", 3))
        .join(onceflow_runtime::checkpoint::storage::METADATA_FILE);
    assert!(meta.exists(), "{} was removed", meta.display());
    // the next run decides from its own record: here it restores 2 and completes again
    let (r, events) = job(dir.path(), None, RestoreMode::Checkpoint(2), false);
    let r = r.expect("restored job");
    assert_eq!(r.restored_from, Some(2), "{events:?}");
}

/// Records every checkpoint it seals (as Kafka would, durably) and then reports an error for
/// each: a seal that committed although its caller saw a failure (a client timeout).
struct SealsThenFails(Arc<Mutex<Vec<CheckpointId>>>);

#[async_trait]
impl CompletionHook for SealsThenFails {
    async fn seal(&self, id: CheckpointId) -> onceflow_runtime::Result<()> {
        self.0.lock().push(id);
        // the caller's timeout: by now the sinks wait for the verdict on their pre-commits
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err(Error::Connector(format!(
            "timed out waiting for the seal of checkpoint {id} (it did commit)"
        )))
    }
}

#[test]
fn a_seal_that_commits_and_then_fails_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let sealed = Arc::new(Mutex::new(Vec::new()));
    // no periodic checkpoint: the only one is the final checkpoint at the end of the input
    let config = JobConfig::new("sealed-then-failed")
        .parallelism(2)
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_dir(dir.path().join("checkpoints"))
        .completion_hook(Arc::new(SealsThenFails(sealed.clone())));
    let env = StreamEnvironment::new(config);
    env.source("numbers", Generator::new(3_000, |i| i).splits(2))
        .sink("files", FileSink::new(&out));
    let err = env
        .execute_blocking()
        .expect_err("the seal reported a failure");
    assert!(err.to_string().contains("sealing failed"), "{err}");
    let sealed = sealed.lock().clone();
    assert_eq!(sealed.len(), 1, "{sealed:?}");
    assert!(
        read_committed_lines(&out).unwrap_or_default().is_empty(),
        "nothing is committed by a run whose seal failed"
    );

    // The next start believes the seal's own record (here: it committed), restores that
    // checkpoint and commits its pre-committed output: it must still be there.
    let config = JobConfig::new("sealed-then-failed")
        .parallelism(2)
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_dir(dir.path().join("checkpoints"))
        .restore(RestoreMode::Checkpoint(sealed[0]));
    let env = StreamEnvironment::new(config);
    env.source("numbers", Generator::new(3_000, |i| i).splits(2))
        .sink("files", FileSink::new(&out));
    let r = env.execute_blocking().expect("restored run");
    assert_eq!(r.restored_from, Some(sealed[0]));
    let mut got: Vec<u64> = read_committed_lines(&out)
        .expect("output")
        .iter()
        .map(|l| l.parse().expect("number"))
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        (0..3_000).collect::<Vec<_>>(),
        "every record exactly once"
    );
}
