//! Two-phase commit: one transaction per sink subtask per checkpoint on a ring of
//! transactional ids `{prefix}-{subtask}-{slot}`.
//!
//! pre_commit(n) seals the open transaction and begins the next one on a free slot at once;
//! the sealed transaction's delivery reports drain on a blocking thread meanwhile
//! (`PreCommit::Flushing`), and the runtime acknowledges checkpoint n only after the drain
//! ended and finish_pre_commit(n) recorded (transactional id, producer id, epoch). The
//! records of n+1 that arrive during the drain are held back in memory (up to
//! `HOLD_LIMIT`; a write beyond waits) and handed to the next producer only once the drain
//! ended: two producers sending to one partition at once could put n+1's records in the log
//! before n's, and a key's output would go out of order. So the pipeline upstream keeps
//! running through the drain, and the log keeps the order of the input. A failed drain fails
//! the job (n+1's records are already elsewhere, so n cannot be pre-committed again); its
//! transaction is aborted by the restart's fencing. commit(n) commits on the live producer.
//! A slot whose transaction was committed at completion k is reused (same epoch) only after
//! a later checkpoint completed: until then the latest complete checkpoint may still name
//! that transaction, and a recovery EndTxn with the same epoch would commit the slot's new
//! open transaction. Hence at least 3 slots (open, pre-committed, committed-but-named); the
//! ring grows when checkpoints fail and the size is recorded in every pending.
//! recover(pending) commits the restored checkpoint's transactions with the raw committer
//! (aborted or fenced = data loss, the job fails naming the checkpoint), then fences every
//! other id of the previous and current ring with init_transactions (all at once, each on
//! its own blocking thread).
//!
//! commit(n) overlaps with the writes of n+1: when the open transaction already holds
//! records, the commit runs on a blocking thread and commit(n) returns at once; the sink
//! reports n committed (`on_commit`) only once that commit succeeded. The runtime drops n
//! from its pending commits when commit(n) returns, so pre_commit(n+1) first waits for every
//! commit in flight: no later checkpoint can complete while n's transaction is uncommitted.
//! A commit in flight that failed goes back to `Sealed` and is tried again on the spot (and
//! at every later pre-commit, like any failed commit), and the pre-commit fails with its
//! error; a fenced or aborted transaction fails the job, whose recovery then commits n from
//! the checkpoint that names it. When the open transaction is empty (the end of the input,
//! an idle stream) commit(n) commits before it returns, so a job's last commit is done when
//! the sink finishes.
//!
//! The ring's producers are made ahead of use: once a subtask recovered, every fresh slot
//! but the first gets its producer (create + init_transactions + the statistics that name
//! its producer id and epoch, about 100-200 ms each) on a blocking thread in the background,
//! so no pre-commit waits for one. Slots that recovery committed stay untouched (see above)
//! and get their producer when first reused.

use std::time::{Duration, Instant};

use futures::FutureExt;
use onceflow_runtime::{CheckpointId, PreCommit, SubtaskInfo};
use rdkafka::producer::Producer;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::super::committer::{self, CommitOutcome};
use super::super::config::KafkaSinkConfig;
use super::super::security::ClientSecurity;
use super::super::{metrics as m, KafkaError};
use super::producer::{self, blocking, Ctx, Prod};
use super::{KafkaPending, KafkaSink, SinkRecord};

const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra slots fenced beyond the recorded ring (growth after the last complete checkpoint).
const FENCE_MARGIN: usize = 2;

/// A pre-committed transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnHandle {
    /// transactional.id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub epoch: i16,
    /// Records in the transaction.
    pub records: u64,
}

/// What checkpoint n stores for one two-phase-commit sink subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwoPhasePending {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Subtask that pre-committed.
    pub subtask: usize,
    /// Sink parallelism of that run.
    pub parallelism: usize,
    /// Ring size of that subtask at pre-commit.
    pub ring_slots: usize,
    /// The transaction, `None` if nothing was written since the previous checkpoint.
    pub txn: Option<TxnHandle>,
}

