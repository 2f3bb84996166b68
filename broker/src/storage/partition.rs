//! One partition's log: append with offset assignment and idempotent-producer checks, segment
//! rolls, fsync policy and producer-state snapshots. Reads, watermarks and the timestamp
//! lookup are in `read`; moving the log start (retention, DeleteRecords) in `retention`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use bytes::Bytes;

use super::backend::{BackendFile, StorageBackend};
use super::batch::{self, BatchHeader, ProducedBatches};
use super::config::FsyncPolicy;
use super::error::{AppendError, StorageError};
use super::log_config::LogConfig;
use super::metrics::PartitionMetrics;
use super::producer_state::{ProducerEntry, ProducerStates, SequenceCheck};
use super::recovery;
use super::segment::{self, Segment};
use super::snapshot;
use super::txn_index::{self, AbortedTxn, CONTROL_ABORT};

mod read;
mod retention;
pub(crate) use retention::{over_retention_bytes, RetentionDue};
pub use retention::{DeleteRecordsError, RetentionOutcome};

/// Snapshots kept per partition (the newest ones).
pub(crate) const SNAPSHOTS_KEPT: usize = 2;

/// What a successful append reports back to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset of the first record appended (or, for a duplicate, originally appended).
    pub base_offset: i64,
    /// Offset of the last record appended.
    pub last_offset: i64,
    /// Log append time, or -1 (CreateTime topics).
    pub log_append_time: i64,
    /// The partition's log start offset.
    pub log_start_offset: i64,
    /// The batch repeated one already stored; nothing was appended.
    pub duplicate: bool,
}

/// What a read_committed fetch returns for a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedRead {
    /// Whole batches below the last stable offset.
    pub records: Bytes,
    /// Aborted transactions overlapping the returned range (the Fetch response's
    /// `aborted_transactions`: producer id and first offset).
    pub aborted: Vec<AbortedTxn>,
    /// The last stable offset when the read was made.
    pub last_stable_offset: i64,
    /// The high watermark when the read was made.
    pub high_watermark: i64,
    /// The log start offset.
    pub log_start_offset: i64,
}

/// The mutable state of a partition's log, guarded by the partition's mutex.
#[derive(Debug)]
pub(crate) struct LogState {
    /// Segments in offset order; the last one is active.
    pub segments: Vec<Segment>,
    /// First offset in the log.
    pub log_start: i64,
    /// One past the last offset written.
    pub log_end: i64,
    /// One past the last offset readers may see (durable under every-batch fsync).
    pub high_watermark: i64,
    /// Idempotent-producer state after every batch below `log_end`.
    pub producers: ProducerStates,
    /// Offsets of the snapshot files present, ascending.
    pub snapshots: Vec<i64>,
    /// Aborted transactions in marker order (mirrors `aborted.txnindex`).
    pub aborted: Vec<AbortedTxn>,
    /// The aborted-transaction index file.
    pub txn_index: Arc<dyn BackendFile>,
    /// Entries were appended to `txn_index` since its last fsync.
    pub txn_index_unsynced: bool,
    /// Data was written to the active segment since its last fsync.
    pub unsynced: bool,
    /// Sealed segments whose data the roll left unsynced (fsync policies other than
    /// every-batch): the next flush syncs them, off the append path.
    pub sealed_unsynced: Vec<(Arc<dyn BackendFile>, PathBuf)>,
    /// Under `interval-ms`, a roll left the directory entry of its new segment unsynced and
    /// its producer-state snapshot unwritten: the next flush does both.
    pub roll_unsynced: bool,
    /// An I/O failure left the tail in an unknown state: appends are refused until reopen.
    pub failed: Option<String>,
    /// The topic was deleted.
    pub deleted: bool,
}

/// Static facts a partition needs to do I/O.
#[derive(Debug, Clone)]
pub(crate) struct PartitionContext {
    pub backend: Arc<dyn StorageBackend>,
    pub fsync: FsyncPolicy,
    pub repair_corrupt_logs: bool,
    /// The settings a new partition starts with (its topic's configs).
    pub log_config: LogConfig,
    /// Where a roll that takes the partition past `retention.bytes` hands it for trimming;
    /// `None` when the store runs no retention thread.
    pub retention_due: Option<Arc<RetentionDue>>,
}

