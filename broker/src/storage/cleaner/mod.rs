//! Log compaction (`cleanup.policy=compact`): a background cleaner that keeps the latest
//! record of each key in a partition's closed segments, with Kafka's rules for tombstones
//! (KIP-534 delete horizon), transactions (aborted data removed, markers removed once their
//! data is gone and `delete.retention.ms` passed) and idempotent producers (each producer's
//! last batch kept).
//!
//! - [`rules`]: what stays, batch by batch (pure, unit-tested).
//! - [`records`]: records inside a stored batch; the rewrite of a batch with fewer records.
//! - [`pass`]: one pass over a partition (key map, filter, write, swap).
//! - [`swap`]: the crash-safe `.cleaned` -> `.swap` -> `.log` replacement and its recovery.
//! - [`failpoint`]: test failpoints at the swap steps.
//!
//! Scheduling: every tick (`StorageConfig::cleaner_interval`) the cleaner rolls active
//! segments older than `segment.ms` (of topics that set it), computes each compacted
//! partition's dirty ratio (bytes of cleanable segments not yet cleaned / bytes of all
//! cleanable segments; cleanable = closed and entirely below the last stable offset and the
//! high watermark) and cleans a partition whose ratio reached `min.cleanable.dirty.ratio`, or
//! whose earliest pending delete horizon passed. What was cleaned is kept in memory: after a
//! restart the whole log counts as dirty once.

pub mod failpoint;
pub mod pass;
pub mod records;
pub mod rules;
pub mod swap;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub use pass::CleanReport;

use super::partition::Partition;
use super::segment::HeaderWalker;
use super::{Inner, StorageError};

/// Metric names of the cleaner (labels: topic, partition).
pub mod metric_names {
    /// Counter: bytes the cleaner read from segments.
    pub const BYTES_READ: &str = "onceflow_broker_cleaner_bytes_read_total";
    /// Counter: bytes of cleaned segments written.
    pub const BYTES_WRITTEN: &str = "onceflow_broker_cleaner_bytes_written_total";
    /// Gauge: dirty ratio of a compacted partition at the last tick.
    pub const DIRTY_RATIO: &str = "onceflow_broker_cleaner_dirty_ratio";
    /// Counter: cleaning passes.
    pub const PASSES: &str = "onceflow_broker_cleaner_passes_total";
    /// Counter: records removed by the cleaner.
    pub const RECORDS_REMOVED: &str = "onceflow_broker_cleaner_records_removed_total";
}

/// Registers the cleaner's metric descriptions.
pub(crate) fn describe() {
    use metric_names::*;
    metrics::describe_counter!(BYTES_READ, "Bytes the log cleaner read from segments");
    metrics::describe_counter!(BYTES_WRITTEN, "Bytes of cleaned segments written");
    metrics::describe_gauge!(
        DIRTY_RATIO,
        "Uncleaned share of a compacted partition's cleanable log"
    );
    metrics::describe_counter!(PASSES, "Log cleaner passes");
    metrics::describe_counter!(RECORDS_REMOVED, "Records removed by the log cleaner");
}