enum SlotState {
    /// Never used by this run.
    Fresh,
    /// Holds the open transaction.
    Open { since: Instant, records: u64 },
    /// Sealed at this checkpoint; its delivery reports drain on a blocking thread while the
    /// next transaction is written.
    Flushing {
        checkpoint: CheckpointId,
        since: Instant,
        records: u64,
        drain: Drain,
    },
    /// Pre-committed at this checkpoint.
    Sealed {
        checkpoint: CheckpointId,
        handle: TxnHandle,
        since: Instant,
    },
    /// Its commit runs on a blocking thread (see the module documentation).
    Committing,
    /// Committed when checkpoint `at` completed (reusable after a later completion).
    Committed { at: CheckpointId },
    /// Aborted (reusable).
    Aborted,
}

/// A commit running on a blocking thread while the next transaction is written.
struct InFlight {
    checkpoint: CheckpointId,
    slot: usize,
    /// What the slot held while sealed (restored if the commit fails).
    handle: TxnHandle,
    since: Instant,
    /// The latest complete checkpoint when the commit started.
    completed: CheckpointId,
    /// The commit's outcome and how long it took.
    task: tokio::task::JoinHandle<(
        std::result::Result<(), rdkafka::error::KafkaError>,
        Duration,
    )>,
}

/// The drain of a sealed transaction: resolves when every record of it was delivered (or
/// with why not). Shared, so that the runtime can wait for it while the slot keeps it.
type Drain = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), String>>>;

/// A transactional producer with the producer id and epoch init_transactions gave it.
type Made = (Arc<Prod>, Ctx, (i64, i16));

struct Slot {
    id: String,
    producer: Option<Made>,
    /// The producer being made in the background (see the module documentation).
    warming: Option<tokio::task::JoinHandle<super::super::Result<Made>>>,
    state: SlotState,
}

/// One two-phase-commit sink subtask.
pub struct TwoPhaseWriter {
    cfg: KafkaSinkConfig,
    subtask: usize,
    parallelism: usize,
    restored: CheckpointId,
    slots: Vec<Slot>,
    current: Option<usize>,
    completed: CheckpointId,
    fatal: Option<String>,
    recovered_ids: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// Commits in flight, oldest first.
    in_flight: Vec<InFlight>,
    /// Checkpoints whose commit succeeded since the last [`Self::take_confirmed`].
    confirmed: Vec<CheckpointId>,
    /// The drain of the transaction sealed last, until its pre-commit finished.
    draining: Option<Drain>,
    /// Records of the open transaction held back while the previous one drains (see the
    /// module documentation).
    held: Vec<SinkRecord>,
}

/// At most this many records are held back during a drain; a write beyond waits for it.
const HOLD_LIMIT: usize = 20_000;

fn txn_id(prefix: &str, subtask: usize, slot: usize) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

/// Creates the transactional producer of `id` and learns its producer id and epoch.
/// Blocking.
fn make_producer(cfg: &KafkaSinkConfig, id: &str) -> super::super::Result<Made> {
    let (p, ctx) = producer::create(cfg, Some(id), false)?;
    let ids = producer::init_and_learn(&p, &ctx, &cfg.default_topic, TXN_CALL_TIMEOUT)?;
    Ok((p, ctx, ids))
}

impl TwoPhaseWriter {
    pub(crate) fn new(sink: &KafkaSink, info: &SubtaskInfo) -> Self {
        let slots = (0..sink.cfg.ring_slots)
            .map(|s| Slot {
                id: txn_id(&sink.cfg.transactional_id_prefix, info.index, s),
                producer: None,
                warming: None,
                state: SlotState::Fresh,
            })
            .collect();
        metrics::gauge!(m::TXN_TIMEOUT_SECONDS).set(sink.cfg.transaction_timeout.as_secs_f64());
        TwoPhaseWriter {
            cfg: sink.cfg.clone(),
            subtask: info.index,
            parallelism: info.parallelism,
            restored: info.restored_checkpoint,
            slots,
            current: None,
            completed: info.restored_checkpoint,
            fatal: None,
            recovered_ids: sink.recovered_ids.clone(),
            in_flight: Vec::new(),
            confirmed: Vec::new(),
            draining: None,
            held: Vec::new(),
        }
    }

