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
//! A transactional id that a restorable checkpoint names is never reused: a recovery from
//! that checkpoint sends EndTxn(commit) with the recorded producer id and epoch, and on a
//! reused slot (same producer, same epoch) that would commit the slot's later, partial
//! transaction, whose records the replay then writes again. The runtime keeps a pre-commit
//! in every snapshot until `commit` of it returned Ok, and that may be several checkpoints
//! after the transaction was committed (a commit that failed at completion is retried at the
//! next pre-commit, which succeeds while the runtime still holds the pending). So a committed
//! slot records the newest checkpoint whose snapshot may name it (`named_until`: the newest
//! pre-commit started when the runtime last handed the pending to `commit`) and is reused
//! only once a later checkpoint completed. Hence at least 3 slots (open, pre-committed,
//! committed-but-named); the ring grows when checkpoints fail or commits are retried, and
//! the size is recorded in every pending.
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
//! but the first gets its producer (create + init_transactions + DescribeTransactions for
//! its producer id and epoch) on a blocking thread in the background, so no pre-commit waits
//! for one. A producer's id and epoch are fixed from its init_transactions until an abort
//! (librdkafka bumps a transactional producer's epoch only inside abort_transaction, and
//! librdkafka 2.12 speaks EndTxn v1, without KIP-890's bump per transaction), so they are
//! learned once, and an aborted slot gets a fresh producer. Slots that recovery committed
//! stay untouched (see above) and get their producer when first reused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use onceflow_runtime::{CheckpointId, PreCommit, SubtaskInfo};
use rdkafka::producer::Producer;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::super::config::KafkaSinkConfig;
use super::super::{metrics as m, KafkaError};
use super::producer::{self, blocking, Ctx, Prod};
use super::{KafkaPending, KafkaSink, SinkRecord};
use crate::kafka::committer;
use crate::kafka::security::ClientSecurity;

mod commit;
mod recover;

use commit::InFlight;

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
    /// Committed; snapshots of checkpoints up to `named_until` may name its transaction, so
    /// it is reusable only once a later checkpoint completed (see the module documentation).
    Committed { named_until: CheckpointId },
    /// Aborted (reusable).
    Aborted,
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
    /// The newest checkpoint whose pre-commit started: its snapshot lists every pending the
    /// runtime still holds.
    last_pre_commit: CheckpointId,
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
    /// Set once the cluster could not answer DescribeTransactions: producers then learn
    /// their ids from librdkafka's statistics (see [`make_producer`]).
    ids_from_statistics: Arc<AtomicBool>,
    /// Unit tests: this many live commits fail with a retriable error before reaching the
    /// broker.
    #[cfg(test)]
    inject_commit_failures: u32,
}

/// At most this many records are held back during a drain; a write beyond waits for it.
const HOLD_LIMIT: usize = 20_000;

fn txn_id(prefix: &str, subtask: usize, slot: usize) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

