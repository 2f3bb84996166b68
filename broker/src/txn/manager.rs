//! [`TxnManager`]: the broker-facing transaction service. It owns the coordinator and the
//! per-partition transaction layers, writes markers, answers the transactional APIs, guards
//! transactional Produce, serves read_committed reads, and runs the timeout/expiry task.
//!
//! Lock order: a partition's transaction lock may be held while taking the coordinator lock
//! (Produce checks), never the other way round (markers are written after the coordinator
//! lock is released).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::coordinator::{Coordinator, CoordinatorConfig, MarkerJob, ProducerIdSource, Step};
use super::error::{Result, TxnError};
use super::log::{LogImage, TxnLog};
use super::marker::{build_marker, MarkerKind};
use super::metrics;
use super::partition_state::AbortedTxn;
use super::partition_txn::{for_each_batch, PartitionTxn};
use super::state::TopicPartition;
use crate::storage::batch::parse_header;
use crate::storage::{AppendError, AppendOutcome, Partition, ReadError, Store};

/// Name of the transaction-state directory inside the broker's data dir.
pub const TXN_DIR: &str = "__transaction_state";

/// Configuration of the transaction layer.
#[derive(Debug, Clone, Default)]
pub struct TxnConfig {
    /// The broker's data dir (None = in-memory, nothing persisted).
    pub data_dir: Option<PathBuf>,
    /// Coordinator limits.
    pub coordinator: CoordinatorConfig,
    /// Test failpoint: pause between persisting PrepareCommit/PrepareAbort and writing the
    /// markers (lets crash tests kill the broker "right after PrepareCommit"). Zero normally.
    pub marker_delay: Duration,
}

/// Where transactional offsets live: the group coordinator's offsets store.
pub trait TxnOffsetsSink: Send + Sync {
    /// Applies (commit) or drops (abort) the offsets `producer_id` staged for `group`.
    fn complete_txn(
        &self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> std::result::Result<(), String>;
}

/// Callback run after a marker lands on a partition (wakes long-polling fetches).
pub type AppendNotifier = Arc<dyn Fn(&str, i32) + Send + Sync>;

/// Why a Produce to a partition failed in the transaction layer.
#[derive(Debug, thiserror::Error)]
pub enum TxnProduceError {
    /// The coordinator refused the batch (fenced epoch, partition not in the transaction,
    /// unknown producer): the client's error code.
    #[error("transactional produce refused: {0:?}")]
    Refused(ResponseError),
    /// The store refused or failed the append.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// Transaction state could not be loaded or persisted.
    #[error(transparent)]
    Txn(#[from] TxnError),
}

/// Data a read_committed fetch may return.
#[derive(Debug, Clone)]
pub struct CommittedRead {
    /// Whole batches below the last stable offset.
    pub records: Bytes,
    /// The last stable offset.
    pub last_stable_offset: i64,
    /// Aborted transactions overlapping the returned range.
    pub aborted: Vec<AbortedTxn>,
}

/// Why a read_committed fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum CommittedReadError {
    /// The log refused the read (offset out of range, I/O).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Transaction state could not be loaded.
    #[error(transparent)]
    Txn(#[from] TxnError),
}

#[derive(Default)]
struct Hooks {
    offsets: Option<Arc<dyn TxnOffsetsSink>>,
    notifier: Option<AppendNotifier>,
}

/// The transaction service of one broker.
pub struct TxnManager {
    store: Store,
    root: Option<PathBuf>,
    coordinator: Mutex<Coordinator>,
    partitions: Mutex<HashMap<TopicPartition, Arc<PartitionTxn>>>,
    in_flight: Mutex<HashSet<String>>,
    hooks: RwLock<Hooks>,
    marker_delay: Duration,
}

impl std::fmt::Debug for TxnManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnManager")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Wall clock in ms since the Unix epoch (timeouts survive restarts).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl TxnManager {
    /// Opens the transaction log and recovers: transactions found in PrepareCommit /
    /// PrepareAbort get their markers written again (idempotently); Ongoing ones stay open
    /// until their timeout aborts them.
    pub fn open(
        store: Store,
        config: TxnConfig,
        pids: Arc<dyn ProducerIdSource>,
    ) -> Result<Arc<Self>> {
        let root = config.data_dir.as_ref().map(|d| d.join(TXN_DIR));
        let (log, image) = match &root {
            Some(r) => TxnLog::open(r)?,
            None => (
                TxnLog::in_memory(),
                LogImage {
                    coordinator_epoch: -1,
                    ..LogImage::default()
                },
            ),
        };
        let coordinator = Coordinator::open(config.coordinator, log, image, pids)?;
        let pending = coordinator.pending_jobs();
        let mut mgr = TxnManager {
            store,
            root,
            coordinator: Mutex::new(coordinator),
            partitions: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashSet::new()),
            hooks: RwLock::new(Hooks::default()),
            marker_delay: Duration::ZERO,
        };
        for job in pending {
            tracing::info!(transactional_id = %job.transactional_id, kind = ?job.kind,
                "completing a prepared transaction found on restart");
            if let Err(e) = mgr.run_job(&job) {
                tracing::warn!(error = %e, "completing a recovered transaction failed; will retry");
            }
        }
        // The failpoint applies to live requests only, not to recovery.
        mgr.marker_delay = config.marker_delay;
        Ok(Arc::new(mgr))
    }

