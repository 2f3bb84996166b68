//! A partition's transaction state behind its lock, with its index files: the single place
//! where transactional batches and markers are appended, so the open-transaction map, the
//! last stable offset and the aborted index always agree with the log.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use super::error::{Result, TxnError};
use super::marker::{parse_marker, MarkerKind};
use super::partition_index::{partition_dir, PartitionIndexFiles};
use super::partition_state::PartitionTxnState;
use crate::storage::batch::{parse_header, peek_size};
use crate::storage::Partition;

/// Bytes read per step while replaying a partition's log tail.
const REPLAY_CHUNK: usize = 1 << 20;

/// Mutable part of a [`PartitionTxn`].
#[derive(Debug)]
pub struct PartitionTxnInner {
    /// The in-memory view.
    pub state: PartitionTxnState,
    files: Option<PartitionIndexFiles>,
    dirty: bool,
    snapshot_offset: i64,
}

/// One partition's transaction layer.
#[derive(Debug)]
pub struct PartitionTxn {
    /// The storage partition.
    pub partition: Arc<Partition>,
    inner: Mutex<PartitionTxnInner>,
}

/// Walks the whole batches in `buf`, calling `f(batch bytes, header)`.
pub(crate) fn for_each_batch(
    buf: &[u8],
    mut f: impl FnMut(&[u8], &crate::storage::batch::BatchHeader),
) {
    let mut pos = 0usize;
    while pos < buf.len() {
        let Some(Ok(size)) = peek_size(&buf[pos..]) else {
            break;
        };
        let Some(batch) = buf.get(pos..pos + size) else {
            break;
        };
        let Ok(h) = parse_header(batch) else { break };
        f(batch, &h);
        pos += size;
    }
}

impl PartitionTxn {
    /// Loads the partition's index (from `root` when durable) and replays the log from the
    /// snapshot offset to the high watermark.
    pub fn recover(partition: Arc<Partition>, root: Option<&std::path::Path>) -> Result<Self> {
        let topic = partition.topic().to_string();
        let index = partition.index();
        let mut state = PartitionTxnState::default();
        let hw = partition.high_watermark();
        let mut start = partition.log_start_offset();
        let mut files = None;
        let mut persisted_until = -1;
        if let Some(root) = root {
            let (mut f, loaded) = PartitionIndexFiles::open(&partition_dir(root, &topic, index))?;
            let kept: Vec<_> = loaded
                .aborted
                .iter()
                .copied()
                .filter(|a| a.last_offset < hw)
                .collect();
            if kept.len() != loaded.aborted.len() {
                tracing::warn!(%topic, partition = index, "aborted index is ahead of the log; trimming it");
                f.rewrite_aborted(&kept)?;
            }
            persisted_until = kept.last().map_or(-1, |a| a.last_offset);
            state.aborted = kept;
            if let Some((offset, open)) = loaded.snapshot {
                if offset <= hw && offset >= start {
                    start = offset;
                    state.open = open.into_iter().collect();
                }
            }
            files = Some(f);
        }
        if start == partition.log_start_offset() {
            state.open.clear();
        }
        let mut pos = start;
        let mut new_entries = Vec::new();
        while pos < hw {
            let buf: Bytes = partition
                .read(pos, REPLAY_CHUNK)
                .map_err(|e| TxnError::Rebuild {
                    topic: topic.clone(),
                    partition: index,
                    reason: e.to_string(),
                })?;
            if buf.is_empty() {
                break;
            }
            let mut next = pos;
            for_each_batch(&buf, |batch, h| {
                next = next.max(h.last_offset() + 1);
                if h.base_offset < pos || !h.is_transactional() || !h.has_producer_id() {
                    return;
                }
                if h.is_control() {
                    if let Some(kind) = parse_marker(batch, h) {
                        if kind == MarkerKind::Abort && h.base_offset <= persisted_until {
                            // Entry already in the index: only close the transaction.
                            state.open.remove(&h.producer_id);
                        } else if let Some(a) =
                            state.observe_marker(h.producer_id, kind, h.base_offset)
                        {
                            new_entries.push(a);
                        }
                    }
                } else {
                    state.observe_data(h.producer_id, h.base_offset);
                }
            });
            if next <= pos {
                break;
            }
            pos = next;
        }
        if let Some(f) = files.as_mut() {
            f.append_aborted(&new_entries)?;
        }
        if !state.open.is_empty() || !new_entries.is_empty() {
            tracing::info!(%topic, partition = index, open = state.open.len(),
                recovered_aborted = new_entries.len(), "partition transaction state recovered");
        }
        Ok(PartitionTxn {
            partition,
            inner: Mutex::new(PartitionTxnInner {
                state,
                files,
                dirty: true,
                snapshot_offset: -1,
            }),
        })
    }

    /// Locks the partition's transaction state. Appends of transactional batches and markers
    /// happen under this lock.
    pub fn lock(&self) -> MutexGuard<'_, PartitionTxnInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Last stable offset now.
    pub fn last_stable_offset(&self) -> i64 {
        let g = self.lock();
        g.state.last_stable_offset(self.partition.high_watermark())
    }

    /// Writes the open-transactions snapshot if anything changed since the last one.
    pub fn snapshot(&self) -> Result<()> {
        let mut g = self.lock();
        let hw = self.partition.high_watermark();
        if !g.dirty && g.snapshot_offset == hw {
            return Ok(());
        }
        if let Some(f) = &g.files {
            f.write_snapshot(hw, &g.state)?;
        }
        g.dirty = false;
        g.snapshot_offset = hw;
        Ok(())
    }
}

impl PartitionTxnInner {
    /// Records a stored transactional data batch.
    pub fn observe_data(&mut self, producer_id: i64, base_offset: i64) {
        self.state.observe_data(producer_id, base_offset);
        self.dirty = true;
    }

    /// Records a stored marker, persisting the aborted entry it creates.
    pub fn observe_marker(
        &mut self,
        producer_id: i64,
        kind: MarkerKind,
        offset: i64,
    ) -> Result<()> {
        self.dirty = true;
        if let Some(a) = self.state.observe_marker(producer_id, kind, offset) {
            if let Some(f) = self.files.as_mut() {
                f.append_aborted(&[a])?;
            }
        }
        Ok(())
    }
}