fn labels(p: &Partition) -> [(&'static str, String); 2] {
    [
        ("topic", p.topic().to_string()),
        ("partition", p.index().to_string()),
    ]
}

/// What the scheduler remembers of one partition.
#[derive(Debug)]
struct Progress {
    partition: Weak<Partition>,
    /// One past the last offset of the range the last pass cleaned.
    cleaned_up_to: i64,
    /// When a pass may remove more without new data.
    next_due: Option<i64>,
}

/// The cleaner's scheduling state across ticks.
#[derive(Debug, Default)]
pub(crate) struct Scheduler {
    progress: HashMap<(String, i32), Progress>,
}

impl Scheduler {
    /// One tick over `partitions` at `now_ms`.
    pub(crate) fn tick(&mut self, partitions: &[Arc<Partition>], now_ms: i64) {
        self.progress
            .retain(|_, pr| pr.partition.strong_count() > 0);
        for p in partitions {
            let config = p.log_config();
            if let Some(segment_ms) = config.segment_ms {
                if let Err(e) = roll_if_older_than(p, segment_ms, now_ms) {
                    tracing::warn!(topic = p.topic(), partition = p.index(), error = %e, "time-based segment roll failed");
                }
            }
            if !config.cleanup_policy.compact {
                continue;
            }
            let key = (p.topic().to_string(), p.index());
            let pr = self.progress.entry(key).or_insert_with(|| Progress {
                partition: Arc::downgrade(p),
                cleaned_up_to: i64::MIN,
                next_due: None,
            });
            if !Weak::ptr_eq(&pr.partition, &Arc::downgrade(p)) {
                // The topic was deleted and created again.
                *pr = Progress {
                    partition: Arc::downgrade(p),
                    cleaned_up_to: i64::MIN,
                    next_due: None,
                };
            }
            let (dirty, total, end) = {
                let st = p.lock_state();
                let segs = pass::cleanable(&st);
                let dirty: u64 = segs
                    .iter()
                    .filter(|s| s.base >= pr.cleaned_up_to)
                    .map(|s| s.size)
                    .sum();
                let total: u64 = segs.iter().map(|s| s.size).sum();
                (
                    dirty,
                    total,
                    segs.last().map_or(i64::MIN, |s| s.next_offset),
                )
            };
            let ratio = if total == 0 {
                0.0
            } else {
                dirty as f64 / total as f64
            };
            metrics::gauge!(metric_names::DIRTY_RATIO, &labels(p)).set(ratio);
            let due = pr.next_due.is_some_and(|t| t <= now_ms);
            if !(due || (dirty > 0 && ratio >= config.min_cleanable_dirty_ratio)) {
                continue;
            }
            match clean_partition(p, now_ms) {
                Ok(Some(r)) => {
                    pr.cleaned_up_to = r.cleaned_up_to;
                    pr.next_due = r.next_due;
                }
                Ok(None) => pr.next_due = None,
                Err(e) => {
                    // Retried once new data arrives, not at every tick.
                    tracing::warn!(topic = p.topic(), partition = p.index(), error = %e, "cleaning pass failed; the partition is left as it was");
                    pr.cleaned_up_to = end;
                    pr.next_due = None;
                }
            }
        }
    }
}

/// Rolls the active segment of `p` if it holds data whose first batch's max timestamp is
/// more than `segment.ms` before `now_ms` (Kafka's time-based roll), so it becomes cleanable.
fn roll_if_older_than(p: &Partition, segment_ms: i64, now_ms: i64) -> Result<bool, StorageError> {
    let mut guard = p.lock_state();
    let st = &mut *guard;
    if st.deleted || st.failed.is_some() {
        return Ok(false);
    }
    let Some(active) = st.segments.last() else {
        return Ok(false);
    };
    let first = match HeaderWalker::new(active.log.as_ref(), active.size()).header_at(0) {
        Ok(Some(Ok(h))) => h,
        Ok(_) => return Ok(false),
        Err(e) => return Err(StorageError::io(&active.log_path, e)),
    };
    if now_ms.saturating_sub(first.max_timestamp) <= segment_ms {
        return Ok(false);
    }
    p.roll_locked(st)?;
    Ok(true)
}

/// Runs one cleaning pass over `p` now, with logging and metrics.
pub(crate) fn clean_partition(
    p: &Partition,
    now_ms: i64,
) -> Result<Option<CleanReport>, StorageError> {
    // One pass at a time in the process: the background cleaner and `Store::clean_now` must
    // not write the same segment's cleaned copy at once.
    static CLEANING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = CLEANING.lock().unwrap_or_else(|e| e.into_inner());
    let Some(r) = pass::clean(p, now_ms)? else {
        return Ok(None);
    };
    let l = labels(p);
    metrics::counter!(metric_names::BYTES_READ, &l).increment(r.bytes_read);
    metrics::counter!(metric_names::BYTES_WRITTEN, &l).increment(r.bytes_written);
    metrics::counter!(metric_names::PASSES, &l).increment(1);
    metrics::counter!(metric_names::RECORDS_REMOVED, &l).increment(r.stats.records_removed);
    tracing::info!(
        topic = p.topic(),
        partition = p.index(),
        segments = r.segments,
        segments_rewritten = r.segments_rewritten,
        bytes_read = r.bytes_read,
        bytes_written = r.bytes_written,
        records_kept = r.stats.records_kept,
        records_removed = r.stats.records_removed,
        cleaned_up_to = r.cleaned_up_to,
        duration_ms = r.micros / 1000,
        "cleaning pass"
    );
    if r.next_due.is_none() {
        // Tests wait for this line: nothing more to remove below this offset until new data.
        tracing::info!(
            "cleaner settled {}-{} at offset {}",
            p.topic(),
            p.index(),
            r.cleaned_up_to
        );
    }
    Ok(Some(r))
}

/// Starts the cleaner thread; it exits once the store is dropped.
pub(super) fn spawn(inner: Weak<Inner>, every: Duration) -> Result<(), StorageError> {
    std::thread::Builder::new()
        .name("onceflow-log-cleaner".into())
        .spawn(move || {
            let mut scheduler = Scheduler::default();
            loop {
                std::thread::sleep(every);
                let Some(inner) = inner.upgrade() else {
                    break;
                };
                let parts: Vec<Arc<Partition>> = {
                    let t = inner.topics.read().unwrap_or_else(|p| p.into_inner());
                    t.values().flatten().cloned().collect()
                };
                drop(inner);
                scheduler.tick(&parts, pass::now_ms());
            }
        })
        .map(|_| ())
        .map_err(|e| StorageError::io("onceflow-log-cleaner thread", e))
}

#[cfg(test)]
mod tests;