    /// Connects the group offsets store (markers for AddOffsetsToTxn groups).
    pub fn set_offsets_sink(&self, sink: Arc<dyn TxnOffsetsSink>) {
        self.hooks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .offsets = Some(sink);
    }

    /// Connects the fetch wake-up callback run after markers are appended.
    pub fn set_append_notifier(&self, notifier: AppendNotifier) {
        self.hooks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .notifier = Some(notifier);
    }

    fn coordinator(&self) -> MutexGuard<'_, Coordinator> {
        self.coordinator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coordinator's limits.
    pub fn config(&self) -> CoordinatorConfig {
        self.coordinator().config()
    }

    /// Transactions open or completing.
    pub fn open_transactions(&self) -> usize {
        self.coordinator().open_transactions()
    }

    /// The transaction layer of `partition`, recovering it on first use.
    pub fn partition_txn(&self, partition: &Arc<Partition>) -> Result<Arc<PartitionTxn>> {
        let key = (partition.topic().to_string(), partition.index());
        let mut map = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&key) {
            if Arc::ptr_eq(&p.partition, partition) {
                return Ok(p.clone());
            }
        }
        let p = Arc::new(PartitionTxn::recover(
            partition.clone(),
            self.root.as_deref(),
        )?);
        map.insert(key, p.clone());
        Ok(p)
    }

    /// Appends a Produce request's records to `partition`. Transactional batches are
    /// checked against the coordinator (current epoch, partition added to the open
    /// transaction) and open the producer's transaction on the partition; other batches go
    /// straight to the store.
    pub fn append(
        &self,
        partition: &Arc<Partition>,
        records: Bytes,
    ) -> std::result::Result<AppendOutcome, TxnProduceError> {
        let header = match parse_header(&records) {
            Ok(h) if h.is_transactional() && h.has_producer_id() && !h.is_control() => h,
            _ => return Ok(partition.append(records)?),
        };
        let pt = self.partition_txn(partition)?;
        let mut g = pt.lock();
        if let Err(code) = self.coordinator().check_produce(
            header.producer_id,
            header.producer_epoch,
            partition.topic(),
            partition.index(),
        ) {
            metrics::counter!(metrics::PRODUCE_REFUSED, "error" => code_label(code)).increment(1);
            tracing::debug!(
                topic = partition.topic(),
                partition = partition.index(),
                producer_id = header.producer_id,
                epoch = header.producer_epoch,
                ?code,
                "transactional batch refused"
            );
            return Err(TxnProduceError::Refused(code));
        }
        let outcome = partition.append(records)?;
        if !outcome.duplicate {
            g.observe_data(header.producer_id, outcome.base_offset);
        }
        Ok(outcome)
    }

    /// The last stable offset of `partition` (also updates the LSO lag gauge).
    pub fn last_stable_offset(&self, partition: &Arc<Partition>) -> Result<i64> {
        let pt = self.partition_txn(partition)?;
        let lso = pt.last_stable_offset();
        record_lso_lag(partition, lso);
        Ok(lso)
    }

    /// A read_committed read: whole batches from `fetch_offset` below the LSO, with the
    /// aborted transactions (from the index) overlapping what is returned.
    pub fn read_committed(
        &self,
        partition: &Arc<Partition>,
        fetch_offset: i64,
        max_bytes: usize,
    ) -> std::result::Result<CommittedRead, CommittedReadError> {
        let pt = self.partition_txn(partition)?;
        let lso = pt.last_stable_offset();
        record_lso_lag(partition, lso);
        let raw = partition.read(fetch_offset, max_bytes)?;
        let mut end = 0usize;
        let mut upper = fetch_offset;
        let mut pos = 0usize;
        for_each_batch(&raw, |batch, h| {
            pos += batch.len();
            if h.base_offset < lso {
                end = pos;
                upper = upper.max(h.last_offset() + 1);
            }
        });
        let records = raw.slice(..end);
        let aborted = if end == 0 {
            Vec::new()
        } else {
            pt.lock().state.aborted_between(fetch_offset, upper)
        };
        Ok(CommittedRead {
            records,
            last_stable_offset: lso,
            aborted,
        })
    }

    /// InitProducerId with a transactional id. A fenced open transaction is aborted before
    /// answering CONCURRENT_TRANSACTIONS (the client retries and gets the bumped epoch).
    pub fn init_producer_id(
        &self,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<std::result::Result<(i64, i16), ResponseError>> {
        let step = self.coordinator().init_producer_id(
            transactional_id,
            timeout_ms,
            expected,
            now_ms(),
        )?;
        self.finish(step)
    }

    /// AddPartitionsToTxn.
    pub fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<std::result::Result<(), ResponseError>> {
        self.coordinator().add_to_txn(
            transactional_id,
            producer_id,
            epoch,
            partitions,
            &[],
            now_ms(),
        )
    }

    /// AddOffsetsToTxn.
    pub fn add_offsets(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
    ) -> Result<std::result::Result<(), ResponseError>> {
        self.coordinator().add_to_txn(
            transactional_id,
            producer_id,
            epoch,
            &[],
            &[group.to_string()],
            now_ms(),
        )
    }

    /// TxnOffsetCommit's check: the group was added to the producer's open transaction.
    pub fn check_txn_offsets(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
    ) -> std::result::Result<(), ResponseError> {
        self.coordinator()
            .check_offsets(transactional_id, producer_id, epoch, group)
    }

    /// EndTxn: PrepareCommit/PrepareAbort is persisted, then the markers are written and
    /// CompleteCommit/CompleteAbort persisted. The answer is success once Prepare is durable
    /// (a marker failure is retried by the background task).
    pub fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<std::result::Result<(), ResponseError>> {
        let step =
            self.coordinator()
                .end_txn(transactional_id, producer_id, epoch, commit, now_ms())?;
        self.finish(step)
    }

    fn finish<T>(&self, step: Step<T>) -> Result<std::result::Result<T, ResponseError>> {
        if let Some(job) = &step.job {
            if let Err(e) = self.run_job(job) {
                tracing::warn!(transactional_id = %job.transactional_id, error = %e,
                    "writing transaction markers failed; the background task retries");
            }
        }
        Ok(step.answer)
    }

    /// Writes the markers of a prepared transaction to every partition that holds its open
    /// data (a partition that already got its marker is skipped, so re-running is
    /// idempotent), completes its group offsets, and records CompleteCommit/CompleteAbort.
    pub fn run_job(&self, job: &MarkerJob) -> Result<()> {
        {
            let mut fl = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if !fl.insert(job.transactional_id.clone()) {
                return Ok(());
            }
        }
        let result = self.run_job_inner(job);
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job.transactional_id);
        result
    }

    fn run_job_inner(&self, job: &MarkerJob) -> Result<()> {
        if !self.marker_delay.is_zero() {
            tracing::warn!(delay = ?self.marker_delay, "test failpoint: delaying markers");
            std::thread::sleep(self.marker_delay);
        }
        let notifier = self
            .hooks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .notifier
            .clone();
        for (topic, index) in &job.partitions {
            let Some(partition) = self.store.partition(topic, *index) else {
                tracing::warn!(%topic, partition = index, "partition of a transaction is gone; no marker");
                continue;
            };
            let pt = self.partition_txn(&partition)?;
            let mut g = pt.lock();
            if !g.state.is_open(job.producer_id) {
                continue;
            }
            let marker = build_marker(
                job.kind,
                job.producer_id,
                job.producer_epoch,
                job.coordinator_epoch,
                now_ms(),
            );
            let outcome = partition
                .append_control(marker)
                .map_err(|e| TxnError::Marker {
                    topic: topic.clone(),
                    partition: *index,
                    reason: e.to_string(),
                })?;
            g.observe_marker(job.producer_id, job.kind, outcome.base_offset)?;
            drop(g);
            if let Some(n) = &notifier {
                n(topic, *index);
            }
        }
        if !job.groups.is_empty() {
            let sink = self
                .hooks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .offsets
                .clone();
            for group in &job.groups {
                match &sink {
                    Some(s) => s
                        .complete_txn(group, job.producer_id, job.kind == MarkerKind::Commit)
                        .map_err(|reason| TxnError::Marker {
                            topic: format!("group offsets of {group}"),
                            partition: -1,
                            reason,
                        })?,
                    None => {
                        // Stay prepared: the background task retries once the store is wired.
                        return Err(TxnError::Marker {
                            topic: format!("group offsets of {group}"),
                            partition: -1,
                            reason: "no group offsets store connected yet".into(),
                        });
                    }
                }
            }
        }
        let result = match job.kind {
            MarkerKind::Commit => "commit",
            MarkerKind::Abort => "abort",
        };
        if self.coordinator().complete(job, now_ms())?.is_some() {
            metrics::counter!(metrics::COMPLETED, "result" => result).increment(1);
        }
        Ok(())
    }

    /// One round of background work: abort timed-out transactions, expire idle ids, retry
    /// markers still owed.
    pub fn tick(&self) -> Result<()> {
        let mut jobs = self.coordinator().expire(now_ms())?;
        jobs.extend(self.coordinator().pending_jobs());
        let mut seen = HashSet::new();
        for job in jobs {
            if seen.insert(job.transactional_id.clone()) {
                self.run_job(&job)?;
            }
        }
        Ok(())
    }

    /// Writes every partition's open-transaction snapshot (shutdown, periodically).
    pub fn snapshot_all(&self) -> Result<()> {
        let parts: Vec<Arc<PartitionTxn>> = self
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for p in parts {
            p.snapshot()?;
        }
        Ok(())
    }

    /// Runs [`TxnManager::tick`] every `period` and snapshots every 50 ticks, until the
    /// returned task is aborted.
    pub fn spawn_background(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n: u64 = 0;
            loop {
                interval.tick().await;
                n += 1;
                let m = me.clone();
                let res = tokio::task::spawn_blocking(move || {
                    m.tick()?;
                    if n % 50 == 0 {
                        m.snapshot_all()?;
                    }
                    Ok::<(), TxnError>(())
                })
                .await;
                match res {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "transaction background task"),
                    Err(e) => tracing::error!(error = %e, "transaction background task panicked"),
                }
            }
        })
    }
}

fn record_lso_lag(partition: &Partition, lso: i64) {
    let lag = (partition.high_watermark() - lso).max(0);
    metrics::gauge!(metrics::LSO_LAG, "topic" => partition.topic().to_string(),
        "partition" => partition.index().to_string())
    .set(lag as f64);
}

fn code_label(code: ResponseError) -> &'static str {
    match code {
        ResponseError::InvalidProducerEpoch => "invalid_producer_epoch",
        ResponseError::InvalidTxnState => "invalid_txn_state",
        ResponseError::InvalidProducerIdMapping => "invalid_producer_id_mapping",
        _ => "other",
    }
}
