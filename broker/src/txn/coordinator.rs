//! The transaction coordinator's state machine over all transactional ids: InitProducerId
//! (with fencing and KIP-360 epoch-bump recovery), AddPartitionsToTxn, AddOffsetsToTxn,
//! EndTxn, the Produce-side membership check, timeouts and id expiration.
//!
//! It is sans-I/O apart from its [`TxnLog`]: every transition is appended (and fsynced) to the
//! log before the method returns, so the caller may answer the client; CompleteCommit and
//! CompleteAbort are appended without an fsync of their own (a crash that loses one leaves
//! the transaction prepared, and the restart completes it again). Marker writing is left
//! to the caller: transitions to PrepareCommit/PrepareAbort hand back a [`MarkerJob`], and
//! [`Coordinator::complete`] records CompleteCommit/CompleteAbort once the markers are down.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kafka_protocol::ResponseError;

use super::error::{Result, TxnError};
use super::log::{LogImage, LogRecord, TxnLog};
use super::marker::MarkerKind;
use super::metrics;
use super::produce_view::ProduceView;
use super::state::{TopicPartition, TxnMetadata, TxnState};

/// Coordinator limits (broker flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Largest transaction.timeout.ms a client may ask for (`--max-transaction-timeout-ms`).
    pub max_transaction_timeout_ms: i32,
    /// Idle transactional ids are forgotten after this long
    /// (`--transactional-id-expiration-ms`).
    pub transactional_id_expiration_ms: i64,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            max_transaction_timeout_ms: 900_000,
            transactional_id_expiration_ms: 604_800_000,
        }
    }
}

/// Why a transaction is being aborted (the `cause` label of the aborts metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortCause {
    /// The producer asked for it (EndTxn abort).
    Client,
    /// It stayed open past its timeout.
    Timeout,
    /// A new producer with the same transactional id fenced it.
    Fencing,
    /// Found in PrepareAbort after a restart.
    Recovery,
    /// An operator aborted it (WriteTxnMarkers from an admin client).
    Admin,
}

impl AbortCause {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            AbortCause::Client => "client",
            AbortCause::Timeout => "timeout",
            AbortCause::Fencing => "fencing",
            AbortCause::Recovery => "recovery",
            AbortCause::Admin => "admin",
        }
    }
}

/// Markers the caller must write to finish a prepared transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerJob {
    /// The transactional id.
    pub transactional_id: String,
    /// Producer id written in the markers.
    pub producer_id: i64,
    /// Producer epoch written in the markers.
    pub producer_epoch: i16,
    /// Coordinator epoch written in the markers' values.
    pub coordinator_epoch: i32,
    /// Commit or abort.
    pub kind: MarkerKind,
    /// Every partition of the transaction.
    pub partitions: Vec<TopicPartition>,
    /// Every group whose transactional offsets must be applied or dropped.
    pub groups: Vec<String>,
}

/// The outcome of a request: the client's answer plus, possibly, markers to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<T> {
    /// What to answer the client.
    pub answer: std::result::Result<T, ResponseError>,
    /// Markers the caller must now write (then call [`Coordinator::complete`]).
    pub job: Option<MarkerJob>,
}

impl<T> Step<T> {
    fn answer(answer: std::result::Result<T, ResponseError>) -> Self {
        Step { answer, job: None }
    }
}

/// Where producer ids come from: the broker's durable allocator, shared with idempotent
/// producers so ids never collide and are never reused after a restart.
pub trait ProducerIdSource: Send + Sync {
    /// The next unused producer id.
    fn next_producer_id(&self) -> std::result::Result<i64, String>;
}

/// A counter for in-memory use and tests.
#[derive(Debug, Default)]
pub struct CountingProducerIds(std::sync::atomic::AtomicI64);

