//! KafkaSink: writes [`SinkRecord`]s to Kafka in one of four [`DeliveryMode`]s. Every
//! pre-commit returns a [`KafkaPending`] (also when nothing was written), so `commit(n)` is
//! called for every completed checkpoint and the sink can report it (`on_commit`).

mod at_least_once;
pub(crate) mod producer;
mod seal;
mod transactional_offsets;
mod two_phase;
pub(crate) use two_phase::is_ring_id;

use std::collections::HashSet;
use std::sync::Arc;

use onceflow_runtime::{async_trait, CheckpointId, PreCommit, Sink, SinkFactory, SubtaskInfo};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::config::{DeliveryMode, KafkaSinkConfig};

pub use at_least_once::AtLeastOnceWriter;
pub use seal::{seal_transactional_id, CheckpointSeal};
pub(crate) use transactional_offsets::event_time_of_metadata;
pub use transactional_offsets::{committed_checkpoint, OffsetsLink, OffsetsWriter};
pub use two_phase::{TwoPhasePending, TwoPhaseWriter, TxnHandle};

/// A record for the sink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkRecord {
    /// Target topic; `None`: the sink's default topic.
    pub topic: Option<String>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Vec<u8>,
    /// Record timestamp (ms); `None`: the producer's clock.
    pub timestamp_ms: Option<i64>,
}

impl SinkRecord {
    /// A record for the default topic.
    pub fn new(key: Option<Vec<u8>>, value: Vec<u8>) -> Self {
        SinkRecord {
            topic: None,
            key,
            value,
            timestamp_ms: None,
        }
    }

    /// Sends the record to `topic` instead of the default topic.
    pub fn to_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }
}

