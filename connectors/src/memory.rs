//! A replayable in-memory source over a vector of records.

use std::sync::Arc;

use onceflow_runtime::{Result, SourceFactory, SubtaskInfo};

use crate::split::IndexedSource;

/// Builds source subtasks over a shared vector (record order within a split is preserved).
pub struct MemorySource<T> {
    records: Arc<Vec<T>>,
    splits: u32,
}

impl<T> Clone for MemorySource<T> {
    fn clone(&self) -> Self {
        MemorySource {
            records: self.records.clone(),
            splits: self.splits,
        }
    }
}

impl<T: Clone + Send + Sync + 'static> MemorySource<T> {
    /// A source over `records` in 16 splits.
    pub fn new(records: Vec<T>) -> Self {
        MemorySource {
            records: Arc::new(records),
            splits: 16,
        }
    }

    /// Number of splits.
    pub fn splits(mut self, n: u32) -> Self {
        self.splits = n.max(1);
        self
    }
}

impl<T: Clone + Send + Sync + 'static> SourceFactory<T> for MemorySource<T> {
    type Source = IndexedSource<T>;

    fn create(&self, info: &SubtaskInfo) -> Result<IndexedSource<T>> {
        let records = self.records.clone();
        Ok(IndexedSource::new(
            Arc::new(move |i| records[i as usize].clone()),
            Some(self.records.len() as u64),
            self.splits,
            None,
            info,
        ))
    }
}
