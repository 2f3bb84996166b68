//! A replayable source over indexed records split into a fixed number of splits: subtask `i`
//! of `p` reads the splits `s` with `s % p == i`; split `s` yields indices `s, s + n, s + 2n..`.
//! Positions are per split, so a job can restore at another parallelism.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_runtime::{async_trait, CheckpointId, Result, Source, SourcePoll, SubtaskInfo};
use serde::{Deserialize, Serialize};

/// Produces the record at an index.
pub type IndexFn<T> = Arc<dyn Fn(u64) -> T + Send + Sync>;

/// The next index to read within one split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPosition {
    /// Split number.
    pub split: u32,
    /// Records of this split already emitted.
    pub next: u64,
}

/// One subtask of an indexed source.
pub struct IndexedSource<T> {
    produce: IndexFn<T>,
    len: Option<u64>,
    total_splits: u32,
    owned: Vec<SplitPosition>,
    cursor: usize,
    rate_per_subtask: Option<f64>,
    started: Instant,
    emitted_since_start: u64,
    pause_at: Option<u64>,
}

impl<T> IndexedSource<T> {
    /// Subtask `info.index` over `len` records (`None`: unbounded) in `splits` splits,
    /// optionally limited to `rate` records/s over all subtasks.
    pub fn new(
        produce: IndexFn<T>,
        len: Option<u64>,
        splits: u32,
        rate: Option<f64>,
        info: &SubtaskInfo,
    ) -> Self {
        let p = info.parallelism as u32;
        let i = info.index as u32;
        let owned: Vec<SplitPosition> = (0..splits)
            .filter(|s| s % p == i)
            .map(|split| SplitPosition { split, next: 0 })
            .collect();
        let share = owned.len() as f64 / f64::from(splits.max(1));
        IndexedSource {
            produce,
            len,
            total_splits: splits.max(1),
            owned,
            cursor: 0,
            rate_per_subtask: rate.map(|r| r * share),
            started: Instant::now(),
            emitted_since_start: 0,
            pause_at: None,
        }
    }

    /// Holds back every record at an index `>= index`: once a split reaches it, the split
    /// stays idle (it takes part in checkpoints but never ends). Lets a test stop a bounded
    /// job short of its end whatever the machine's speed.
    pub fn pause_at(mut self, index: Option<u64>) -> Self {
        self.pause_at = index;
        self
    }

    fn index_of(&self, pos: &SplitPosition) -> u64 {
        pos.next * u64::from(self.total_splits) + u64::from(pos.split)
    }

    fn split_done(&self, pos: &SplitPosition) -> bool {
        self.len.is_some_and(|len| self.index_of(pos) >= len)
    }

    fn split_paused(&self, pos: &SplitPosition) -> bool {
        self.pause_at.is_some_and(|at| self.index_of(pos) >= at)
    }
}

#[async_trait]
impl<T: Send + 'static> Source<T> for IndexedSource<T> {
    type Position = Vec<SplitPosition>;

    fn restore(&mut self, positions: Vec<Self::Position>) -> Result<()> {
        let all: HashMap<u32, u64> = positions
            .into_iter()
            .flatten()
            .map(|p| (p.split, p.next))
            .collect();
        for p in &mut self.owned {
            p.next = all.get(&p.split).copied().unwrap_or(0);
        }
        Ok(())
    }

    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        let mut budget = max;
        if let Some(rate) = self.rate_per_subtask {
            let allowed = (rate * self.started.elapsed().as_secs_f64()) as u64;
            let left = allowed.saturating_sub(self.emitted_since_start) as usize;
            if left == 0 {
                return Ok(SourcePoll::Idle(Duration::from_millis(2)));
            }
            budget = budget.min(left);
        }
        let n = self.owned.len();
        let mut produced = 0;
        let mut idle_rounds = 0;
        while produced < budget && n > 0 && idle_rounds < n {
            let c = self.cursor % n;
            self.cursor = (self.cursor + 1) % n;
            if self.split_done(&self.owned[c]) || self.split_paused(&self.owned[c]) {
                idle_rounds += 1;
                continue;
            }
            idle_rounds = 0;
            let idx = self.index_of(&self.owned[c]);
            out.push((self.produce)(idx));
            self.owned[c].next += 1;
            produced += 1;
        }
        self.emitted_since_start += produced as u64;
        if self.owned.iter().all(|p| self.split_done(p)) {
            Ok(SourcePoll::Exhausted)
        } else if produced == 0 {
            Ok(SourcePoll::Idle(Duration::from_millis(2)))
        } else {
            Ok(SourcePoll::Ready)
        }
    }

    fn snapshot_position(&mut self, _checkpoint: CheckpointId) -> Result<Self::Position> {
        Ok(self.owned.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> SubtaskInfo {
        SubtaskInfo {
            job_name: "t".into(),
            operator: "gen".into(),
            node_uid: "n00-gen".into(),
            index: 0,
            parallelism: 1,
            max_parallelism: 128,
            restored_checkpoint: 0,
        }
    }

    async fn drain(src: &mut IndexedSource<u64>) -> (Vec<u64>, SourcePoll) {
        let mut out = Vec::new();
        loop {
            match src.poll(&mut out, 7).await.expect("poll") {
                SourcePoll::Ready => continue,
                other => return (out, other),
            }
        }
    }

    #[tokio::test]
    async fn pause_at_holds_back_the_rest_without_ending() {
        let produce: IndexFn<u64> = Arc::new(|i| i);
        let mut paused =
            IndexedSource::new(produce.clone(), Some(100), 3, None, &info()).pause_at(Some(40));
        let (mut got, last) = drain(&mut paused).await;
        assert!(matches!(last, SourcePoll::Idle(_)), "{last:?}");
        got.sort();
        assert_eq!(got, (0..40).collect::<Vec<_>>());
        // the held-back records come out after a restore without the pause
        let positions = paused.snapshot_position(1).expect("position");
        let mut rest = IndexedSource::new(produce, Some(100), 3, None, &info());
        rest.restore(vec![positions]).expect("restore");
        let (mut got, last) = drain(&mut rest).await;
        assert!(matches!(last, SourcePoll::Exhausted), "{last:?}");
        got.sort();
        assert_eq!(got, (40..100).collect::<Vec<_>>());
    }
}
