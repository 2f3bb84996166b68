//! Moving a partition's log start: retention (`cleanup.policy` with `delete`: closed segments
//! past `retention.ms` or beyond `retention.bytes`) and DeleteRecords (the log start set to an
//! offset, possibly inside a segment).
//!
//! Deletion order, so that a crash at any point leaves a state recovery understands:
//! 1. the new log start is written to `log-start.checkpoint` (atomic replace);
//! 2. the segments wholly below it are removed oldest first, `.log` before `.index` (an
//!    index without its log is removed at open), then the directory is fsynced;
//! 3. producer-state snapshots below the log start are removed (a fresh one at the log end is
//!    written if none would be left) and aborted-transaction entries wholly below it dropped
//!    (the index file replaced atomically).
//!
//! Recovery reads the checkpoint first and removes any segment still wholly below it, so an
//! interrupted step 2 is finished at the next open; steps 3 are redone or ignored there.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::{LogState, Partition};
use crate::storage::error::StorageError;
use crate::storage::log_config::LogConfig;
use crate::storage::log_start::{self, LOG_START_FILE};
use crate::storage::segment::{self, Segment};
use crate::storage::txn_index::{self, TXN_INDEX_FILE};

/// What a retention pass did to one partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Segments deleted.
    pub segments_deleted: usize,
    /// Bytes of the segments deleted.
    pub bytes_deleted: u64,
    /// The log start offset after the pass.
    pub log_start: i64,
}

/// Partitions whose segment roll took them past `retention.bytes`, for the store's retention
/// thread to trim at once instead of at its next interval.
///
/// Kafka deletes segments only at `log.retention.check.interval.ms` (5 minutes by default),
/// so between two passes a partition grows by whatever arrives meanwhile. For an in-memory
/// log that growth is memory, not disk: at 1 GB/s even a 10 ms interval lets 10 MB more
/// than the bound pile up between passes, and a shorter interval costs a wake-up per
/// interval. So each roll that leaves a partition past the bound hands it to the thread,
/// which deletes off the append path (a file's unlink can take milliseconds). Between two
/// rolls only the active segment grows, so the partition stays within about
/// `retention.bytes` plus a segment.
#[derive(Debug, Default)]
pub(crate) struct RetentionDue {
    due: Mutex<Vec<(String, i32)>>,
    marked: Condvar,
}

impl RetentionDue {
    /// Hands partition `index` of `topic` to the retention thread (once until it is taken).
    pub(crate) fn mark(&self, topic: &str, index: i32) {
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        if !due.iter().any(|(t, i)| *i == index && t == topic) {
            due.push((topic.to_string(), index));
        }
        drop(due);
        self.marked.notify_one();
    }

    /// The partitions marked since the last call, waiting up to `timeout` for one if none is.
    pub(crate) fn take(&self, timeout: Duration) -> Vec<(String, i32)> {
        let due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        let (mut due, _) = self
            .marked
            .wait_timeout_while(due, timeout, |d| d.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *due)
    }
}

/// Whether a retention pass would delete the oldest segment by size: `cleanup.policy`
/// contains `delete`, `retention.bytes` is set, the oldest segment is closed and the log
/// without it still holds at least `retention.bytes` (the first step of
/// [`Partition::enforce_retention`]'s rule).
pub(crate) fn over_retention_bytes(config: &LogConfig, st: &LogState) -> bool {
    let Some(limit) = config.retention_bytes else {
        return false;
    };
    if !config.cleanup_policy.delete || st.segments.len() < 2 {
        return false;
    }
    let rest: u64 = st.segments[1..].iter().map(Segment::size).sum();
    i64::try_from(rest).unwrap_or(i64::MAX) >= limit
}

/// Why DeleteRecords could not move a partition's log start.
#[derive(Debug, thiserror::Error)]
pub enum DeleteRecordsError {
    /// The offset is negative (other than -1) or past the high watermark (the client's input
    /// error) -> OFFSET_OUT_OF_RANGE (1).
    #[error("offset {offset} is out of range: the high watermark is {high_watermark}")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: i64,
        /// The partition's high watermark.
        high_watermark: i64,
    },
    /// The topic's `cleanup.policy` does not contain `delete` (the client's input error) ->
    /// POLICY_VIOLATION (44), as Kafka answers.
    #[error("records of a topic whose cleanup.policy does not contain delete cannot be deleted")]
    PolicyViolation,
    /// The topic was deleted, or the store failed underneath.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The DeleteRecords offset that means "the high watermark".
pub const HIGH_WATERMARK: i64 = -1;

