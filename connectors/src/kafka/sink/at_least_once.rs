//! At-least-once (idempotent producer; drain + flush at every pre-commit, so a complete
//! checkpoint's output is durable, and a restore replays, i.e. duplicates) and none (plain
//! producer, nothing waited for).

use std::sync::Arc;
use std::time::Duration;

use onceflow_runtime::{CheckpointId, SubtaskInfo};
use rdkafka::producer::Producer;

use super::super::config::{DeliveryMode, KafkaSinkConfig};
use super::super::{metrics as m, KafkaError};
use super::producer::{self, blocking, Ctx, Prod};
use super::{KafkaPending, KafkaSink, SinkRecord};

/// One at-least-once / none sink subtask.
pub struct AtLeastOnceWriter {
    cfg: KafkaSinkConfig,
    producer: Arc<Prod>,
    ctx: Ctx,
}

impl AtLeastOnceWriter {
    pub(crate) fn new(sink: &KafkaSink, _info: &SubtaskInfo) -> onceflow_runtime::Result<Self> {
        let idempotent = sink.cfg.mode == DeliveryMode::AtLeastOnce;
        let (producer, ctx) = producer::create(
            &sink.cfg,
            if idempotent {
                producer::Kind::Idempotent
            } else {
                producer::Kind::Plain
            },
        )?;
        Ok(AtLeastOnceWriter {
            cfg: sink.cfg.clone(),
            producer,
            ctx,
        })
    }

    fn mode_label(&self) -> &'static str {
        if self.cfg.mode == DeliveryMode::AtLeastOnce {
            "at-least-once"
        } else {
            "none"
        }
    }

    pub(crate) fn write_batch(&mut self, records: Vec<SinkRecord>) -> onceflow_runtime::Result<()> {
        for r in &records {
            producer::send(&self.producer, &self.cfg.default_topic, r)?;
        }
        self.producer.poll(Duration::ZERO);
        metrics::counter!(m::RECORDS_PRODUCED, "mode" => self.mode_label())
            .increment(records.len() as u64);
        if let Some(e) = producer::take_delivery_error(&self.ctx) {
            return Err(KafkaError::Protocol(format!("delivery failed: {e}")).into());
        }
        Ok(())
    }

    pub(crate) async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPending> {
        if self.cfg.mode == DeliveryMode::AtLeastOnce {
            let p = self.producer.clone();
            blocking(move || -> super::super::Result<()> {
                producer::drain(&p, Duration::from_secs(60))?;
                p.flush(Duration::from_secs(60))
                    .map_err(|e| KafkaError::client("flush", e))
            })
            .await??;
            if let Some(e) = producer::take_delivery_error(&self.ctx) {
                return Err(KafkaError::Protocol(format!("delivery failed: {e}")).into());
            }
        }
        Ok(KafkaPending::Flushed { checkpoint })
    }
}