    fn check_fatal(&self) -> onceflow_runtime::Result<()> {
        match &self.fatal {
            Some(f) => Err(KafkaError::Fenced(f.clone()).into()),
            None => Ok(()),
        }
    }

    /// Commits the restored checkpoint's transactions, then fences the previous ring.
    pub(crate) async fn recover(
        &mut self,
        pending: Vec<KafkaPending>,
    ) -> onceflow_runtime::Result<()> {
        if self.subtask == 0 {
            // one set of connection settings for the recovery commits and the fencing
            let security = ClientSecurity::from_properties(
                &self.cfg.client_properties,
                "two-phase-commit recovery",
            )?;
            let mut old_parallelism = 0;
            let mut old_ring = 0;
            let mut committed = std::collections::HashSet::new();
            for p in &pending {
                let KafkaPending::TwoPhase(p) = p else {
                    return Err(KafkaError::Config(format!(
                        "the restored checkpoint {} was written by a Kafka sink in another delivery mode; start with a fresh checkpoint directory to change modes",
                        self.restored
                    ))
                    .into());
                };
                old_parallelism = old_parallelism.max(p.parallelism);
                old_ring = old_ring.max(p.ring_slots);
                let Some(t) = &p.txn else { continue };
                let t0 = Instant::now();
                let outcome = committer::commit_prepared(
                    &self.cfg.brokers,
                    &security,
                    &t.transactional_id,
                    t.producer_id,
                    t.epoch,
                    self.cfg.recovery_allowance.max(Duration::from_secs(10)),
                )
                .await?;
                match outcome {
                    CommitOutcome::Committed => {
                        metrics::counter!(m::RECOVERY_COMMITS).increment(1);
                        metrics::histogram!(m::TXN_COMMIT_SECONDS, "mode" => "recovery")
                            .record(t0.elapsed().as_secs_f64());
                        tracing::info!(checkpoint = p.checkpoint, restored = self.restored, transactional_id = %t.transactional_id, producer_id = t.producer_id, epoch = t.epoch, records = t.records, "recovery committed a pre-committed transaction");
                        committed.insert(t.transactional_id.clone());
                    }
                    CommitOutcome::Lost(code) => {
                        let why = match code {
                            committer::codes::INVALID_TXN_STATE => "it was aborted",
                            committer::codes::PRODUCER_FENCED | committer::codes::INVALID_PRODUCER_EPOCH => {
                                "its epoch was bumped (transaction timeout or another producer with this id)"
                            }
                            committer::codes::INVALID_PRODUCER_ID_MAPPING => "the broker no longer knows its producer id (expired)",
                            _ => "the broker refused the commit",
                        };
                        return Err(KafkaError::DataLoss(format!(
                            "transaction {} (producer id {}, epoch {}, {} records) of complete checkpoint {} (restored checkpoint {}) cannot be committed: {why} (Kafka error code {code}); its output is lost. Raise transaction.timeout.ms or restart faster",
                            t.transactional_id, t.producer_id, t.epoch, t.records, p.checkpoint, self.restored
                        ))
                        .into());
                    }
                }
            }
            // fence every other id of the previous ring and of the current one
            let mut ids = std::collections::BTreeSet::new();
            let prev_ring = if old_ring == 0 {
                self.cfg.ring_slots
            } else {
                old_ring
            };
            let prev_par = if old_parallelism == 0 {
                self.parallelism
            } else {
                old_parallelism
            };
            for s in 0..prev_par {
                for slot in 0..prev_ring + FENCE_MARGIN {
                    ids.insert(txn_id(&self.cfg.transactional_id_prefix, s, slot));
                }
            }
            for s in 0..self.parallelism {
                for slot in 0..self.cfg.ring_slots {
                    ids.insert(txn_id(&self.cfg.transactional_id_prefix, s, slot));
                }
            }
            let t0 = Instant::now();
            let (security, cfg) = (&security, &self.cfg);
            let fences = ids
                .into_iter()
                .filter(|i| !committed.contains(i))
                .map(|id| async move {
                    committer::fence(
                        &cfg.brokers,
                        security,
                        &id,
                        cfg.transaction_timeout,
                        TXN_CALL_TIMEOUT,
                    )
                    .await?;
                    metrics::counter!(m::FENCING_EVENTS, "kind" => "recovery").increment(1);
                    tracing::debug!(transactional_id = %id, "fenced and aborted");
                    Ok::<(), onceflow_runtime::Error>(())
                });
            let fenced = futures::future::try_join_all(fences).await?.len();
            tracing::info!(
                fenced,
                elapsed_ms = t0.elapsed().as_millis() as u64,
                "fenced the previous transactional id ring"
            );
            *self.recovered_ids.lock() = committed;
        }
        // slots committed by recovery stay untouched until a checkpoint of this run completes
        let avoid = self.recovered_ids.lock().clone();
        for s in &mut self.slots {
            if avoid.contains(&s.id) {
                s.state = SlotState::Committed { at: self.restored };
            }
        }
        let next = self.free_slot();
        // the other slots' producers are made while the first one is
        self.warm_up(next);
        self.open(next).await
    }

