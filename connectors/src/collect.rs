//! A collecting sink for tests and small jobs: records become visible in the shared
//! [`Collected`] only when their checkpoint commits (exactly once per subtask and checkpoint).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use onceflow_runtime::{
    async_trait, CheckpointId, Data, Error, Result, Sink, SinkFactory, SubtaskInfo,
};
use serde::{Deserialize, Serialize};

/// What the sink has committed.
#[derive(Debug)]
pub struct Collected<T> {
    /// Committed records in commit order.
    pub records: Vec<T>,
    committed: HashSet<(usize, CheckpointId)>,
}

/// Shared handle on the committed records; also the sink factory.
pub struct CollectSink<T> {
    shared: Arc<Mutex<Collected<T>>>,
}

impl<T> Clone for CollectSink<T> {
    fn clone(&self) -> Self {
        CollectSink {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Clone> Default for CollectSink<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone> CollectSink<T> {
    /// An empty collector.
    pub fn new() -> Self {
        CollectSink {
            shared: Arc::new(Mutex::new(Collected {
                records: Vec::new(),
                committed: HashSet::new(),
            })),
        }
    }

    /// A copy of the committed records.
    pub fn records(&self) -> Vec<T> {
        self.shared
            .lock()
            .map(|c| c.records.clone())
            .unwrap_or_default()
    }
}

/// A pre-committed batch: the records of one subtask between two barriers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CollectPending<T> {
    /// Subtask that wrote the batch.
    pub subtask: usize,
    /// Checkpoint the batch belongs to.
    pub checkpoint: CheckpointId,
    /// The records.
    pub records: Vec<T>,
}

/// One subtask of the collecting sink.
pub struct CollectSinkWriter<T> {
    shared: Arc<Mutex<Collected<T>>>,
    subtask: usize,
    buffer: Vec<T>,
}

impl<T> CollectSinkWriter<T> {
    fn publish(&self, p: CollectPending<T>) -> Result<()> {
        let mut c = self
            .shared
            .lock()
            .map_err(|_| Error::Internal("collect sink lock poisoned".into()))?;
        if c.committed.insert((p.subtask, p.checkpoint)) {
            c.records.extend(p.records);
        }
        Ok(())
    }
}

#[async_trait]
impl<T: Data + std::fmt::Debug + Sync> Sink<T> for CollectSinkWriter<T> {
    type Pending = CollectPending<T>;

    async fn recover(&mut self, pending: Vec<CollectPending<T>>) -> Result<()> {
        for p in pending {
            self.publish(p)?;
        }
        Ok(())
    }

    async fn write_batch(&mut self, records: Vec<T>) -> Result<()> {
        self.buffer.extend(records);
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Option<CollectPending<T>>> {
        if self.buffer.is_empty() {
            return Ok(None);
        }
        Ok(Some(CollectPending {
            subtask: self.subtask,
            checkpoint,
            records: std::mem::take(&mut self.buffer),
        }))
    }

    async fn commit(
        &mut self,
        _checkpoint: CheckpointId,
        pending: CollectPending<T>,
    ) -> Result<()> {
        self.publish(pending)
    }

    async fn abort(&mut self, _pending: CollectPending<T>) -> Result<()> {
        Ok(())
    }
}

impl<T: Data + std::fmt::Debug + Sync> SinkFactory<T> for CollectSink<T> {
    type Sink = CollectSinkWriter<T>;

    fn create(&self, info: &SubtaskInfo) -> Result<CollectSinkWriter<T>> {
        Ok(CollectSinkWriter {
            shared: self.shared.clone(),
            subtask: info.index,
            buffer: Vec::new(),
        })
    }
}