/// What a checkpoint stores for the Kafka sink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KafkaPending {
    /// Two-phase commit: the pre-committed transaction (if any) and the ring.
    TwoPhase(TwoPhasePending),
    /// Transactional offsets: the instance commits at completion of this checkpoint.
    Offsets {
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// At-least-once / none: flushed at this checkpoint.
    Flushed {
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
}

/// Called after a sink subtask committed checkpoint n: (checkpoint, subtask).
pub type CommitObserver = Arc<dyn Fn(CheckpointId, usize) + Send + Sync>;

/// Called after a sink subtask finished recovery, before records flow: (subtask, parallelism).
pub type RecoveredObserver = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Builds Kafka sink subtasks.
#[derive(Clone)]
pub struct KafkaSink {
    pub(crate) cfg: KafkaSinkConfig,
    pub(crate) on_commit: Option<CommitObserver>,
    pub(crate) on_recovered: Option<RecoveredObserver>,
    pub(crate) link: Option<OffsetsLink>,
    /// Two-phase commit: `Some(true)` once the job's checkpoints are sealed in Kafka
    /// ([`Self::sealed_by`]), `Some(false)` after an explicit [`Self::without_seal`].
    pub(crate) sealed: Option<bool>,
    /// Ids committed by recovery (not to be fenced or reused until a new checkpoint completes).
    pub(crate) recovered_ids: Arc<Mutex<HashSet<String>>>,
}

impl KafkaSink {
    /// A sink with this configuration. Transactional-offsets mode needs [`Self::offsets_link`].
    pub fn new(cfg: KafkaSinkConfig) -> Self {
        KafkaSink {
            cfg,
            on_commit: None,
            on_recovered: None,
            link: None,
            sealed: None,
            recovered_ids: Arc::default(),
        }
    }

    /// Two-phase commit: the job's checkpoints are sealed by `seal`, installed as the job's
    /// completion hook (`JobConfig::completion_hook`). [`crate::kafka::job::KafkaJob`] does
    /// this itself; a sink wired by hand in two-phase-commit mode must say either this or
    /// [`Self::without_seal`], or it refuses to start.
    pub fn sealed_by(mut self, _seal: &CheckpointSeal) -> Self {
        self.sealed = Some(true);
        self
    }

    /// Two-phase commit without the seal: only where no second instance of the job can ever
    /// start (a test, a one-off backfill). A second instance started while this one runs
    /// could restore a checkpoint older than one this instance completes and commits, and
    /// process its input twice.
    pub fn without_seal(mut self) -> Self {
        self.sealed = Some(false);
        self
    }

    /// Observes commits (e.g. to print progress).
    pub fn on_commit(mut self, f: impl Fn(CheckpointId, usize) + Send + Sync + 'static) -> Self {
        self.on_commit = Some(Arc::new(f));
        self
    }

    /// Observes the end of each subtask's recovery (records flow once all are done).
    pub fn on_recovered(mut self, f: impl Fn(usize, usize) + Send + Sync + 'static) -> Self {
        self.on_recovered = Some(Arc::new(f));
        self
    }

    /// Shares offsets with the source (transactional-offsets mode).
    pub fn offsets_link(mut self, link: OffsetsLink) -> Self {
        self.link = Some(link);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &KafkaSinkConfig {
        &self.cfg
    }
}

/// One sink subtask.
pub struct KafkaSinkWriter {
    inner: WriterKind,
    subtask: usize,
    parallelism: usize,
    on_commit: Option<CommitObserver>,
    on_recovered: Option<RecoveredObserver>,
}

/// The mode-specific part of a sink subtask.
pub enum WriterKind {
    /// Two-phase commit.
    TwoPhase(Box<TwoPhaseWriter>),
    /// Transactional offsets.
    Offsets(Box<OffsetsWriter>),
    /// At-least-once or none.
    AtLeastOnce(Box<AtLeastOnceWriter>),
}

impl SinkFactory<SinkRecord> for KafkaSink {
    type Sink = KafkaSinkWriter;

    fn create(&self, info: &SubtaskInfo) -> onceflow_runtime::Result<KafkaSinkWriter> {
        self.cfg.validate()?;
        let inner = match self.cfg.mode {
            DeliveryMode::TwoPhaseCommit => {
                if self.sealed.is_none() {
                    return Err(super::KafkaError::Config(
                        "two-phase-commit mode needs its checkpoints sealed in Kafka, or a second instance of the job could process input twice: build the job with KafkaJob (it wires the seal), or install a CheckpointSeal as the job's completion hook and call KafkaSink::sealed_by, or call KafkaSink::without_seal where no second instance can ever start".into(),
                    )
                    .into());
                }
                WriterKind::TwoPhase(Box::new(TwoPhaseWriter::new(self, info)))
            }
            DeliveryMode::TransactionalOffsets => {
                let link = self.link.clone().ok_or_else(|| {
                    super::KafkaError::Config(
                        "transactional-offsets mode needs the OffsetsLink shared with the KafkaSource (KafkaSink::offsets_link)".into(),
                    )
                })?;
                WriterKind::Offsets(Box::new(OffsetsWriter::new(self, info, link)))
            }
            DeliveryMode::AtLeastOnce | DeliveryMode::None => {
                WriterKind::AtLeastOnce(Box::new(AtLeastOnceWriter::new(self, info)?))
            }
        };
        Ok(KafkaSinkWriter {
            inner,
            subtask: info.index,
            parallelism: info.parallelism,
            on_commit: self.on_commit.clone(),
            on_recovered: self.on_recovered.clone(),
        })
    }
}

impl KafkaSinkWriter {
    /// Tells the commit observer about the two-phase commits that succeeded since the last
    /// call.
    fn report_confirmed(&mut self) {
        let WriterKind::TwoPhase(w) = &mut self.inner else {
            return;
        };
        for c in w.take_confirmed() {
            if let Some(f) = &self.on_commit {
                f(c, self.subtask);
            }
        }
    }
}

#[async_trait]
impl Sink<SinkRecord> for KafkaSinkWriter {
    type Pending = KafkaPending;

    async fn recover(&mut self, pending: Vec<KafkaPending>) -> onceflow_runtime::Result<()> {
        let span = tracing::info_span!(
            "kafka_recover",
            subtask = self.subtask,
            pending = pending.len()
        );
        async {
            match &mut self.inner {
                WriterKind::TwoPhase(w) => w.recover(pending).await,
                WriterKind::Offsets(w) => w.recover().await,
                WriterKind::AtLeastOnce(_) => Ok(()),
            }
        }
        .instrument(span)
        .await?;
        if let Some(f) = &self.on_recovered {
            f(self.subtask, self.parallelism);
        }
        Ok(())
    }

    async fn write_batch(&mut self, records: Vec<SinkRecord>) -> onceflow_runtime::Result<()> {
        match &mut self.inner {
            WriterKind::TwoPhase(w) => w.write_batch(records).await,
            WriterKind::Offsets(w) => w.write_batch(records).await,
            WriterKind::AtLeastOnce(w) => w.write_batch(records),
        }
    }

    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<Option<KafkaPending>> {
        let span = tracing::debug_span!("kafka_pre_commit", checkpoint, subtask = self.subtask);
        let r = async {
            match &mut self.inner {
                WriterKind::TwoPhase(w) => w.pre_commit(checkpoint).await.map(Some),
                WriterKind::Offsets(w) => w.pre_commit(checkpoint).await.map(Some),
                WriterKind::AtLeastOnce(w) => w.pre_commit(checkpoint).await.map(Some),
            }
        }
        .instrument(span)
        .await;
        // a two-phase pre-commit first finishes the commits still in flight
        self.report_confirmed();
        r
    }

    async fn start_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<PreCommit<KafkaPending>> {
        let WriterKind::TwoPhase(w) = &mut self.inner else {
            return self.pre_commit(checkpoint).await.map(PreCommit::Done);
        };
        let span = tracing::debug_span!("kafka_pre_commit", checkpoint, subtask = self.subtask);
        let r = w.start_pre_commit(checkpoint).instrument(span).await;
        // it first finishes the commits still in flight
        self.report_confirmed();
        r
    }

    async fn finish_pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<Option<KafkaPending>> {
        let WriterKind::TwoPhase(w) = &mut self.inner else {
            return Err(onceflow_runtime::Error::Internal(
                "only a two-phase-commit sink leaves its pre-commit draining".into(),
            ));
        };
        let span = tracing::debug_span!(
            "kafka_finish_pre_commit",
            checkpoint,
            subtask = self.subtask
        );
        w.finish_pre_commit(checkpoint)
            .instrument(span)
            .await
            .map(Some)
    }

    async fn commit(
        &mut self,
        checkpoint: CheckpointId,
        pending: KafkaPending,
    ) -> onceflow_runtime::Result<()> {
        let span = tracing::debug_span!("kafka_commit", checkpoint, subtask = self.subtask);
        let r = async {
            match &mut self.inner {
                WriterKind::TwoPhase(w) => w.commit(checkpoint, pending).await,
                WriterKind::Offsets(w) => w.commit(checkpoint).await,
                WriterKind::AtLeastOnce(_) => Ok(()),
            }
        }
        .instrument(span)
        .await;
        if let WriterKind::TwoPhase(_) = self.inner {
            // two-phase commit says which commits are done (one may still run, overlapping
            // the next transaction)
            self.report_confirmed();
            return r;
        }
        r?;
        if let Some(f) = &self.on_commit {
            f(checkpoint, self.subtask);
        }
        Ok(())
    }

    async fn abort(&mut self, pending: KafkaPending) -> onceflow_runtime::Result<()> {
        match &mut self.inner {
            WriterKind::TwoPhase(w) => w.abort(pending).await,
            _ => Ok(()),
        }
    }
}