/// A partition of a topic. Internally synchronized; share it as `Arc<Partition>`.
#[derive(Debug)]
pub struct Partition {
    topic: String,
    index: i32,
    dir: PathBuf,
    ctx: PartitionContext,
    state: Mutex<LogState>,
    /// Segment, retention and cleaning settings; replaced whole when the topic's configs change.
    log_config: RwLock<Arc<LogConfig>>,
    /// Serializes fsyncs of the active segment (group commit: one fsync covers every append
    /// written before it started; taken before `state`, never while holding it).
    sync_lock: Mutex<()>,
    metrics: PartitionMetrics,
}

/// An append written to the log but not yet durable: call [`Partition::make_durable`] with
/// `durable_at` before acknowledging it (under `--fsync every-batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingAppend {
    /// What to report once durable.
    pub outcome: AppendOutcome,
    /// The offset the high watermark must reach first, or `None` if nothing is to wait for.
    pub durable_at: Option<i64>,
}

impl Partition {
    /// Opens (recovering) or creates the partition stored in `dir`.
    pub(crate) fn open(
        ctx: PartitionContext,
        topic: &str,
        index: i32,
        dir: PathBuf,
    ) -> Result<Partition, StorageError> {
        let started = Instant::now();
        let state = recovery::recover(ctx.backend.as_ref(), &dir, ctx.repair_corrupt_logs)?;
        tracing::debug!(
            topic,
            partition = index,
            segments = state.segments.len(),
            log_start = state.log_start,
            log_end = state.log_end,
            producers = state.producers.len(),
            aborted = state.aborted.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened partition"
        );
        let metrics = PartitionMetrics::new(topic, index);
        metrics.log_end_offset.set(state.log_end as f64);
        metrics.log_start_offset.set(state.log_start as f64);
        Ok(Partition {
            topic: topic.to_string(),
            index,
            dir,
            log_config: RwLock::new(Arc::new(ctx.log_config.clone())),
            ctx,
            state: Mutex::new(state),
            sync_lock: Mutex::new(()),
            metrics,
        })
    }

