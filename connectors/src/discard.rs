//! A sink that drops records and counts them (benchmarks, smoke tests).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use onceflow_runtime::{async_trait, CheckpointId, Result, Sink, SinkFactory, SubtaskInfo};

/// Builds discarding sink subtasks sharing one counter.
#[derive(Clone, Default)]
pub struct DiscardSink {
    count: Arc<AtomicU64>,
}

impl DiscardSink {
    /// A sink with a zeroed counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records received so far by all subtasks.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// One subtask of [`DiscardSink`].
pub struct DiscardSinkWriter {
    count: Arc<AtomicU64>,
}

#[async_trait]
impl<T: Send + 'static> Sink<T> for DiscardSinkWriter {
    type Pending = ();

    async fn recover(&mut self, _pending: Vec<()>) -> Result<()> {
        Ok(())
    }

    async fn write_batch(&mut self, records: Vec<T>) -> Result<()> {
        self.count
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn pre_commit(&mut self, _checkpoint: CheckpointId) -> Result<Option<()>> {
        Ok(None)
    }

    async fn commit(&mut self, _checkpoint: CheckpointId, _pending: ()) -> Result<()> {
        Ok(())
    }

    async fn abort(&mut self, _pending: ()) -> Result<()> {
        Ok(())
    }
}

impl<T: Send + 'static> SinkFactory<T> for DiscardSink {
    type Sink = DiscardSinkWriter;

    fn create(&self, _info: &SubtaskInfo) -> Result<DiscardSinkWriter> {
        Ok(DiscardSinkWriter {
            count: self.count.clone(),
        })
    }
}