impl ProducerIdSource for CountingProducerIds {
    fn next_producer_id(&self) -> std::result::Result<i64, String> {
        Ok(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// All transactional ids and the transaction log behind them.
pub struct Coordinator {
    config: CoordinatorConfig,
    log: TxnLog,
    txns: HashMap<String, TxnMetadata>,
    by_pid: HashMap<i64, String>,
    /// What Produce requests check against, published after each durable change.
    view: Arc<ProduceView>,
    pids: Arc<dyn ProducerIdSource>,
    coordinator_epoch: i32,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("txns", &self.txns.len())
            .field("coordinator_epoch", &self.coordinator_epoch)
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    /// Builds the coordinator from a replayed log image; the coordinator epoch is advanced
    /// and persisted. Transactions found in PrepareCommit/PrepareAbort are returned by
    /// [`Coordinator::pending_jobs`].
    pub fn open(
        config: CoordinatorConfig,
        mut log: TxnLog,
        image: LogImage,
        pids: Arc<dyn ProducerIdSource>,
    ) -> Result<Self> {
        let coordinator_epoch = image.coordinator_epoch.saturating_add(1).max(0);
        log.append(&LogRecord::CoordinatorEpoch(coordinator_epoch))?;
        let by_pid = image
            .txns
            .values()
            .map(|m| (m.producer_id, m.transactional_id.clone()))
            .collect();
        let view = Arc::new(ProduceView::of(image.txns.values()));
        let c = Coordinator {
            config,
            log,
            txns: image.txns,
            by_pid,
            view,
            pids,
            coordinator_epoch,
        };
        c.publish_gauge();
        Ok(c)
    }

    /// The coordinator epoch of this run (written into markers).
    pub fn coordinator_epoch(&self) -> i32 {
        self.coordinator_epoch
    }

    /// The limits in force.
    pub fn config(&self) -> CoordinatorConfig {
        self.config
    }

    /// The metadata of a transactional id, if known.
    pub fn get(&self, transactional_id: &str) -> Option<&TxnMetadata> {
        self.txns.get(transactional_id)
    }

    /// Every known transactional id's metadata, in no particular order.
    pub fn all(&self) -> impl Iterator<Item = &TxnMetadata> {
        self.txns.values()
    }

    /// The transactional id that owns `producer_id`, if any.
    pub fn transactional_id_of(&self, producer_id: i64) -> Option<&str> {
        self.by_pid.get(&producer_id).map(String::as_str)
    }

    /// Transactions currently open or completing.
    pub fn open_transactions(&self) -> usize {
        self.txns
            .values()
            .filter(|m| m.state == TxnState::Ongoing || m.state.is_preparing())
            .count()
    }

    fn publish_gauge(&self) {
        metrics::gauge!(metrics::OPEN_TRANSACTIONS).set(self.open_transactions() as f64);
    }

    /// Hands out a fresh producer id from the broker's allocator.
    pub fn allocate_producer_id(&mut self) -> Result<i64> {
        self.pids.next_producer_id().map_err(TxnError::ProducerIds)
    }

    /// The view the Produce path checks transactional batches against (see
    /// [`ProduceView`]).
    pub fn produce_view(&self) -> Arc<ProduceView> {
        Arc::clone(&self.view)
    }

    fn persist(&mut self, m: TxnMetadata) -> Result<()> {
        self.log.append(&LogRecord::Upsert(m.clone()))?;
        self.apply(m);
        Ok(())
    }

    /// [`Coordinator::persist`] of a record the restart can do without
    /// ([`TxnLog::append_unsynced`]): one fsync less per transaction, held under the lock
    /// every transactional request takes.
    fn persist_unsynced(&mut self, m: TxnMetadata) -> Result<()> {
        self.log.append_unsynced(&LogRecord::Upsert(m.clone()))?;
        self.apply(m);
        Ok(())
    }

    fn apply(&mut self, m: TxnMetadata) {
        self.by_pid
            .insert(m.producer_id, m.transactional_id.clone());
        let replaced = (m.last_producer_id >= 0 && m.last_producer_id != m.producer_id)
            .then_some(m.last_producer_id);
        if let Some(old) = replaced {
            self.by_pid.remove(&old);
        }
        self.view.publish(&m, replaced);
        self.txns.insert(m.transactional_id.clone(), m);
        self.publish_gauge();
    }

    fn job(&self, m: &TxnMetadata, kind: MarkerKind) -> MarkerJob {
        MarkerJob {
            transactional_id: m.transactional_id.clone(),
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            coordinator_epoch: self.coordinator_epoch,
            kind,
            partitions: m.partitions.iter().cloned().collect(),
            groups: m.groups.iter().cloned().collect(),
        }
    }

    /// Moves an open transaction to PrepareAbort (bumping the epoch first when `fence`),
    /// persists it and returns the markers to write.
    fn prepare_abort(
        &mut self,
        mut m: TxnMetadata,
        fence: bool,
        cause: AbortCause,
        now_ms: i64,
    ) -> Result<MarkerJob> {
        if fence {
            m.state = TxnState::PrepareEpochFence;
            m.producer_epoch = m.producer_epoch.saturating_add(1);
        }
        debug_assert!(m.state.can_transition_to(TxnState::PrepareAbort));
        m.state = TxnState::PrepareAbort;
        m.last_update_ms = now_ms;
        let job = self.job(&m, MarkerKind::Abort);
        tracing::info!(transactional_id = %m.transactional_id, producer_id = m.producer_id,
            epoch = m.producer_epoch, cause = cause.label(), "aborting transaction");
        metrics::counter!(metrics::ABORTS, "cause" => cause.label()).increment(1);
        self.persist(m)?;
        Ok(job)
    }

    /// InitProducerId for a transactional id. `expected` is the (producer id, epoch) a v3+
    /// client sends to recover by epoch bump (KIP-360), `None` for -1/-1.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        now_ms: i64,
    ) -> Result<Step<(i64, i16)>> {
        if timeout_ms <= 0 || timeout_ms > self.config.max_transaction_timeout_ms {
            return Ok(Step::answer(Err(ResponseError::InvalidTransactionTimeout)));
        }
        let Some(current) = self.txns.get(transactional_id).cloned() else {
            if expected.is_some() {
                return Ok(Step::answer(Err(ResponseError::InvalidProducerIdMapping)));
            }
            let pid = self.allocate_producer_id()?;
            let m = TxnMetadata::new(transactional_id, pid, timeout_ms, now_ms);
            self.persist(m)?;
            return Ok(Step::answer(Ok((pid, 0))));
        };
        let mut m = current;
        if m.state.is_preparing() {
            return Ok(Step::answer(Err(ResponseError::ConcurrentTransactions)));
        }
        if let Some((pid, epoch)) = expected {
            let is_current = pid == m.producer_id && epoch == m.producer_epoch;
            let is_retry = (pid == m.last_producer_id || pid == m.producer_id)
                && epoch == m.last_producer_epoch
                && m.state != TxnState::Ongoing;
            if is_retry && !is_current {
                return Ok(Step::answer(Ok((m.producer_id, m.producer_epoch))));
            }
            if !is_current {
                return Ok(Step::answer(Err(ResponseError::ProducerFenced)));
            }
        }
        if m.state == TxnState::Ongoing {
            // Fence the old producer and abort its transaction; the client retries.
            let job = self.prepare_abort(m, true, AbortCause::Fencing, now_ms)?;
            return Ok(Step {
                answer: Err(ResponseError::ConcurrentTransactions),
                job: Some(job),
            });
        }
        m.last_producer_id = m.producer_id;
        m.last_producer_epoch = m.producer_epoch;
        if m.producer_epoch >= i16::MAX - 1 {
            // Epoch exhausted: a fresh producer id starts again at epoch 0.
            m.producer_id = self.allocate_producer_id()?;
            m.producer_epoch = 0;
        } else {
            m.producer_epoch += 1;
        }
        m.timeout_ms = timeout_ms;
        m.state = TxnState::Empty;
        m.partitions = BTreeSet::new();
        m.groups = BTreeSet::new();
        m.txn_start_ms = -1;
        m.last_update_ms = now_ms;
        let answer = (m.producer_id, m.producer_epoch);
        self.persist(m)?;
        Ok(Step::answer(Ok(answer)))
    }

    /// Validates the producer of a transactional request against the current metadata.
    fn check_producer(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
    ) -> std::result::Result<TxnMetadata, ResponseError> {
        let m = self
            .txns
            .get(transactional_id)
            .filter(|m| m.producer_id == producer_id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if epoch != m.producer_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(m.clone())
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn: opens the transaction if needed and adds the
    /// partitions and groups to it.
    pub fn add_to_txn(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
        groups: &[String],
        now_ms: i64,
    ) -> Result<std::result::Result<(), ResponseError>> {
        let mut m = match self.check_producer(transactional_id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e)),
        };
        if m.state.is_preparing() {
            return Ok(Err(ResponseError::ConcurrentTransactions));
        }
        if m.state == TxnState::Dead {
            return Ok(Err(ResponseError::InvalidProducerIdMapping));
        }
        let already = m.state == TxnState::Ongoing
            && partitions.iter().all(|tp| m.partitions.contains(tp))
            && groups.iter().all(|g| m.groups.contains(g));
        if already {
            return Ok(Ok(()));
        }
        if m.state != TxnState::Ongoing {
            m.txn_start_ms = now_ms;
            m.partitions.clear();
            m.groups.clear();
        }
        m.state = TxnState::Ongoing;
        m.partitions.extend(partitions.iter().cloned());
        m.groups.extend(groups.iter().cloned());
        m.last_update_ms = now_ms;
        self.persist(m)?;
        Ok(Ok(()))
    }

    /// EndTxn: moves an open transaction to PrepareCommit/PrepareAbort (persisted) and hands
    /// back the markers to write. A retry after completion answers success.
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        now_ms: i64,
    ) -> Result<Step<()>> {
        let m = match self.check_producer(transactional_id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return Ok(Step::answer(Err(e))),
        };
        let answer = match (m.state, commit) {
            (TxnState::Ongoing, true) => {
                let mut m = m;
                m.state = TxnState::PrepareCommit;
                m.last_update_ms = now_ms;
                let job = self.job(&m, MarkerKind::Commit);
                self.persist(m)?;
                return Ok(Step {
                    answer: Ok(()),
                    job: Some(job),
                });
            }
            (TxnState::Ongoing, false) => {
                let job = self.prepare_abort(m, false, AbortCause::Client, now_ms)?;
                return Ok(Step {
                    answer: Ok(()),
                    job: Some(job),
                });
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(()),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Err(ResponseError::ConcurrentTransactions)
            }
            (TxnState::PrepareEpochFence, _) => Err(ResponseError::ConcurrentTransactions),
            _ => Err(ResponseError::InvalidTxnState),
        };
        Ok(Step::answer(answer))
    }

    /// An operator's abort of `producer_id`'s transaction (WriteTxnMarkers with an ABORT
    /// result): if this coordinator owns the producer id at `epoch` with an Ongoing
    /// transaction, it is fenced (epoch bump) and moved to PrepareAbort, as a timeout would,
    /// and the markers for all its partitions are returned. `None` if there is nothing of
    /// this coordinator's to abort (the transaction is unknown here, already ending, or of
    /// another epoch).
    pub fn abort_by_admin(
        &mut self,
        producer_id: i64,
        epoch: i16,
        now_ms: i64,
    ) -> Result<Option<MarkerJob>> {
        let Some(m) = self
            .by_pid
            .get(&producer_id)
            .and_then(|id| self.txns.get(id))
            .filter(|m| {
                m.producer_id == producer_id
                    && m.producer_epoch == epoch
                    && m.state == TxnState::Ongoing
            })
            .cloned()
        else {
            return Ok(None);
        };
        self.prepare_abort(m, true, AbortCause::Admin, now_ms)
            .map(Some)
    }

    /// The state of `producer_id`'s transaction if it is open or ending here and includes
    /// `partition` (then only the coordinator may write its markers), else `None`.
    pub fn claims_partition(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Option<TxnState> {
        self.by_pid
            .get(&producer_id)
            .and_then(|id| self.txns.get(id))
            .filter(|m| {
                m.producer_id == producer_id
                    && (m.state == TxnState::Ongoing || m.state.is_preparing())
                    && m.partitions.contains(&(topic.to_string(), partition))
            })
            .map(|m| m.state)
    }

    /// Records that every marker of `job` is written: PrepareX -> CompleteX. Returns the
    /// transaction's duration in ms, or `None` if the state moved on meanwhile.
    pub fn complete(&mut self, job: &MarkerJob, now_ms: i64) -> Result<Option<i64>> {
        let Some(m) = self.txns.get(&job.transactional_id).cloned() else {
            return Ok(None);
        };
        let (from, to) = match job.kind {
            MarkerKind::Commit => (TxnState::PrepareCommit, TxnState::CompleteCommit),
            MarkerKind::Abort => (TxnState::PrepareAbort, TxnState::CompleteAbort),
        };
        if m.state != from
            || m.producer_id != job.producer_id
            || m.producer_epoch != job.producer_epoch
        {
            return Ok(None);
        }
        let mut m = m;
        let duration = (m.txn_start_ms >= 0).then(|| now_ms - m.txn_start_ms);
        m.state = to;
        m.partitions.clear();
        m.groups.clear();
        m.txn_start_ms = -1;
        m.last_update_ms = now_ms;
        // Prepare* is durable and the markers are: a crash that loses this record leaves
        // the transaction prepared, and the restart completes it again
        self.persist_unsynced(m)?;
        if let Some(d) = duration {
            metrics::histogram!(metrics::TXN_DURATION, "result" => match job.kind {
                MarkerKind::Commit => "commit",
                MarkerKind::Abort => "abort",
            })
            .record(d as f64 / 1000.0);
        }
        Ok(duration)
    }

    /// Markers still owed: transactions in PrepareCommit/PrepareAbort (after a restart, or
    /// after a marker write failed).
    pub fn pending_jobs(&self) -> Vec<MarkerJob> {
        let mut ids: Vec<&TxnMetadata> = self
            .txns
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .collect();
        ids.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        ids.into_iter()
            .map(|m| {
                let kind = if m.state == TxnState::PrepareCommit {
                    MarkerKind::Commit
                } else {
                    MarkerKind::Abort
                };
                self.job(m, kind)
            })
            .collect()
    }

    /// Produce-side check of a transactional batch: the producer id must be
    /// `transactional_id`'s, hold the current epoch and have added the partition to its open
    /// transaction ([`ProduceView::check`], which the Produce path calls without this
    /// coordinator's lock).
    pub fn check_produce(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> std::result::Result<(), ResponseError> {
        self.view
            .check(transactional_id, producer_id, epoch, topic, partition)
    }

    /// TxnOffsetCommit check: the producer holds the current epoch and added `group` with
    /// AddOffsetsToTxn to its open transaction.
    pub fn check_offsets(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
    ) -> std::result::Result<(), ResponseError> {
        let m = self.check_producer(transactional_id, producer_id, epoch)?;
        if m.state.is_preparing() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if m.state != TxnState::Ongoing || !m.groups.contains(group) {
            return Err(ResponseError::InvalidTxnState);
        }
        Ok(())
    }

    /// Aborts transactions open past their timeout (bumping the epoch so the late producer
    /// is fenced) and forgets transactional ids idle past the expiration. Returns the
    /// markers to write.
    pub fn expire(&mut self, now_ms: i64) -> Result<Vec<MarkerJob>> {
        let mut timed_out: Vec<TxnMetadata> = self
            .txns
            .values()
            .filter(|m| {
                m.state == TxnState::Ongoing
                    && m.txn_start_ms >= 0
                    && now_ms > m.txn_start_ms.saturating_add(i64::from(m.timeout_ms))
            })
            .cloned()
            .collect();
        timed_out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        let mut jobs = Vec::new();
        for m in timed_out {
            jobs.push(self.prepare_abort(m, true, AbortCause::Timeout, now_ms)?);
        }
        let expired: Vec<String> = self
            .txns
            .values()
            .filter(|m| {
                matches!(
                    m.state,
                    TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                ) && now_ms.saturating_sub(m.last_update_ms)
                    > self.config.transactional_id_expiration_ms
            })
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in expired {
            self.log.append(&LogRecord::Remove(id.clone()))?;
            if let Some(m) = self.txns.remove(&id) {
                self.by_pid.remove(&m.producer_id);
                self.view.remove(m.producer_id);
                tracing::info!(transactional_id = %id, "transactional id expired (Dead)");
            }
        }
        if self.log.records_since_compaction() > 100_000 {
            self.compact()?;
        }
        Ok(jobs)
    }

    /// Rewrites the log holding only live state.
    pub fn compact(&mut self) -> Result<()> {
        let image = LogImage {
            txns: self.txns.clone(),
            coordinator_epoch: self.coordinator_epoch,
        };
        self.log.rewrite(&image)
    }
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;
