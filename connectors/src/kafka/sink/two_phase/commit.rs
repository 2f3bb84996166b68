//! Commits of a two-phase-commit sink subtask: on the live producer, overlapped with the
//! next transaction's writes on a blocking thread, retried after a failure, or, for a
//! transaction this run does not hold, with the raw committer (see the parent module).

use std::time::{Duration, Instant};

use onceflow_runtime::CheckpointId;
use rdkafka::producer::Producer;

use super::super::producer::{self, blocking};
use super::super::KafkaPending;
use super::{SlotState, TwoPhaseWriter, TxnHandle, TXN_CALL_TIMEOUT};
use crate::kafka::committer::{self, CommitOutcome};
use crate::kafka::security::ClientSecurity;
use crate::kafka::{metrics as m, KafkaError};

/// A commit running on a blocking thread while the next transaction is written.
pub(super) struct InFlight {
    checkpoint: CheckpointId,
    slot: usize,
    /// What the slot held while sealed (restored if the commit fails).
    handle: TxnHandle,
    since: Instant,
    /// The newest pre-commit started when the commit started: the last snapshot that may
    /// name the transaction (the runtime drops it once `commit` returned).
    named_until: CheckpointId,
    /// The commit's outcome and how long it took.
    task: tokio::task::JoinHandle<(
        std::result::Result<(), rdkafka::error::KafkaError>,
        Duration,
    )>,
}

impl TwoPhaseWriter {
    /// Commits again every transaction of a complete checkpoint whose commit failed before.
    pub(super) async fn retry_commits(&mut self) -> onceflow_runtime::Result<()> {
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
        let named_until = self.last_pre_commit;
        #[cfg(test)]
        if self.inject_commit_failures > 0 {
            self.inject_commit_failures -= 1;
            return Err(KafkaError::Protocol(format!(
                "commit of checkpoint {checkpoint} failed: injected retriable failure"
            ))
            .into());
        }
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
                metrics::histogram!(m::OUTPUT_LATENCY_SECONDS, "mode" => "two-phase-commit")
                    .record(since.elapsed().as_secs_f64());
                metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => self.subtask.to_string())
                    .set(age.as_secs_f64());
                slot.state = SlotState::Committed { named_until };
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
            named_until: self.last_pre_commit,
            task,
        });
        true
    }

    /// Waits for every commit in flight, oldest first. A failed one goes back to `Sealed` and
    /// is tried once more on the spot, with the error handling of [`Self::commit_live`].
    pub(super) async fn finish_in_flight(&mut self) -> onceflow_runtime::Result<()> {
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
                    metrics::histogram!(m::OUTPUT_LATENCY_SECONDS, "mode" => "two-phase-commit")
                        .record(f.since.elapsed().as_secs_f64());
                    metrics::gauge!(m::TXN_OPEN_AGE_SECONDS, "subtask" => self.subtask.to_string())
                        .set(f.since.elapsed().as_secs_f64());
                    self.slots[f.slot].state = SlotState::Committed {
                        named_until: f.named_until,
                    };
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
        if let Some(slot) = self.slots.iter_mut().find(|s| s.id == t.transactional_id) {
            // our own id, no longer sealed: committed before (we unseal only on success), by a
            // retry while the runtime still held this pending, so every snapshot up to the
            // newest pre-commit may name it; the runtime drops it now
            if let SlotState::Committed { named_until } = &mut slot.state {
                *named_until = (*named_until).max(self.last_pre_commit);
            }
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
}
