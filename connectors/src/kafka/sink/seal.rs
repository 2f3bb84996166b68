//! Sealing checkpoints in Kafka for two-phase-commit mode.
//!
//! A checkpoint directory alone cannot stop an older instance of the job: it can complete
//! (and commit) one more checkpoint after a newer instance has chosen where to restore from,
//! and that checkpoint's output would then be produced twice. [`CheckpointSeal`] moves the
//! decision "checkpoint n is complete" into Kafka: once n's metadata is durable, the runtime's
//! [`CompletionHook`] commits a transaction of the producer `{prefix}-checkpoints` that holds
//! the source positions at barrier n as the consumer group's offsets, each with metadata
//! `onceflow-chk=n`. Only then do the sink subtasks commit n's transactions.
//!
//! A new instance first runs `init_transactions` on that id ([`CheckpointSeal::fence_previous`]):
//! from then on no older instance can seal a checkpoint. It then reads the group's offsets
//! ([`super::committed_checkpoint`]): the checkpoint they name is the newest complete one, for
//! good, and it restores exactly that one. Its pre-committed transactions are still open (or
//! committed): recovery commits them with EndTxn and fences the rest of the ring.
//!
//! As a side effect the group's committed offsets follow the job's progress, so consumer lag
//! shows in the usual Kafka tools, as with Flink's offset commit on checkpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_runtime::{async_trait, CheckpointId, CompletionHook};
use rdkafka::producer::Producer;

use super::super::config::KafkaSinkConfig;
use super::super::{metrics as m, KafkaError};
use super::producer::{self, blocking, Prod};
use super::OffsetsLink;

const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The transactional id that seals checkpoints of jobs with this prefix.
pub fn seal_transactional_id(prefix: &str) -> String {
    format!("{prefix}-checkpoints")
}

/// Seals each checkpoint by committing the source positions at its barrier to the consumer
/// group in a transaction (see the module documentation). Give the same [`OffsetsLink`] to
/// the `KafkaSource` ([`crate::kafka::KafkaSource::offsets_link`]).
pub struct CheckpointSeal(Arc<SealInner>);

struct SealInner {
    producer: Arc<Prod>,
    link: OffsetsLink,
    id: String,
    transaction_timeout: Duration,
    /// Every transaction a seal would make committable started after this moment: the
    /// barrier of the last sealed checkpoint; before the first seal of this run, the first
    /// source poll (no record, hence no broker-side transaction, is older).
    oldest_start: parking_lot::Mutex<Option<Instant>>,
}

impl CheckpointSeal {
    /// Creates the seal producer and runs `init_transactions`, which fences every older
    /// instance of the job (it can no longer complete a checkpoint) and aborts a seal it left
    /// open. Call it before [`super::committed_checkpoint`]. Blocking: call it outside async
    /// code.
    pub fn fence_previous(cfg: &KafkaSinkConfig, link: OffsetsLink) -> super::super::Result<Self> {
        let id = seal_transactional_id(&cfg.transactional_id_prefix);
        let (p, _ctx) = producer::init_transactional(cfg, &id, TXN_CALL_TIMEOUT)?;
        metrics::counter!(m::FENCING_EVENTS, "kind" => "recovery").increment(1);
        tracing::info!(transactional_id = %id, "checkpoint seal ready: older instances can no longer complete checkpoints");
        Ok(CheckpointSeal(Arc::new(SealInner {
            producer: p,
            link,
            id,
            transaction_timeout: cfg.transaction_timeout,
            oldest_start: parking_lot::Mutex::new(None),
        })))
    }
}

impl SealInner {
    fn seal_blocking(&self, checkpoint: CheckpointId) -> std::result::Result<(), (bool, String)> {
        let (tpl, gm) = self
            .link
            .source_offsets(checkpoint)
            .map_err(|e| (false, e.to_string()))?;
        let p = &self.producer;
        let fenced = |what: &str, e: rdkafka::error::KafkaError| {
            (producer::is_fenced(&e), format!("{what}: {e}"))
        };
        p.begin_transaction()
            .map_err(|e| fenced("begin_transaction", e))?;
        if tpl.count() > 0 {
            p.send_offsets_to_transaction(&tpl, &gm, TXN_CALL_TIMEOUT)
                .map_err(|e| fenced("send_offsets_to_transaction", e))?;
        }
        p.commit_transaction(TXN_CALL_TIMEOUT)
            .map_err(|e| fenced("commit_transaction", e))
    }
}

#[async_trait]
impl CompletionHook for CheckpointSeal {
    async fn seal(&self, checkpoint: CheckpointId) -> onceflow_runtime::Result<()> {
        // A sealed checkpoint's transactions must still be alive to be committed: if the job
        // stalled (GC, SIGSTOP, an overloaded host) for about the transaction timeout, the
        // broker may have aborted them. Not sealing fails the job, which then restores the
        // last sealed checkpoint and replays; sealing would lose that output.
        let oldest = *self.0.oldest_start.lock();
        let age = oldest
            .or_else(|| self.0.link.started_at())
            .map_or(Duration::ZERO, |t| t.elapsed());
        let margin = (self.0.transaction_timeout / 10).max(Duration::from_secs(1));
        if age + margin >= self.0.transaction_timeout {
            metrics::counter!(m::SEALS_REFUSED).increment(1);
            return Err(KafkaError::Protocol(format!(
                "not sealing checkpoint {checkpoint}: its oldest transaction may have started {:.1} s ago, too close to transaction.timeout.ms ({} ms; the broker may have aborted it). The job restarts from the last sealed checkpoint; if this repeats, raise --transaction-timeout-ms or checkpoint more often",
                age.as_secs_f64(),
                self.0.transaction_timeout.as_millis()
            ))
            .into());
        }
        let t0 = Instant::now();
        let inner = self.0.clone();
        let r = blocking(move || inner.seal_blocking(checkpoint)).await?;
        match r {
            Ok(()) => {
                metrics::histogram!(m::TXN_COMMIT_SECONDS, "mode" => "seal")
                    .record(t0.elapsed().as_secs_f64());
                let barrier = self.0.link.barrier_at(checkpoint).unwrap_or(t0);
                *self.0.oldest_start.lock() = Some(barrier);
                self.0.link.forget_up_to(checkpoint);
                tracing::debug!(checkpoint, transactional_id = %self.0.id, "checkpoint sealed");
                Ok(())
            }
            Err((true, msg)) => {
                metrics::counter!(m::FENCING_EVENTS, "kind" => "fenced").increment(1);
                Err(KafkaError::Fenced(format!(
                    "checkpoint {checkpoint} cannot be sealed ({msg}): a newer instance with the transactional id prefix of {} took over",
                    self.0.id
                ))
                .into())
            }
            Err((false, msg)) => Err(KafkaError::Protocol(format!(
                "sealing checkpoint {checkpoint} with {} failed: {msg}; the job restarts from the newest sealed checkpoint",
                self.0.id
            ))
            .into()),
        }
    }
}