    /// The partition's current log settings.
    pub fn log_config(&self) -> Arc<LogConfig> {
        Arc::clone(&self.log_config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the partition's log settings; the next append, roll or cleaner pass uses them.
    pub fn set_log_config(&self, config: LogConfig) {
        *self.log_config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
    }

    /// The log state under the partition lock (the cleaner's view and swap).
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, LogState> {
        self.lock()
    }

    /// The storage backend the partition's files live on.
    pub(crate) fn backend(&self) -> &Arc<dyn StorageBackend> {
        &self.ctx.backend
    }

    /// Seals the active segment under the caller's lock (time-based rolls); a failure takes
    /// the partition offline, as on the append path.
    pub(crate) fn roll_locked(&self, st: &mut LogState) -> Result<(), StorageError> {
        self.roll(st)
            .inspect_err(|e| st.failed = Some(format!("segment roll failed: {e}")))
    }

    /// The topic this partition belongs to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition index.
    pub fn index(&self) -> i32 {
        self.index
    }

    /// The partition's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn io_err(&self, path: &Path, e: io::Error) -> StorageError {
        StorageError::io(path, e)
    }

    /// Marks the partition deleted: later appends fail with `UnknownTopic`.
    pub(crate) fn mark_deleted(&self) {
        self.lock().deleted = true;
    }

    fn check_writable(&self, st: &LogState) -> Result<(), StorageError> {
        if st.deleted {
            return Err(StorageError::UnknownTopic(self.topic.clone()));
        }
        if let Some(why) = &st.failed {
            return Err(StorageError::io(
                &self.dir,
                io::Error::other(format!("partition offline until restart: {why}")),
            ));
        }
        Ok(())
    }

    /// Appends the records field of a Produce request (one or more RecordBatch v2): validates
    /// magic and CRC-32C, runs the idempotent-producer checks, assigns offsets by rewriting
    /// baseOffset only, stores the bytes and fsyncs per policy before returning.
    pub fn append(&self, records: Bytes) -> Result<AppendOutcome, AppendError> {
        self.append_produced(&ProducedBatches::parse(records)?)
    }

    /// [`Partition::append`] of records already split and validated.
    pub fn append_produced(
        &self,
        produced: &ProducedBatches,
    ) -> Result<AppendOutcome, AppendError> {
        let pending = self.append_produced_unsynced(produced)?;
        self.finish(pending)
    }

    /// [`Partition::append`] without waiting for the fsync: the records are written and
    /// ordered (a later append lands after them) but, under every-batch, not yet visible to
    /// readers nor safe to acknowledge until [`Partition::make_durable`] returns for
    /// `durable_at`. Lets a caller order its next append before this one's fsync completes,
    /// so one fsync covers both (group commit).
    pub fn append_unsynced(&self, records: Bytes) -> Result<PendingAppend, AppendError> {
        self.append_produced_unsynced(&ProducedBatches::parse(records)?)
    }

    /// [`Partition::append_unsynced`] of records already split and validated.
    pub fn append_produced_unsynced(
        &self,
        produced: &ProducedBatches,
    ) -> Result<PendingAppend, AppendError> {
        let (records, batches) = (produced.records(), produced.batches());
        if batches.iter().any(|(_, h)| h.is_control()) {
            return Err(AppendError::InvalidRecord(
                "clients may not write control batches".into(),
            ));
        }
        super::cleaner::records::check_produced(records, batches, &self.log_config())?;
        self.append_validated(records, batches)
    }

    /// Waits until `pending` (an append made by one of the `_unsynced` calls) is durable,
    /// then gives its outcome.
    pub fn finish(&self, pending: PendingAppend) -> Result<AppendOutcome, AppendError> {
        if let Some(target) = pending.durable_at {
            self.make_durable(target)?;
        }
        Ok(pending.outcome)
    }

    /// Appends control batches (transaction markers: COMMIT/ABORT built by the transaction
    /// coordinator, see [`batch::encode_batch`]) that clients may not write through
    /// [`Partition::append`]. Markers skip sequence checks (they carry sequence -1) but not the
    /// epoch check: a marker with an older epoch than the producer's is refused with
    /// `InvalidProducerEpoch`; one with a newer epoch (the coordinator bumped it to fence a
    /// producer) becomes the producer's epoch, whose next data batch must start at sequence 0.
    /// A marker closes the producer's open transaction on this partition
    /// (`ProducerEntry::txn_first_offset`).
    pub fn append_control(&self, records: Bytes) -> Result<AppendOutcome, AppendError> {
        let pending = self.append_control_unsynced(records)?;
        self.finish(pending)
    }

    /// [`Partition::append_control`] without waiting for the fsync (see
    /// [`Partition::append_unsynced`]).
    pub fn append_control_unsynced(&self, records: Bytes) -> Result<PendingAppend, AppendError> {
        let batches = batch::split_batches(&records)?;
        if let Some((_, h)) = batches.iter().find(|(_, h)| !h.is_control()) {
            return Err(AppendError::InvalidRecord(format!(
                "append_control takes control batches only (attributes {:#x})",
                h.attributes
            )));
        }
        self.append_validated(&records, &batches)
    }

    /// A copy of the producer state of `producer_id` on this partition, if known.
    pub fn producer_state(&self, producer_id: i64) -> Option<ProducerEntry> {
        self.lock().producers.get(producer_id).cloned()
    }

    /// Copies of every producer's state on this partition, sorted by producer id.
    pub fn producer_states(&self) -> Vec<(i64, ProducerEntry)> {
        let st = self.lock();
        let mut all: Vec<(i64, ProducerEntry)> = st
            .producers
            .iter()
            .map(|(pid, e)| (*pid, e.clone()))
            .collect();
        all.sort_by_key(|(pid, _)| *pid);
        all
    }

    /// Producers with an open transaction on this partition: (producer id, first offset),
    /// ordered by first offset.
    pub fn open_transactions(&self) -> Vec<(i64, i64)> {
        let st = self.lock();
        let mut open: Vec<(i64, i64)> = st
            .producers
            .iter()
            .filter_map(|(pid, e)| e.txn_first_offset.map(|first| (*pid, first)))
            .collect();
        open.sort_by_key(|(pid, first)| (*first, *pid));
        open
    }

    /// Appends a COMMIT (`commit`) or ABORT marker for a producer's transaction on this
    /// partition (see [`Partition::append_control`]). `timestamp` is the marker's record time.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        timestamp: i64,
    ) -> Result<AppendOutcome, AppendError> {
        let pending = self.append_marker_unsynced(
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            timestamp,
        )?;
        self.finish(pending)
    }

