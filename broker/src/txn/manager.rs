//! [`TxnManager`]: the broker-facing transaction service. It owns the coordinator, answers
//! the transactional APIs, guards transactional Produce, writes markers through the storage
//! (which keeps each partition's open transactions, last stable offset and aborted index),
//! and runs the timeout/expiry task.
//!
//! Per partition, a transactional append (coordinator check + append) and a marker write
//! (open-transaction check + marker) each run under the partition's transaction lock, so a
//! batch that passed the check cannot land after its transaction's marker. Lock order: a
//! partition's transaction lock may be held while taking the coordinator lock (Produce
//! checks), never the other way round (markers are written after the coordinator lock is
//! released).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::coordinator::{Coordinator, CoordinatorConfig, MarkerJob, ProducerIdSource, Step};
use super::error::{Result, TxnError};
use super::log::{LogImage, TxnLog};
use super::metrics;
use super::produce_view::ProduceView;
use super::state::TopicPartition;
use crate::storage::batch::ProducedBatches;
use crate::storage::{AppendError, AppendOutcome, Partition, PendingAppend, Store};

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
    /// Open a transaction log holding damage followed by valid records by dropping the
    /// damaged bytes (reported at error level and in metrics) instead of refusing to start.
    pub repair_corrupt_logs: bool,
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
    /// The coordinator's [`ProduceView`]: transactional Produce requests check against it
    /// without waiting for the coordinator's lock (held through transaction-log fsyncs).
    produce_view: Arc<ProduceView>,
    partition_locks: Mutex<HashMap<TopicPartition, Arc<Mutex<()>>>>,
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
    /// Opens the transaction log. Call [`TxnManager::complete_pending`] once the group
    /// offsets store is connected: transactions found in PrepareCommit / PrepareAbort then
    /// get their markers written again (idempotently); Ongoing ones stay open until their
    /// timeout aborts them.
    pub fn open(
        store: Store,
        config: TxnConfig,
        pids: Arc<dyn ProducerIdSource>,
    ) -> Result<Arc<Self>> {
        let root = config.data_dir.as_ref().map(|d| d.join(TXN_DIR));
        let (log, image) = match &root {
            Some(r) => TxnLog::open(r, config.repair_corrupt_logs)?,
            None => (
                TxnLog::in_memory(),
                LogImage {
                    coordinator_epoch: -1,
                    ..LogImage::default()
                },
            ),
        };
        let coordinator = Coordinator::open(config.coordinator, log, image, pids)?;
        Ok(Arc::new(TxnManager {
            store,
            root,
            produce_view: coordinator.produce_view(),
            coordinator: Mutex::new(coordinator),
            partition_locks: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashSet::new()),
            hooks: RwLock::new(Hooks::default()),
            marker_delay: config.marker_delay,
        }))
    }

    /// Recovery: writes the markers of every transaction in PrepareCommit / PrepareAbort
    /// (after a restart). Failures are logged and retried by the background task.
    pub fn complete_pending(&self) {
        let pending = self.coordinator().pending_jobs();
        for job in pending {
            tracing::info!(transactional_id = %job.transactional_id, kind = ?job.kind,
                "completing a prepared transaction found on restart");
            if let Err(e) = self.run_job_opts(&job, false) {
                tracing::warn!(error = %e, "completing a recovered transaction failed; will retry");
            }
        }
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

    /// A copy of the coordinator's metadata of `transactional_id`, if known.
    pub fn describe(&self, transactional_id: &str) -> Option<super::state::TxnMetadata> {
        self.coordinator().get(transactional_id).cloned()
    }

    /// Copies of every known transactional id's metadata, sorted by transactional id.
    pub fn list(&self) -> Vec<super::state::TxnMetadata> {
        let mut all: Vec<_> = self.coordinator().all().cloned().collect();
        all.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        all
    }

    /// Transactions open or completing.
    pub fn open_transactions(&self) -> usize {
        self.coordinator().open_transactions()
    }

    /// The transaction lock of `partition`.
    fn partition_lock(&self, partition: &Partition) -> Arc<Mutex<()>> {
        let key = (partition.topic().to_string(), partition.index());
        self.partition_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default()
            .clone()
    }

    /// Appends a Produce request's records (split and validated by the caller) to
    /// `partition`; `transactional_id` is the request's. Transactional batches are checked
    /// against the coordinator (the producer id is `transactional_id`'s, current epoch,
    /// partition added to the open transaction) under the partition's transaction lock; the
    /// store records the transaction's first offset. Other batches go straight to the store.
    pub fn append_produced(
        &self,
        partition: &Arc<Partition>,
        transactional_id: Option<&str>,
        produced: &ProducedBatches,
    ) -> std::result::Result<AppendOutcome, TxnProduceError> {
        self.checked_append(partition, transactional_id, produced, |p, b| {
            p.append_produced(b)
        })
    }

    /// [`append_produced`](Self::append_produced) of records not yet split and validated.
    pub fn append(
        &self,
        partition: &Arc<Partition>,
        transactional_id: Option<&str>,
        records: Bytes,
    ) -> std::result::Result<AppendOutcome, TxnProduceError> {
        let produced = ProducedBatches::parse(records).map_err(AppendError::from)?;
        self.append_produced(partition, transactional_id, &produced)
    }

    /// [`append_produced`](Self::append_produced) without waiting for the fsync (group
    /// commit): the same transactional checks under the same lock, then
    /// [`Partition::append_produced_unsynced`]; the caller makes the write durable with
    /// [`Partition::make_durable`] before answering.
    pub fn append_produced_unsynced(
        &self,
        partition: &Arc<Partition>,
        transactional_id: Option<&str>,
        produced: &ProducedBatches,
    ) -> std::result::Result<PendingAppend, TxnProduceError> {
        self.checked_append(partition, transactional_id, produced, |p, b| {
            p.append_produced_unsynced(b)
        })
    }

    /// Checks every transactional batch against the coordinator and appends the records
    /// with `write`, both under the partition's transaction lock, so no batch lands after
    /// its marker. Every batch is checked, not only the first: the store opens a
    /// transaction for any transactional batch it appends, and one the coordinator does not
    /// know would hold the partition's last stable offset back until an operator aborts it.
    fn checked_append<T>(
        &self,
        partition: &Arc<Partition>,
        transactional_id: Option<&str>,
        produced: &ProducedBatches,
        write: impl FnOnce(&Partition, &ProducedBatches) -> std::result::Result<T, AppendError>,
    ) -> std::result::Result<T, TxnProduceError> {
        // control batches from clients are refused by the store
        let mut guarded = produced
            .batches()
            .iter()
            .map(|(_, h)| h)
            .filter(|h| h.is_transactional() && !h.is_control())
            .peekable();
        if guarded.peek().is_none() {
            return Ok(write(partition, produced)?);
        }
        let lock = self.partition_lock(partition);
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        for header in guarded {
            let checked = match transactional_id {
                Some(id) => self.produce_view.check(
                    id,
                    header.producer_id,
                    header.producer_epoch,
                    partition.topic(),
                    partition.index(),
                ),
                None => Err(ResponseError::TransactionalIdAuthorizationFailed),
            };
            if let Err(code) = checked {
                metrics::counter!(metrics::PRODUCE_REFUSED, "error" => code_label(code))
                    .increment(1);
                tracing::debug!(
                    topic = partition.topic(),
                    partition = partition.index(),
                    transactional_id,
                    producer_id = header.producer_id,
                    epoch = header.producer_epoch,
                    ?code,
                    "transactional batch refused"
                );
                return Err(TxnProduceError::Refused(code));
            }
        }
        Ok(write(partition, produced)?)
    }

    /// InitProducerId with a transactional id. An open transaction is fenced and aborted
    /// first; once its abort is complete the request is answered as the client's retry would
    /// be (the bumped epoch), instead of with CONCURRENT_TRANSACTIONS and a retry. Kafka's
    /// coordinator answers CONCURRENT_TRANSACTIONS because its markers are written
    /// asynchronously; here they are written before the answer, and librdkafka would wait
    /// 500 ms before retrying, at every restart of a job whose producer had a transaction
    /// open. If the abort is not complete (its markers failed and are retried in the
    /// background, or another request is writing them), the answer stays
    /// CONCURRENT_TRANSACTIONS.
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
        let aborted_first =
            step.job.is_some() && step.answer == Err(ResponseError::ConcurrentTransactions);
        let answer = self.finish(step)?;
        if !aborted_first {
            return Ok(answer);
        }
        let again = self.coordinator().init_producer_id(
            transactional_id,
            timeout_ms,
            expected,
            now_ms(),
        )?;
        if again.job.is_some() {
            // not expected (the abort above left no open transaction); answer as before
            // and let the client's retry take the new step
            tracing::warn!(
                transactional_id,
                "InitProducerId found a transaction open again after aborting one"
            );
            return self.finish(again);
        }
        Ok(again.answer)
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
        self.run_job_opts(job, true)
    }

    /// [`TxnManager::run_job`]; `failpoint` false skips the test delay (recovery).
    fn run_job_opts(&self, job: &MarkerJob, failpoint: bool) -> Result<()> {
        {
            let mut fl = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if !fl.insert(job.transactional_id.clone()) {
                return Ok(());
            }
        }
        let result = self.run_job_inner(job, failpoint);
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job.transactional_id);
        result
    }

    fn run_job_inner(&self, job: &MarkerJob, failpoint: bool) -> Result<()> {
        if failpoint && !self.marker_delay.is_zero() {
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
            let lock = self.partition_lock(&partition);
            let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            // Only where the producer's transaction is open: re-running a job (recovery, a
            // retry) does not write a second marker.
            let open = partition
                .producer_state(job.producer_id)
                .is_some_and(|e| e.txn_first_offset.is_some());
            if !open {
                continue;
            }
            let marker_error = |e: AppendError| TxnError::Marker {
                topic: topic.clone(),
                partition: *index,
                reason: e.to_string(),
            };
            let pending = partition
                .append_marker_unsynced(
                    job.producer_id,
                    job.producer_epoch,
                    job.kind.is_commit(),
                    job.coordinator_epoch,
                    now_ms(),
                )
                .map_err(marker_error)?;
            // The marker is ordered: a batch appended after it lands after it. Its fsync runs
            // without the lock, so Produce requests to the partition go on meanwhile; the
            // transaction is recorded complete only after every marker is durable.
            drop(guard);
            partition.finish(pending).map_err(marker_error)?;
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
                        .complete_txn(group, job.producer_id, job.kind.is_commit())
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
        if self.coordinator().complete(job, now_ms())?.is_some() {
            metrics::counter!(metrics::COMPLETED, "result" => job.kind.label()).increment(1);
        }
        Ok(())
    }

    /// An operator's abort of a (hanging) transaction through WriteTxnMarkers, for
    /// `partitions`; returns one error code per partition (0 = no open transaction of the
    /// producer is left there).
    ///
    /// A transaction this coordinator still runs (Ongoing at `epoch`) is aborted as a
    /// timeout would: the producer is fenced (epoch bump) and ABORT markers go to every
    /// partition of the transaction, not only those named, so it stays atomic. A partition
    /// whose open transaction the coordinator does not know (it is hanging: a lost or
    /// repaired transaction log) gets an ABORT marker with the given epoch and coordinator
    /// epoch directly, as Kafka's `Admin.abortTransaction` does; an older epoch than the
    /// partition's is refused with INVALID_PRODUCER_EPOCH. A partition of a transaction the
    /// coordinator still owns at another epoch is refused the same way (its own markers
    /// would otherwise be fenced by the operator's).
    pub fn abort_by_admin(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
        partitions: &[TopicPartition],
    ) -> Result<Vec<i16>> {
        let job = self
            .coordinator()
            .abort_by_admin(producer_id, epoch, now_ms())?;
        if let Some(job) = &job {
            if let Err(e) = self.run_job(job) {
                tracing::warn!(transactional_id = %job.transactional_id, error = %e,
                    "writing markers of an operator's abort failed; the background task retries");
            }
        }
        let notifier = self
            .hooks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .notifier
            .clone();
        let mut codes = Vec::with_capacity(partitions.len());
        for (topic, index) in partitions {
            let Some(partition) = self.store.partition(topic, *index) else {
                codes.push(ResponseError::UnknownTopicOrPartition.code());
                continue;
            };
            let lock = self.partition_lock(&partition);
            let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            let open = partition
                .producer_state(producer_id)
                .is_some_and(|e| e.txn_first_offset.is_some());
            if !open {
                codes.push(0);
                continue;
            }
            let claimed = self
                .coordinator()
                .claims_partition(producer_id, topic, *index);
            if let Some(state) = claimed {
                // Ending already (its markers are owed: retry later), or running at another
                // epoch than the operator named.
                let code = if state.is_preparing() {
                    ResponseError::ConcurrentTransactions
                } else {
                    ResponseError::InvalidProducerEpoch
                };
                tracing::info!(%topic, partition = index, producer_id, epoch, state = state.name(),
                    "operator abort refused: the coordinator owns this transaction");
                codes.push(code.code());
                continue;
            }
            let written =
                partition.append_marker(producer_id, epoch, false, coordinator_epoch, now_ms());
            drop(guard);
            codes.push(match written {
                Ok(_) => {
                    tracing::info!(%topic, partition = index, producer_id, epoch,
                        "operator aborted a hanging transaction");
                    metrics::counter!(metrics::ABORTS, "cause" => "admin").increment(1);
                    if let Some(n) = &notifier {
                        n(topic, *index);
                    }
                    0
                }
                Err(AppendError::InvalidProducerEpoch { .. }) => {
                    ResponseError::InvalidProducerEpoch.code()
                }
                Err(e) => {
                    tracing::error!(%topic, partition = index, error = %e,
                        "writing an operator's abort marker failed");
                    ResponseError::KafkaStorageError.code()
                }
            });
        }
        Ok(codes)
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

    /// Publishes the LSO lag (high watermark - last stable offset) of every partition.
    pub fn record_lso_lag(&self) {
        for (topic, count) in self.store.topics() {
            for index in 0..count {
                if let Some(p) = self.store.partition(&topic, index) {
                    let lag = (p.high_watermark() - p.last_stable_offset()).max(0);
                    metrics::gauge!(metrics::LSO_LAG, "topic" => topic.clone(),
                        "partition" => index.to_string())
                    .set(lag as f64);
                }
            }
        }
    }

    /// Runs [`TxnManager::tick`] every `period` and publishes the LSO lag every 10 ticks,
    /// until the returned task is aborted.
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
                    if n.is_multiple_of(10) {
                        m.record_lso_lag();
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

fn code_label(code: ResponseError) -> &'static str {
    match code {
        ResponseError::InvalidProducerEpoch => "invalid_producer_epoch",
        ResponseError::InvalidTxnState => "invalid_txn_state",
        ResponseError::InvalidProducerIdMapping => "invalid_producer_id_mapping",
        ResponseError::TransactionalIdAuthorizationFailed => {
            "transactional_id_authorization_failed"
        }
        _ => "other",
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