impl Partition {
    /// DeleteRecords: moves the log start to `offset` ([`HIGH_WATERMARK`] = the high
    /// watermark) and deletes the segments wholly below it. Returns the new log start (the
    /// low watermark); an offset at or below the current start changes nothing. As in Kafka
    /// the bound is the high watermark, not the last stable offset: the last stable offset
    /// then never falls below the log start.
    pub fn delete_records(&self, offset: i64) -> Result<i64, DeleteRecordsError> {
        if !self.log_config().cleanup_policy.delete {
            return Err(DeleteRecordsError::PolicyViolation);
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        self.check_writable(st)?;
        let target = if offset == HIGH_WATERMARK {
            st.high_watermark
        } else {
            offset
        };
        if target < 0 || target > st.high_watermark {
            return Err(DeleteRecordsError::OffsetOutOfRange {
                offset,
                high_watermark: st.high_watermark,
            });
        }
        if target > st.log_start {
            self.advance_log_start(st, target, "delete-records")?;
        }
        Ok(st.log_start)
    }

    /// One retention pass at wall-clock time `now_ms`: with `cleanup.policy` containing
    /// `delete`, deletes the oldest closed segments whose newest record is older than
    /// `retention.ms`, and the oldest closed segments while the log without them still holds
    /// at least `retention.bytes` (Kafka's rule). Never the active segment, and never a
    /// segment reaching past the last stable offset (so neither past an open transaction's
    /// first offset nor past the high watermark).
    pub fn enforce_retention(&self, now_ms: i64) -> Result<RetentionOutcome, StorageError> {
        let config = self.log_config();
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut outcome = RetentionOutcome {
            log_start: st.log_start,
            ..RetentionOutcome::default()
        };
        let limited = config.retention_ms.is_some() || config.retention_bytes.is_some();
        if !config.cleanup_policy.delete || !limited || st.deleted || st.failed.is_some() {
            return Ok(outcome);
        }
        let bound = Self::lso_of(st);
        let mut total: u64 = st.segments.iter().map(Segment::size).sum();
        let mut new_start = st.log_start;
        let mut reason = "";
        let closed = st.segments.len().saturating_sub(1);
        for seg in &st.segments[..closed] {
            if seg.next_offset > bound {
                break;
            }
            let by_time = config.retention_ms.is_some_and(|ms| {
                seg.max_timestamp != i64::MIN && now_ms.saturating_sub(seg.max_timestamp) > ms
            });
            let by_size = config.retention_bytes.is_some_and(|limit| {
                i64::try_from(total - seg.size()).unwrap_or(i64::MAX) >= limit
            });
            if !by_time && !by_size {
                break;
            }
            reason = if by_time {
                "retention.ms"
            } else {
                "retention.bytes"
            };
            total -= seg.size();
            new_start = new_start.max(seg.next_offset);
        }
        if new_start > st.log_start {
            let (segments, bytes) = self.advance_log_start(st, new_start, reason)?;
            outcome.segments_deleted = segments;
            outcome.bytes_deleted = bytes;
            outcome.log_start = st.log_start;
        }
        Ok(outcome)
    }

    /// Moves the log start to `new_start` (above the current one, at most the high
    /// watermark) in the crash-safe order of the module doc. Returns the segments and bytes
    /// deleted.
    fn advance_log_start(
        &self,
        st: &mut LogState,
        new_start: i64,
        reason: &str,
    ) -> Result<(usize, u64), StorageError> {
        let backend = self.ctx.backend.as_ref();
        let checkpoint = self.dir.join(LOG_START_FILE);
        backend
            .write_file_atomic(&checkpoint, &log_start::encode(new_start))
            .map_err(|e| self.io_err(&checkpoint, e))?;
        st.log_start = new_start;
        let closed = st.segments.len().saturating_sub(1);
        let below = st.segments[..closed]
            .iter()
            .take_while(|s| s.next_offset <= new_start)
            .count();
        let removed: Vec<Segment> = st.segments.drain(..below).collect();
        let bytes: u64 = removed.iter().map(Segment::size).sum();
        for seg in &removed {
            let index = self.dir.join(segment::file_name(seg.base_offset, "index"));
            for path in [&seg.log_path, &index] {
                if let Err(e) = backend.remove_file(path) {
                    // The checkpoint is durable: the next open removes what is left.
                    tracing::warn!(file = %path.display(), error = %e, "could not remove a deleted segment's file; it is removed at the next open");
                }
            }
        }
        if !removed.is_empty() {
            if let Err(e) = backend.sync_dir(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "fsync of the partition directory after deleting segments failed");
            }
        }
        self.prune_below_log_start(st)?;
        self.metrics.log_start_offset.set(new_start as f64);
        self.metrics
            .segments_deleted
            .increment(removed.len() as u64);
        self.metrics.bytes_deleted.increment(bytes);
        tracing::info!(
            topic = %self.topic, partition = self.index, log_start = new_start,
            segments_deleted = removed.len(), bytes_deleted = bytes, reason,
            "log start advanced; deleted segments below it"
        );
        Ok((removed.len(), bytes))
    }

    /// Drops producer-state snapshots and aborted-transaction entries below the log start.
    fn prune_below_log_start(&self, st: &mut LogState) -> Result<(), StorageError> {
        let backend = self.ctx.backend.as_ref();
        let log_start = st.log_start;
        let (old, kept): (Vec<i64>, Vec<i64>) =
            st.snapshots.iter().partition(|off| **off < log_start);
        st.snapshots = kept;
        for off in old {
            let path = self.dir.join(segment::file_name(off, "snapshot"));
            if let Err(e) = backend.remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "could not remove a snapshot below the log start");
            }
        }
        if st.snapshots.is_empty() && st.log_end > log_start {
            // Keeps the producer state of the deleted batches across a restart.
            self.write_snapshot(st)?;
        }
        let before = st.aborted.len();
        st.aborted.retain(|e| e.last_offset >= log_start);
        if st.aborted.len() != before {
            let path = self.dir.join(TXN_INDEX_FILE);
            backend
                .write_file_atomic(&path, &txn_index::encode_file(&st.aborted))
                .map_err(|e| self.io_err(&path, e))?;
            st.txn_index = backend.open(&path).map_err(|e| self.io_err(&path, e))?;
            st.txn_index_unsynced = false;
        }
        Ok(())
    }
}