    /// Starts making the producer of every fresh slot but `except` (see the module
    /// documentation).
    fn warm_up(&mut self, except: usize) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if i == except
                || slot.producer.is_some()
                || slot.warming.is_some()
                || !matches!(slot.state, SlotState::Fresh)
            {
                continue;
            }
            let cfg = self.cfg.clone();
            let id = slot.id.clone();
            slot.warming = Some(tokio::task::spawn_blocking(move || {
                make_producer(&cfg, &id)
            }));
        }
    }

    /// A slot to open the next transaction on (grows the ring if none is free).
    fn free_slot(&mut self) -> usize {
        for (i, s) in self.slots.iter().enumerate() {
            match s.state {
                SlotState::Fresh | SlotState::Aborted => return i,
                SlotState::Committed { at } if at < self.completed => return i,
                _ => {}
            }
        }
        let i = self.slots.len();
        tracing::warn!(subtask = self.subtask, slots = i + 1, "no free transactional id (failed checkpoints keep transactions pending): growing the ring");
        self.slots.push(Slot {
            id: txn_id(&self.cfg.transactional_id_prefix, self.subtask, i),
            producer: None,
            warming: None,
            state: SlotState::Fresh,
        });
        i
    }

    async fn open(&mut self, i: usize) -> onceflow_runtime::Result<()> {
        let slot = &mut self.slots[i];
        if slot.producer.is_none() {
            let t0 = Instant::now();
            let warmed = match slot.warming.take() {
                Some(h) => match h.await {
                    Ok(Ok(made)) => Some(made),
                    Ok(Err(e)) => {
                        tracing::warn!(transactional_id = %slot.id, error = %e, "making the producer ahead of use failed; trying again now");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(transactional_id = %slot.id, error = %e, "making the producer ahead of use panicked; trying again now");
                        None
                    }
                },
                None => None,
            };
            let ahead = warmed.is_some();
            let made = match warmed {
                Some(made) => made,
                None => {
                    let cfg = self.cfg.clone();
                    let id = slot.id.clone();
                    blocking(move || make_producer(&cfg, &id)).await??
                }
            };
            // time the transaction's start waited for its producer (near zero when it was
            // made ahead of use)
            metrics::histogram!(m::TXN_PRODUCER_WAIT_SECONDS).record(t0.elapsed().as_secs_f64());
            tracing::debug!(transactional_id = %slot.id, producer_id = made.2 .0, epoch = made.2 .1, ahead, waited_ms = t0.elapsed().as_millis() as u64, "transactional producer ready");
            slot.producer = Some(made);
        }
        let Some((p, _, _)) = &slot.producer else {
            return Err(onceflow_runtime::Error::Internal(
                "slot without producer".into(),
            ));
        };
        p.begin_transaction()
            .map_err(|e| KafkaError::client(format!("begin_transaction on {}", slot.id), e))?;
        slot.state = SlotState::Open {
            since: Instant::now(),
            records: 0,
        };
        self.current = Some(i);
        Ok(())
    }

    pub(crate) async fn write_batch(
        &mut self,
        records: Vec<SinkRecord>,
    ) -> onceflow_runtime::Result<()> {
        self.check_fatal()?;
        if let Some(drain) = &self.draining {
            if drain.peek().is_none() {
                if self.held.len() + records.len() <= HOLD_LIMIT {
                    self.held.extend(records);
                    return Ok(());
                }
                let drain = drain.clone();
                let t0 = Instant::now();
                let _ = drain.await;
                tracing::debug!(
                    held = self.held.len(),
                    waited_ms = t0.elapsed().as_millis() as u64,
                    "held-back records reached the limit: waited for the drain"
                );
            }
            // the sealed transaction's records are all delivered (or it failed, and its
            // pre-commit fails the job): the held records may follow them now
            let held = std::mem::take(&mut self.held);
            self.send_open(held)?;
        }
        self.send_open(records)
    }

    /// Hands records to the open transaction's producer.
    fn send_open(&mut self, records: Vec<SinkRecord>) -> onceflow_runtime::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let Some(i) = self.current else {
            return Err(onceflow_runtime::Error::Internal(
                "kafka sink has no open transaction".into(),
            ));
        };
        let slot = &mut self.slots[i];
        let (Some((p, ctx, _)), SlotState::Open { records: n, since }) =
            (&slot.producer, &mut slot.state)
        else {
            return Err(onceflow_runtime::Error::Internal(
                "current slot is not open".into(),
            ));
        };
        for r in &records {
            producer::send(p, &self.cfg.default_topic, r)?;
        }
        *n += records.len() as u64;
        p.poll(Duration::ZERO);
        metrics::counter!(m::RECORDS_PRODUCED, "mode" => "two-phase-commit")
            .increment(records.len() as u64);
        metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => self.subtask.to_string())
            .set(since.elapsed().as_secs_f64());
        if let Some(e) = producer::take_delivery_error(ctx) {
            let msg = format!("delivery failed in transaction {}: {e}", slot.id);
            self.fatal = Some(msg.clone());
            return Err(KafkaError::Protocol(msg).into());
        }
        Ok(())
    }

    /// Pre-commits checkpoint `checkpoint` and waits for it: [`Self::start_pre_commit`],
    /// then [`Self::finish_pre_commit`] once the drain ended.
    pub(crate) async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPending> {
        match self.start_pre_commit(checkpoint).await? {
            PreCommit::Done(p) => p.ok_or_else(|| {
                onceflow_runtime::Error::Internal("two-phase pre-commit without a pending".into())
            }),
            PreCommit::Flushing(done) => {
                done.await;
                self.finish_pre_commit(checkpoint).await
            }
        }
    }

    fn pending(&self, checkpoint: CheckpointId, txn: Option<TxnHandle>) -> KafkaPending {
        KafkaPending::TwoPhase(TwoPhasePending {
            checkpoint,
            subtask: self.subtask,
            parallelism: self.parallelism,
            ring_slots: self.slots.len(),
            txn,
        })
    }

    /// Seals the open transaction for checkpoint `checkpoint`, starts draining its delivery
    /// reports on a blocking thread and opens the next transaction on a free slot, so the
    /// next checkpoint's records are written while the drain runs (see the module
    /// documentation). An empty transaction is not sealed: it stays open for the next one.
    pub(crate) async fn start_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<PreCommit<KafkaPending>> {
        self.check_fatal()?;
        if self.draining.is_some() {
            return Err(onceflow_runtime::Error::Internal(format!(
                "pre-commit {checkpoint} started before the previous one finished"
            )));
        }
        // no checkpoint may complete while an earlier one's transaction is uncommitted
        self.finish_in_flight().await?;
        // retry commits of complete checkpoints that failed before
        self.retry_commits().await?;
        let Some(i) = self.current else {
            return Err(onceflow_runtime::Error::Internal(
                "kafka sink has no open transaction".into(),
            ));
        };
        let (records, since) = match self.slots[i].state {
            SlotState::Open { records, since } => (records, since),
            _ => (0, Instant::now()),
        };
        if records == 0 {
            return Ok(PreCommit::Done(Some(self.pending(checkpoint, None))));
        }
        let slot = &mut self.slots[i];
        let Some((p, _, _)) = slot.producer.clone() else {
            return Err(onceflow_runtime::Error::Internal(
                "open slot without producer".into(),
            ));
        };
        let t0 = Instant::now();
        let drain: Drain = tokio::task::spawn_blocking(move || {
            let r = producer::drain(&p, TXN_CALL_TIMEOUT).map_err(|e| e.to_string());
            metrics::histogram!(m::PRE_COMMIT_DRAIN_SECONDS).record(t0.elapsed().as_secs_f64());
            r
        })
        .map(|joined| joined.unwrap_or_else(|e| Err(format!("the drain thread panicked: {e}"))))
        .boxed()
        .shared();
        slot.state = SlotState::Flushing {
            checkpoint,
            since,
            records,
            drain: drain.clone(),
        };
        self.draining = Some(drain.clone());
        tracing::debug!(checkpoint, transactional_id = %slot.id, records, "sealed; draining while the next transaction opens");
        let next = self.free_slot();
        self.open(next).await?;
        Ok(PreCommit::Flushing(Box::pin(drain.map(|_| ()))))
    }

    /// Ends the pre-commit of checkpoint `checkpoint` after its drain: checks its delivery
    /// reports and records (transactional id, producer id, epoch). A failed drain fails the
    /// job ([`onceflow_runtime::Error::Fatal`]): the next checkpoint's records already go to
    /// another transaction, so this one cannot be pre-committed again; no complete checkpoint
    /// names it, and the restart's recovery aborts it while its input is read again.
    pub(crate) async fn finish_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPending> {
        let Some((i, since, records, drain)) =
            self.slots
                .iter()
                .enumerate()
                .find_map(|(i, s)| match &s.state {
                    SlotState::Flushing {
                        checkpoint: c,
                        since,
                        records,
                        drain,
                    } if *c == checkpoint => Some((i, *since, *records, drain.clone())),
                    _ => None,
                })
        else {
            return Err(onceflow_runtime::Error::Internal(format!(
                "no transaction of checkpoint {checkpoint} is draining"
            )));
        };
        let outcome = drain.await;
        self.draining = None;
        let slot = &mut self.slots[i];
        let Some((_, ctx, ids)) = &slot.producer else {
            return Err(onceflow_runtime::Error::Internal(
                "draining slot without producer".into(),
            ));
        };
        let failure = match outcome {
            Err(e) => Some(format!(
                "draining transaction {} of checkpoint {checkpoint} failed: {e}",
                slot.id
            )),
            Ok(()) => producer::take_delivery_error(ctx)
                .map(|e| format!("delivery failed in transaction {}: {e}", slot.id)),
        };
        if let Some(msg) = failure {
            self.fatal = Some(msg.clone());
            return Err(onceflow_runtime::Error::Fatal(msg));
        }
        // the statistics may have seen an epoch bump since init (KIP-360 recovery)
        let (pid, epoch) = (*ctx.0.eos.lock()).unwrap_or(*ids);
        let handle = TxnHandle {
            transactional_id: slot.id.clone(),
            producer_id: pid,
            epoch,
            records,
        };
        slot.state = SlotState::Sealed {
            checkpoint,
            handle: handle.clone(),
            since,
        };
        tracing::debug!(checkpoint, transactional_id = %handle.transactional_id, producer_id = pid, epoch, records, "pre-committed");
        let held = std::mem::take(&mut self.held);
        self.send_open(held)?;
        Ok(self.pending(checkpoint, Some(handle)))
    }

    async fn retry_commits(&mut self) -> onceflow_runtime::Result<()> {
        let due: Vec<CheckpointId> = self
            .slots
            .iter()
            .filter_map(|s| match s.state {
                SlotState::Sealed { checkpoint, .. } if checkpoint <= self.completed => {
                    Some(checkpoint)
                }
                _ => None,
            })
            .collect();
        for c in due {
            self.commit_live(c).await?;
        }
        Ok(())
    }

    /// Commits the slot sealed at `checkpoint` on its live producer; false if none holds it.
    async fn commit_live(&mut self, checkpoint: CheckpointId) -> onceflow_runtime::Result<bool> {
        let completed = self.completed;
        let Some(slot) = self.slots.iter_mut().find(
            |s| matches!(s.state, SlotState::Sealed { checkpoint: c, .. } if c == checkpoint),
        ) else {
            return Ok(false);
        };
        let (SlotState::Sealed { handle, since, .. }, Some((p, _, _))) =
            (&slot.state, &slot.producer)
        else {
            return Ok(false);
        };
        let records = handle.records;
        let age = since.elapsed();
        let p = p.clone();
        let t0 = Instant::now();
        let r = blocking(move || p.commit_transaction(TXN_CALL_TIMEOUT)).await?;
        match r {
            Ok(()) => {
                metrics::histogram!(m::TXN_COMMIT_SECONDS, "mode" => "two-phase-commit")
                    .record(t0.elapsed().as_secs_f64());
                metrics::histogram!(m::RECORDS_PER_TXN).record(records as f64);
                metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => self.subtask.to_string())
                    .set(age.as_secs_f64());
                slot.state = SlotState::Committed { at: completed };
                self.confirmed.push(checkpoint);
                Ok(true)
            }
            Err(e) => {
                let fenced = producer::is_fenced(&e);
                let msg = format!(
                    "commit of {} (checkpoint {checkpoint}) failed: {e}",
                    slot.id
                );
                if fenced {
                    metrics::counter!(m::FENCING_EVENTS, "kind" => "fenced").increment(1);
                    self.fatal = Some(format!(
                        "{msg}; its epoch was bumped: another instance with the same transactional id prefix took over, or the transaction outlived transaction.timeout.ms"
                    ));
                    return Err(KafkaError::Fenced(msg).into());
                }
                if let rdkafka::error::KafkaError::Transaction(te) = &e {
                    if te.txn_requires_abort() || te.is_fatal() {
                        self.fatal = Some(msg.clone());
                        return Err(KafkaError::DataLoss(msg).into());
                    }
                }
                Err(KafkaError::Protocol(msg).into())
            }
        }
    }

    /// Starts the commit of the slot sealed at `checkpoint` on a blocking thread if the open
    /// transaction holds records to overlap with; false if it did not start one.
    fn start_commit(&mut self, checkpoint: CheckpointId) -> bool {
        let open_has_records = !self.held.is_empty()
            || self.current.is_some_and(
                |i| matches!(self.slots[i].state, SlotState::Open { records, .. } if records > 0),
            );
        if !open_has_records {
            return false;
        }
        let Some(i) = self.slots.iter().position(
            |s| matches!(s.state, SlotState::Sealed { checkpoint: c, .. } if c == checkpoint),
        ) else {
            return false;
        };
        let slot = &mut self.slots[i];
        let (SlotState::Sealed { handle, since, .. }, Some((p, _, _))) =
            (&slot.state, &slot.producer)
        else {
            return false;
        };
        let (handle, since, p) = (handle.clone(), *since, p.clone());
        let task = tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            let r = p.commit_transaction(TXN_CALL_TIMEOUT);
            (r, t0.elapsed())
        });
        tracing::debug!(checkpoint, transactional_id = %slot.id, "commit started, overlapping the next transaction");
        slot.state = SlotState::Committing;
        self.in_flight.push(InFlight {
            checkpoint,
            slot: i,
            handle,
            since,
            completed: self.completed,
            task,
        });
        true
    }

    /// Waits for every commit in flight, oldest first. A failed one goes back to `Sealed` and
    /// is tried once more on the spot, with the error handling of [`Self::commit_live`].
    async fn finish_in_flight(&mut self) -> onceflow_runtime::Result<()> {
        let mut first_err = None;
        for f in std::mem::take(&mut self.in_flight) {
            let t_wait = Instant::now();
            let outcome = f.task.await;
            let waited = t_wait.elapsed();
            match outcome {
                Ok((Ok(()), took)) => {
                    metrics::histogram!(m::TXN_COMMIT_SECONDS, "mode" => "two-phase-commit")
                        .record(took.as_secs_f64());
                    metrics::histogram!(m::TXN_COMMIT_WAIT_SECONDS).record(waited.as_secs_f64());
                    metrics::histogram!(m::RECORDS_PER_TXN).record(f.handle.records as f64);
                    metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => self.subtask.to_string())
                        .set(f.since.elapsed().as_secs_f64());
                    self.slots[f.slot].state = SlotState::Committed { at: f.completed };
                    self.confirmed.push(f.checkpoint);
                    tracing::debug!(
                        checkpoint = f.checkpoint,
                        took_ms = took.as_secs_f64() * 1e3,
                        waited_ms = waited.as_secs_f64() * 1e3,
                        "overlapped commit done"
                    );
                }
                failed => {
                    let why = match &failed {
                        Ok((Err(e), _)) => e.to_string(),
                        Err(e) => format!("the commit thread panicked: {e}"),
                        Ok((Ok(()), _)) => String::new(),
                    };
                    tracing::warn!(checkpoint = f.checkpoint, transactional_id = %f.handle.transactional_id, error = %why, "overlapped commit failed; trying again");
                    self.slots[f.slot].state = SlotState::Sealed {
                        checkpoint: f.checkpoint,
                        handle: f.handle,
                        since: f.since,
                    };
                    if first_err.is_none() {
                        if let Err(e) = self.commit_live(f.checkpoint).await {
                            first_err = Some(e);
                        }
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Checkpoints whose commit succeeded since the last call, in order.
    pub(crate) fn take_confirmed(&mut self) -> Vec<CheckpointId> {
        std::mem::take(&mut self.confirmed)
    }

    pub(crate) async fn commit(
        &mut self,
        checkpoint: CheckpointId,
        pending: KafkaPending,
    ) -> onceflow_runtime::Result<()> {
        self.completed = self.completed.max(checkpoint);
        let KafkaPending::TwoPhase(p) = pending else {
            return Err(onceflow_runtime::Error::Internal(
                "two-phase sink got a foreign pending".into(),
            ));
        };
        self.finish_in_flight().await?;
        let Some(t) = p.txn else {
            self.confirmed.push(checkpoint);
            return Ok(());
        };
        if self.start_commit(checkpoint) || self.commit_live(checkpoint).await? {
            return Ok(());
        }
        if self.slots.iter().any(|s| s.id == t.transactional_id) {
            // our own id, no longer sealed: committed before (we unseal only on success)
            self.confirmed.push(checkpoint);
            return Ok(());
        }
        let security = ClientSecurity::from_properties(
            &self.cfg.client_properties,
            "two-phase-commit recovery",
        )?;
        match committer::commit_prepared(&self.cfg.brokers, &security, &t.transactional_id, t.producer_id, t.epoch, TXN_CALL_TIMEOUT).await? {
            CommitOutcome::Committed => {
                self.confirmed.push(checkpoint);
                Ok(())
            }
            CommitOutcome::Lost(code) => Err(KafkaError::DataLoss(format!(
                "transaction {} of checkpoint {checkpoint} cannot be committed (Kafka error code {code})",
                t.transactional_id
            ))
            .into()),
        }
    }

    pub(crate) async fn abort(&mut self, pending: KafkaPending) -> onceflow_runtime::Result<()> {
        let KafkaPending::TwoPhase(p) = pending else {
            return Ok(());
        };
        let Some(t) = p.txn else { return Ok(()) };
        let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| s.id == t.transactional_id && matches!(s.state, SlotState::Sealed { .. }))
        else {
            return Ok(());
        };
        if let Some((prod, _, _)) = &slot.producer {
            let prod = prod.clone();
            blocking(move || prod.abort_transaction(TXN_CALL_TIMEOUT))
                .await?
                .map_err(|e| KafkaError::client("abort_transaction", e))?;
        }
        slot.state = SlotState::Aborted;
        Ok(())
    }
}
