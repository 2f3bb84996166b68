//! A generator source: record `i` is `f(i)` for `i` in `0..count` (or unbounded), optionally
//! rate limited. Deterministic, so replays after a restore produce the same records.

use std::sync::Arc;

use onceflow_runtime::{Result, SourceFactory, SubtaskInfo};

use crate::split::{IndexFn, IndexedSource};

/// Builds generator source subtasks.
pub struct Generator<T> {
    produce: IndexFn<T>,
    count: Option<u64>,
    splits: u32,
    rate: Option<f64>,
    pause_at: Option<u64>,
}

impl<T> Clone for Generator<T> {
    fn clone(&self) -> Self {
        Generator {
            produce: self.produce.clone(),
            count: self.count,
            splits: self.splits,
            rate: self.rate,
            pause_at: self.pause_at,
        }
    }
}

impl<T: Send + 'static> Generator<T> {
    /// `count` records `f(0), f(1), ...`, in 16 splits.
    pub fn new(count: u64, f: impl Fn(u64) -> T + Send + Sync + 'static) -> Self {
        Generator {
            produce: Arc::new(f),
            count: Some(count),
            splits: 16,
            rate: None,
            pause_at: None,
        }
    }

    /// An endless generator (stop the job with a [`onceflow_runtime::StopHandle`]).
    pub fn unbounded(f: impl Fn(u64) -> T + Send + Sync + 'static) -> Self {
        Generator {
            produce: Arc::new(f),
            count: None,
            splits: 16,
            rate: None,
            pause_at: None,
        }
    }

    /// Number of splits (the maximum useful source parallelism).
    pub fn splits(mut self, n: u32) -> Self {
        self.splits = n.max(1);
        self
    }

    /// Limits the total rate to `per_second` records/s.
    pub fn rate_per_second(mut self, per_second: f64) -> Self {
        self.rate = Some(per_second);
        self
    }

    /// Holds back the records from index `index` on: each split stops there and stays idle
    /// (still taking checkpoints) instead of ending. Crash tests use it so that a job they
    /// kill repeatedly cannot finish before the last kill, however fast the machine is.
    pub fn pause_at(mut self, index: u64) -> Self {
        self.pause_at = Some(index);
        self
    }
}

impl<T: Send + 'static> SourceFactory<T> for Generator<T> {
    type Source = IndexedSource<T>;

    fn create(&self, info: &SubtaskInfo) -> Result<IndexedSource<T>> {
        Ok(IndexedSource::new(
            self.produce.clone(),
            self.count,
            self.splits,
            self.rate,
            info,
        )
        .pause_at(self.pause_at))
    }
}