    /// [`Partition::append_marker`] without waiting for the fsync: the marker is ordered in
    /// the log (and closes the producer's open transaction here) but is durable, and visible
    /// to readers, only once [`Partition::finish`] returned for it. The transaction
    /// coordinator appends markers under the partition's transaction lock and waits for the
    /// fsync after releasing it, so Produce requests to the partition do not wait for it.
    pub fn append_marker_unsynced(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        timestamp: i64,
    ) -> Result<PendingAppend, AppendError> {
        let marker = txn_index::encode_marker(
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            timestamp,
        );
        self.append_control_unsynced(marker.freeze())
    }

    /// The last stable offset: the first offset of the earliest open transaction, or the high
    /// watermark if none is open (or all open ones start above it).
    pub fn last_stable_offset(&self) -> i64 {
        Self::lso_of(&self.lock())
    }

    fn lso_of(st: &LogState) -> i64 {
        // DeleteRecords may move the log start past an open transaction's first offset (as in
        // Kafka); the last stable offset never falls below the log start.
        st.producers
            .iter()
            .filter_map(|(_, e)| e.txn_first_offset)
            .fold(st.high_watermark, i64::min)
            .max(st.log_start)
    }

    /// Appends already validated batches (`batches` = positions and headers within `records`).
    fn append_validated(
        &self,
        records: &Bytes,
        batches: &[(usize, BatchHeader)],
    ) -> Result<PendingAppend, AppendError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.check_writable(st)?;
        let mut staged: Vec<(i64, ProducerEntry)> = Vec::new();
        let mut next = st.log_end;
        let mut assigned: Vec<BatchHeader> = Vec::with_capacity(batches.len());
        // (producer id, first offset, marker offset) of transactions aborted by this request.
        let mut aborts: Vec<(i64, i64, i64)> = Vec::new();
        for (pos, h) in batches {
            let current = staged
                .iter()
                .rev()
                .find(|(p, _)| *p == h.producer_id)
                .map(|(_, e)| e)
                .or_else(|| st.producers.get(h.producer_id));
            if let SequenceCheck::Duplicate(m) = ProducerStates::check(current, h)? {
                let outcome = AppendOutcome {
                    base_offset: m.base_offset,
                    last_offset: m.last_offset,
                    log_append_time: -1,
                    log_start_offset: st.log_start,
                    duplicate: true,
                };
                // If the original is written but its fsync is still in flight, answer only
                // once it is durable.
                let durable_at = (m.last_offset >= st.high_watermark).then_some(m.last_offset + 1);
                return Ok(PendingAppend {
                    outcome,
                    durable_at,
                });
            }
            let mut h = *h;
            h.base_offset = next;
            next = h.last_offset() + 1;
            if h.is_control()
                && txn_index::control_type(&records[*pos..*pos + h.size], &h) == Some(CONTROL_ABORT)
            {
                if let Some(first) = current.and_then(|e| e.txn_first_offset) {
                    aborts.push((h.producer_id, first, h.base_offset));
                }
            }
            if let Some(mut e) = ProducerStates::apply(current.cloned(), &h) {
                if let Some(epoch) =
                    txn_index::marker_coordinator_epoch(&records[*pos..*pos + h.size], &h)
                {
                    e.coordinator_epoch = epoch;
                }
                staged.push((h.producer_id, e));
            }
            assigned.push(h);
        }
        // The stored bytes are the producer's with each batch's baseOffset replaced (it is
        // outside the CRC): the log file gets the new offsets and the rest of each batch as
        // pieces of the request's own buffer, so the records are never re-encoded, are
        // copied at most once (into the file), and an in-memory file keeps them uncopied.
        let offsets = Bytes::from(
            assigned
                .iter()
                .flat_map(|h| h.base_offset.to_be_bytes())
                .collect::<Vec<u8>>(),
        );
        let mut parts: Vec<Bytes> = Vec::with_capacity(2 * batches.len());
        for (i, ((pos, _), h)) in batches.iter().zip(&assigned).enumerate() {
            parts.push(offsets.slice(8 * i..8 * i + 8));
            parts.push(records.slice(*pos + 8..*pos + h.size));
        }
        let written: usize = parts.iter().map(Bytes::len).sum();
        let active_size = st.segments.last().map_or(0, Segment::size);
        if active_size > 0 && active_size + written as u64 > self.log_config().segment_bytes {
            if let Err(e) = self.roll(st) {
                // After a failed fsync nothing is known about what reached the disk.
                st.failed = Some(format!("segment roll failed: {e}"));
                return Err(e.into());
            }
        }
        let Some(active) = st.segments.last_mut() else {
            return Err(StorageError::Corrupt {
                path: self.dir.clone(),
                reason: "partition has no segment".into(),
            }
            .into());
        };
        let old_size = active.size();
        let start = match active.log.append_shared(&parts) {
            Ok(pos) => pos,
            Err(e) => {
                let err = self.io_err(&active.log_path, e);
                if let Err(e2) = active.log.truncate(old_size) {
                    st.failed = Some(format!("append failed and could not be undone: {e2}"));
                }
                return Err(err.into());
            }
        };
        for ((pos, _), h) in batches.iter().zip(&assigned) {
            active.note_batch(start + *pos as u64, h);
        }
        for (pid, e) in staged {
            st.producers.insert(pid, e);
        }
        let base_offset = st.log_end;
        if !aborts.is_empty() {
            if let Err(e) = self.record_aborts(st, &aborts, base_offset, batches.len() > 1) {
                st.failed = Some(format!("aborted-transaction index write failed: {e}"));
                return Err(e.into());
            }
        }
        st.log_end = next;
        st.unsynced = true;
        self.metrics.bytes_appended.increment(written as u64);
        self.metrics.log_end_offset.set(next as f64);
        let outcome = AppendOutcome {
            base_offset,
            last_offset: next - 1,
            log_append_time: -1,
            log_start_offset: st.log_start,
            duplicate: false,
        };
        let durable_at = match self.ctx.fsync {
            FsyncPolicy::EveryBatch => Some(next),
            FsyncPolicy::Interval(_) | FsyncPolicy::Never => {
                st.high_watermark = next;
                None
            }
        };
        Ok(PendingAppend {
            outcome,
            durable_at,
        })
    }

    /// Adds aborted-index entries for ABORT markers just written and appends them to the file
    /// (fsynced before the next snapshot: entries after a snapshot are re-derived on recovery).
    fn record_aborts(
        &self,
        st: &mut LogState,
        aborts: &[(i64, i64, i64)],
        request_base: i64,
        multi_batch: bool,
    ) -> Result<(), StorageError> {
        let open_min = st
            .producers
            .iter()
            .filter_map(|(_, e)| e.txn_first_offset)
            .min();
        let mut buf = Vec::new();
        for &(producer_id, first_offset, last_offset) in aborts {
            let mut lso = open_min.map_or(last_offset + 1, |m| m.min(last_offset + 1));
            if multi_batch {
                // Later markers of the same request may close transactions that were open
                // here; the request start is a safe lower bound for all of them.
                lso = lso.min(request_base);
            }
            let entry = AbortedTxn {
                producer_id,
                first_offset,
                last_offset,
                last_stable_offset: lso,
            };
            buf.extend_from_slice(&entry.encode());
            st.aborted.push(entry);
        }
        st.txn_index_unsynced = true;
        st.txn_index
            .append(&buf)
            .map(|_| ())
            .map_err(|e| self.io_err(&self.dir.join(txn_index::TXN_INDEX_FILE), e))
    }

    /// fsyncs the aborted-transaction index if entries were added since the last fsync.
    fn sync_txn_index(&self, st: &mut LogState) -> Result<(), StorageError> {
        if st.txn_index_unsynced {
            st.txn_index
                .sync()
                .map_err(|e| self.io_err(&self.dir.join(txn_index::TXN_INDEX_FILE), e))?;
            st.txn_index_unsynced = false;
        }
        Ok(())
    }

    /// Waits until offsets below `target` are durable and visible to readers (the high
    /// watermark reached `target`), fsyncing the active segment if needed. Fsyncs are
    /// serialized per partition and run without the state lock (appends go on meanwhile); one
    /// fsync covers everything written before it started, so concurrent and pipelined
    /// appenders share it (group commit). Fails if the partition went offline (a failed
    /// fsync) before the data was known durable.
    pub fn make_durable(&self, target: i64) -> Result<(), StorageError> {
        let _syncing = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (file, path, covered) = {
            let st = self.lock();
            if st.high_watermark >= target {
                return Ok(());
            }
            if let Some(why) = &st.failed {
                // An earlier fsync failed: nothing is known about what reached the disk.
                return Err(StorageError::io(
                    &self.dir,
                    io::Error::other(format!("partition offline until restart: {why}")),
                ));
            }
            let Some(active) = st.segments.last() else {
                return Ok(());
            };
            // Everything below the log end is in the active segment or in a sealed one,
            // which the roll fsynced.
            (Arc::clone(&active.log), active.log_path.clone(), st.log_end)
        };
        let started = Instant::now();
        let res = file.sync();
        self.metrics
            .fsync_seconds
            .record(started.elapsed().as_secs_f64());
        let mut st = self.lock();
        match res {
            Ok(()) => {
                st.high_watermark = st.high_watermark.max(covered);
                Ok(())
            }
            Err(e) => {
                st.failed = Some(format!("fsync of {} failed: {e}", path.display()));
                Err(self.io_err(&path, e))
            }
        }
    }

    /// Seals the active segment (fsync and index under every-batch) and starts a new one at
    /// the log end.
    ///
    /// Under every-batch the sealed segment is fsynced here: its appends were each synced
    /// before their answer, so this covers at most the appends still waiting for theirs, and
    /// [`Partition::make_durable`] relies on sealed segments being durable. Under the other
    /// policies nothing waits for durability, and syncing a whole segment (64 MiB by
    /// default) here would stall every producer of the partition for the disk's time to
    /// write it: the segment joins [`LogState::sealed_unsynced`] and the next flush (the
    /// interval flusher, or shutdown) syncs it without holding the partition's lock.
    fn roll(&self, st: &mut LogState) -> Result<(), StorageError> {
        let log_end = st.log_end;
        let every_batch = self.ctx.fsync == FsyncPolicy::EveryBatch;
        if let Some(active) = st.segments.last_mut() {
            if every_batch {
                let started = Instant::now();
                active
                    .log
                    .sync()
                    .map_err(|e| self.io_err(&active.log_path, e))?;
                self.metrics
                    .fsync_seconds
                    .record(started.elapsed().as_secs_f64());
                active
                    .persist_index()
                    .map_err(|e| self.io_err(&active.log_path, e))?;
            } else if st.unsynced {
                // the flush that syncs the sealed data persists its index entries too
                let sealed = (Arc::clone(&active.log), active.log_path.clone());
                st.sealed_unsynced.push(sealed);
            }
        }
        st.high_watermark = log_end;
        st.unsynced = false;
        let seg = Segment::create(self.ctx.backend.as_ref(), &self.dir, log_end)
            .map_err(|e| self.io_err(&self.dir, e))?;
        tracing::debug!(topic = %self.topic, partition = self.index, base_offset = log_end, "rolled segment");
        st.segments.push(seg);
        if let Some(due) = &self.ctx.retention_due {
            if over_retention_bytes(&self.log_config(), st) {
                due.mark(&self.topic, self.index);
            }
        }
        if matches!(self.ctx.fsync, FsyncPolicy::Interval(_)) {
            // The flusher syncs the directory and writes the snapshot on its next pass. Here
            // their fsyncs would wait, holding the partition's lock, for the journal commit
            // of the flusher's own fsync (a second of data) whenever the two overlap.
            st.roll_unsynced = true;
            return Ok(());
        }
        self.ctx
            .backend
            .sync_dir(&self.dir)
            .map_err(|e| self.io_err(&self.dir, e))?;
        self.write_snapshot(st)
    }

    /// Writes a producer-state snapshot at the log end and prunes old ones.
    fn write_snapshot(&self, st: &mut LogState) -> Result<(), StorageError> {
        let offset = st.log_end;
        if st.snapshots.last() == Some(&offset) {
            return Ok(());
        }
        // Aborted entries below the snapshot offset are not re-derived on recovery.
        self.sync_txn_index(st)?;
        let path = self.dir.join(segment::file_name(offset, "snapshot"));
        self.ctx
            .backend
            .write_file_atomic(&path, &snapshot::encode(offset, &st.producers))
            .map_err(|e| self.io_err(&path, e))?;
        st.snapshots.push(offset);
        while st.snapshots.len() > SNAPSHOTS_KEPT {
            let old = st.snapshots.remove(0);
            let old_path = self.dir.join(segment::file_name(old, "snapshot"));
            if let Err(e) = self.ctx.backend.remove_file(&old_path) {
                tracing::warn!(file = %old_path.display(), error = %e, "could not remove old snapshot");
            }
        }
        Ok(())
    }

    /// fsyncs unsynced data (sealed segments the roll left unsynced, then the active one) and
    /// persists pending index entries; with `snapshot`, also writes a producer-state snapshot
    /// if the log moved since the last one.
    ///
    /// The data fsyncs run without the partition's lock, as [`Partition::make_durable`]'s do:
    /// a second's worth of appends can take the disk hundreds of milliseconds to write, and
    /// producers go on appending meanwhile. Whatever they append is covered by the next flush.
    pub(crate) fn flush(&self, snapshot: bool) -> Result<(), StorageError> {
        let _syncing = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (files, covered, rolled) = {
            let mut st = self.lock();
            if st.deleted || st.failed.is_some() {
                return Ok(());
            }
            let mut files = std::mem::take(&mut st.sealed_unsynced);
            if st.unsynced {
                if let Some(active) = st.segments.last() {
                    files.push((Arc::clone(&active.log), active.log_path.clone()));
                }
            }
            (files, st.log_end, std::mem::take(&mut st.roll_unsynced))
        };
        // After a failed fsync nothing is known about what reached the disk.
        let offline = |path: &Path, e: io::Error| {
            let err = self.io_err(path, e);
            self.lock().failed = Some(format!("flush failed: {err}"));
            err
        };
        // in log order: a sealed segment is durable before any later data is
        for (file, path) in &files {
            let started = Instant::now();
            let res = file.sync();
            self.metrics
                .fsync_seconds
                .record(started.elapsed().as_secs_f64());
            res.map_err(|e| offline(path, e))?;
        }
        if rolled {
            // the new segments' directory entries, after the data of the sealed ones
            self.ctx
                .backend
                .sync_dir(&self.dir)
                .map_err(|e| offline(&self.dir, e))?;
        }
        let mut guard = self.lock();
        let res = self.flush_locked(&mut guard, covered, snapshot || rolled);
        if let Err(e) = &res {
            guard.failed = Some(format!("flush failed: {e}"));
        }
        res
    }

    /// The part of [`Partition::flush`] after its data fsyncs, which covered the log below
    /// `covered`.
    fn flush_locked(
        &self,
        guard: &mut LogState,
        covered: i64,
        snapshot: bool,
    ) -> Result<(), StorageError> {
        let st = guard;
        if st.deleted || st.failed.is_some() {
            return Ok(());
        }
        // Index entries of every segment, sealed ones included, but only of batches below
        // `covered`: entries never point past durable data.
        for seg in &mut st.segments {
            seg.persist_index_below(covered)
                .map_err(|e| self.io_err(&seg.log_path, e))?;
        }
        // appends made while the fsyncs ran are the next flush's
        if st.log_end == covered {
            st.unsynced = false;
        }
        st.high_watermark = st.high_watermark.max(covered);
        self.sync_txn_index(st)?;
        if snapshot {
            self.write_snapshot(st)?;
        }
        Ok(())
    }
}
