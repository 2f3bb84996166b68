//! A sink that leaves its pre-commit flushing (`PreCommit::Flushing`): the runtime writes the
//! next checkpoint's records while the flush runs, acknowledges a checkpoint only after its
//! flush ended, and every record is committed exactly once with the checkpoint it belongs to.
//!
//! The verdict depends on events only: a flush ends when the sink is handed a record written
//! after the flush started (or when the source has ended, for the last checkpoint), and the
//! source writes group `c` of records only after it took barrier `c`. One checkpoint runs at
//! a time, so the flush of checkpoints 1-4 can only end through a later record.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceflow_runtime::{
    async_trait, CheckpointId, JobConfig, PreCommit, Result, Sink, Source, SourcePoll,
    StreamEnvironment, SubtaskInfo,
};
use tokio::sync::{oneshot, watch};

const GROUP: u64 = 100;
/// Groups 0..=LAST; group `c` follows barrier `c`.
const LAST: u64 = 5;

/// Writes group 0 at once and group `c` after barrier `c`; ends after group LAST.
struct Grouped {
    next_group: u64,
    barriers_seen: u64,
    ended: watch::Sender<bool>,
}

#[async_trait]
impl Source<u64> for Grouped {
    type Position = u64;
    fn restore(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn poll(&mut self, out: &mut Vec<u64>, _max: usize) -> Result<SourcePoll> {
        if self.next_group > LAST {
            self.ended.send_replace(true);
            return Ok(SourcePoll::Exhausted);
        }
        if self.next_group > self.barriers_seen {
            return Ok(SourcePoll::Idle(Duration::from_millis(1)));
        }
        let g = self.next_group;
        out.extend(g * GROUP..(g + 1) * GROUP);
        self.next_group += 1;
        Ok(SourcePoll::Ready)
    }
    fn snapshot_position(&mut self, c: CheckpointId) -> Result<u64> {
        self.barriers_seen = self.barriers_seen.max(c);
        Ok(self.next_group)
    }
}

#[derive(Default)]
struct Log {
    /// How each flush ended ("write" or "end"), by checkpoint.
    flush_ended: HashMap<CheckpointId, &'static str>,
    /// Committed checkpoints and their records.
    committed: BTreeMap<CheckpointId, Vec<u64>>,
    /// Broken promises of the runtime.
    violations: Vec<String>,
}

struct FlushingSink {
    open: Vec<u64>,
    sealed: HashMap<CheckpointId, Vec<u64>>,
    release: Option<oneshot::Sender<&'static str>>,
    flushing: Option<CheckpointId>,
    source_ended: watch::Receiver<bool>,
    log: Arc<Mutex<Log>>,
}

#[async_trait]
impl Sink<u64> for FlushingSink {
    type Pending = Vec<u64>;
    async fn recover(&mut self, _p: Vec<Vec<u64>>) -> Result<()> {
        Ok(())
    }
    async fn write_batch(&mut self, records: Vec<u64>) -> Result<()> {
        // the first record after a flush started ends it
        if let Some(tx) = self.release.take() {
            let _ = tx.send("write");
        }
        self.open.extend(records);
        Ok(())
    }
    async fn pre_commit(&mut self, c: CheckpointId) -> Result<Option<Vec<u64>>> {
        self.log.lock().unwrap().violations.push(format!(
            "pre_commit({c}) called instead of start_pre_commit"
        ));
        Ok(None)
    }
    async fn start_pre_commit(&mut self, c: CheckpointId) -> Result<PreCommit<Vec<u64>>> {
        if let Some(f) = self.flushing {
            self.log.lock().unwrap().violations.push(format!(
                "start_pre_commit({c}) while checkpoint {f} was still flushing"
            ));
        }
        if self.open.is_empty() {
            return Ok(PreCommit::Done(None));
        }
        self.sealed.insert(c, std::mem::take(&mut self.open));
        let (tx, rx) = oneshot::channel();
        self.release = Some(tx);
        self.flushing = Some(c);
        let mut ended = self.source_ended.clone();
        let log = self.log.clone();
        Ok(PreCommit::Flushing(Box::pin(async move {
            let how = tokio::select! {
                r = rx => r.unwrap_or("dropped"),
                _ = ended.wait_for(|e| *e) => "end",
            };
            log.lock().unwrap().flush_ended.insert(c, how);
        })))
    }
    async fn finish_pre_commit(&mut self, c: CheckpointId) -> Result<Option<Vec<u64>>> {
        let mut log = self.log.lock().unwrap();
        if !log.flush_ended.contains_key(&c) {
            log.violations
                .push(format!("finish_pre_commit({c}) before its flush ended"));
        }
        if self.flushing != Some(c) {
            log.violations.push(format!(
                "finish_pre_commit({c}) but {:?} was flushing",
                self.flushing
            ));
        }
        self.flushing = None;
        self.release = None;
        Ok(self.sealed.remove(&c))
    }
    async fn commit(&mut self, c: CheckpointId, p: Vec<u64>) -> Result<()> {
        let mut log = self.log.lock().unwrap();
        if !log.flush_ended.contains_key(&c) {
            log.violations
                .push(format!("checkpoint {c} completed before its flush ended"));
        }
        log.committed.insert(c, p);
        Ok(())
    }
    async fn abort(&mut self, _p: Vec<u64>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn flushing_pre_commits_overlap_the_next_records_and_ack_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (ended_tx, ended_rx) = watch::channel(false);
    let source = Mutex::new(Some(ended_tx));
    let log = Arc::new(Mutex::new(Log::default()));
    let log2 = log.clone();
    let env = StreamEnvironment::new(
        JobConfig::new("sink-flushing")
            .checkpoint_interval(Duration::from_millis(5))
            .checkpoint_dir(dir.path()),
    );
    env.source("grouped", move |_: &SubtaskInfo| {
        Ok(Grouped {
            next_group: 0,
            barriers_seen: 0,
            ended: source.lock().unwrap().take().expect("one source subtask"),
        })
    })
    .sink("flushing", move |_: &SubtaskInfo| {
        Ok(FlushingSink {
            open: Vec::new(),
            sealed: HashMap::new(),
            release: None,
            flushing: None,
            source_ended: ended_rx.clone(),
            log: log2.clone(),
        })
    });
    let r = env.execute_blocking().expect("job");
    let log = log.lock().unwrap();
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    // every record committed exactly once
    let mut all: Vec<u64> = log.committed.values().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..(LAST + 1) * GROUP).collect::<Vec<_>>(), "{r:?}");
    // group c-1 is exactly what checkpoint c committed, and its flush overlapped group c
    for c in 1..=LAST {
        let g = c - 1;
        assert_eq!(
            log.committed.get(&c),
            Some(&(g * GROUP..(g + 1) * GROUP).collect::<Vec<_>>()),
            "checkpoint {c}: {:?}",
            log.committed.keys().collect::<Vec<_>>()
        );
        // group LAST is followed by the end of the input, which may end its flush first
        if c < LAST {
            assert_eq!(
                log.flush_ended.get(&c),
                Some(&"write"),
                "checkpoint {c}'s flush should end through the next group's first record"
            );
        }
    }
}