/// Whether `id` is one of the two-phase-commit ring ids of `prefix` (`{prefix}-{subtask}-{slot}`,
/// also the rings `{prefix}-{sink}-{subtask}-{slot}` of further sinks).
pub(crate) fn is_ring_id(prefix: &str, id: &str) -> bool {
    let Some(rest) = id.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let mut parts = rest.rsplitn(3, '-');
    let (Some(slot), Some(subtask)) = (parts.next(), parts.next()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(slot) && digits(subtask)
}

/// How long a producer's DescribeTransactions retries before the subtask falls back to
/// librdkafka's statistics (an older Kafka closes the connection on the request).
const DESCRIBE_PATIENCE: Duration = Duration::from_secs(5);

/// Creates the transactional producer of `id` and learns its producer id and epoch: after
/// `init_transactions`, from the transaction coordinator (DescribeTransactions, one round
/// trip; see [`committer::describe_producer`] for why the answer is the producer's own), or,
/// once the cluster could not answer that (`from_statistics` is then set for every later
/// producer of the subtask), from librdkafka's statistics, which cost a wait of up to their
/// 100 ms interval here and about 1-1.5 % of the job's CPU for as long as the producer
/// lives (docs/BENCHMARKS.md).
/// Blocking: on a thread of tokio's blocking pool.
fn make_producer(
    cfg: &KafkaSinkConfig,
    id: &str,
    from_statistics: &AtomicBool,
) -> super::super::Result<Made> {
    if !from_statistics.load(Ordering::Relaxed) {
        let (p, ctx) = producer::init_transactional(cfg, id, TXN_CALL_TIMEOUT)?;
        let described = ClientSecurity::from_properties(
            &cfg.client_properties,
            "the two-phase-commit sink's DescribeTransactions",
        )
        .and_then(|security| {
            tokio::runtime::Handle::current().block_on(committer::describe_producer(
                &cfg.brokers,
                &security,
                id,
                DESCRIBE_PATIENCE,
            ))
        });
        match described {
            Ok(ids) => return Ok((p, ctx, ids)),
            Err(e) => {
                tracing::warn!(transactional_id = %id, error = %e, "the cluster did not answer DescribeTransactions (Kafka before 3.0?): this subtask's producers learn their ids from librdkafka's statistics instead");
                from_statistics.store(true, Ordering::Relaxed);
            }
        }
    }
    let kind = producer::Kind::Transactional {
        id,
        learn_ids: true,
    };
    let (p, ctx) = producer::create(cfg, kind)?;
    let ids = producer::init_and_learn(&p, &ctx, id, &cfg.default_topic, TXN_CALL_TIMEOUT)?;
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
            last_pre_commit: info.restored_checkpoint,
            fatal: None,
            recovered_ids: sink.recovered_ids.clone(),
            in_flight: Vec::new(),
            confirmed: Vec::new(),
            draining: None,
            held: Vec::new(),
            ids_from_statistics: Arc::new(AtomicBool::new(false)),
            #[cfg(test)]
            inject_commit_failures: 0,
        }
    }

    fn check_fatal(&self) -> onceflow_runtime::Result<()> {
        match &self.fatal {
            Some(f) => Err(KafkaError::Fenced(f.clone()).into()),
            None => Ok(()),
        }
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
            let from_statistics = self.ids_from_statistics.clone();
            slot.warming = Some(tokio::task::spawn_blocking(move || {
                make_producer(&cfg, &id, &from_statistics)
            }));
        }
    }

    /// A slot to open the next transaction on (grows the ring if none is free).
    fn free_slot(&mut self) -> usize {
        for (i, s) in self.slots.iter().enumerate() {
            match s.state {
                SlotState::Fresh | SlotState::Aborted => return i,
                SlotState::Committed { named_until } if named_until < self.completed => return i,
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
                    let from_statistics = self.ids_from_statistics.clone();
                    blocking(move || make_producer(&cfg, &id, &from_statistics)).await??
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
        // from here on this checkpoint's snapshot may name every pending the runtime holds,
        // including those whose transactions the retries below commit
        self.last_pre_commit = self.last_pre_commit.max(checkpoint);
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
        // the ids of the producer's init_transactions: it has not aborted since (see abort)
        let (pid, epoch) = *ids;
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
        // the producer is dropped after the abort and the slot gets a fresh one when reused:
        // an abort may bump the producer's epoch (KIP-360), and a sink knows a producer's
        // epoch only from its init_transactions (producer::ProdCtx::ids)
        if let Some(made) = slot.producer.take() {
            let back = blocking(move || match made.0.abort_transaction(TXN_CALL_TIMEOUT) {
                // the drop waits for librdkafka's threads: on the blocking thread too
                Ok(()) => {
                    drop(made);
                    Ok(())
                }
                Err(e) => Err((e, made)),
            })
            .await?;
            if let Err((e, made)) = back {
                slot.producer = Some(made);
                return Err(KafkaError::client("abort_transaction", e).into());
            }
        }
        slot.state = SlotState::Aborted;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ring_ids {
    #[test]
    fn ring_ids_are_told_from_other_ids() {
        use super::{is_ring_id, txn_id};
        assert!(is_ring_id("etl", &txn_id("etl", 0, 3)));
        assert!(is_ring_id("etl", "etl-kafka-dlq-1-12"));
        assert!(!is_ring_id("etl", "etl-checkpoints"));
        assert!(!is_ring_id("etl", "etl-offsets"));
        assert!(!is_ring_id("etl", "etl2-0-1"));
        assert!(!is_ring_id("etl", "etl-0-"));
    }
}
