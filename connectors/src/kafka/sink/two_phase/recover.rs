//! Recovery of a two-phase-commit sink subtask: subtask 0 commits the restored checkpoint's
//! transactions with the raw committer, then fences every other id of the previous and the
//! current ring; every subtask then opens its first transaction.

use std::time::{Duration, Instant};

use super::super::KafkaPending;
use super::{txn_id, SlotState, TwoPhaseWriter, FENCE_MARGIN, TXN_CALL_TIMEOUT};
use crate::kafka::committer::{self, CommitOutcome};
use crate::kafka::security::ClientSecurity;
use crate::kafka::{metrics as m, KafkaError};

impl TwoPhaseWriter {
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
                s.state = SlotState::Committed {
                    named_until: self.restored,
                };
            }
        }
        let next = self.free_slot();
        // the other slots' producers are made while the first one is
        self.warm_up(next);
        self.open(next).await
    }
}
