//! The checkpoint coordinator: triggers barriers at the sources, collects every subtask's
//! acknowledgement, writes the metadata durably and only then publishes the checkpoint as
//! complete (which makes sinks commit). A [`crate::CompletionHook`], if configured, seals the
//! checkpoint between those two steps; a failed seal fails the job. A failed or timed-out
//! checkpoint is discarded and the job goes on, up to `tolerable_failed_checkpoints` failures
//! in a row; the final checkpoint (end of input or stop) must succeed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};

use crate::checkpoint::metadata::{CheckpointMetadata, NodeMetadata, StateFileMetadata};
use crate::checkpoint::storage::CheckpointStorage;

/// The coordinator's error when every subtask is gone: they failed, and one of their errors
/// is the cause to report (`execute` looks for it).
pub(crate) const ALL_SUBTASKS_GONE: &str = "every subtask dropped its coordinator channel";
use crate::config::{CheckpointEvent, JobConfig};
use crate::element::{Barrier, CheckpointId};
use crate::metrics as m;
use crate::task::{CoordinatorMsg, JobProgress, SourceControl};
use crate::{Error, Result};

struct Pending {
    id: CheckpointId,
    is_final: bool,
    triggered_ms: u64,
    started: Instant,
    remaining: usize,
    files: HashMap<String, Vec<StateFileMetadata>>,
    failure: Option<String>,
}

/// Counters returned when the coordinator ends.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CoordinatorStats {
    pub completed: u64,
    pub failed: u64,
    /// Failures since the last completed checkpoint.
    pub failed_in_a_row: u32,
    pub last: Option<CheckpointId>,
}

pub(crate) struct Coordinator {
    pub config: JobConfig,
    pub storage: Option<Arc<dyn CheckpointStorage>>,
    /// `(uid, parallelism)` of every node.
    pub nodes: Vec<(String, usize)>,
    pub source_controls: Vec<mpsc::UnboundedSender<SourceControl>>,
    pub ack_rx: mpsc::UnboundedReceiver<CoordinatorMsg>,
    pub progress_tx: Arc<watch::Sender<JobProgress>>,
    pub stop_rx: watch::Receiver<bool>,
    pub next_id: CheckpointId,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Coordinator {
    fn notify(&self, ev: CheckpointEvent) {
        if let Some(l) = &self.config.checkpoint_listener {
            l(ev);
        }
    }

    fn total_subtasks(&self) -> usize {
        self.nodes.iter().map(|(_, p)| p).sum()
    }

    async fn trigger(&mut self, is_final: bool) -> Pending {
        let id = self.next_id;
        self.next_id += 1;
        let mut pending = Pending {
            id,
            is_final,
            triggered_ms: now_ms(),
            started: Instant::now(),
            remaining: self.total_subtasks(),
            files: HashMap::new(),
            failure: None,
        };
        if let Some(st) = self.storage.clone() {
            if let Err(e) = tokio::task::spawn_blocking(move || st.begin(id))
                .await
                .map_err(|e| Error::Internal(e.to_string()))
                .and_then(|r| r)
            {
                pending.failure = Some(e.to_string());
            }
        }
        tracing::info!(checkpoint = id, is_final, "checkpoint triggered");
        self.notify(CheckpointEvent::Triggered(id));
        let barrier = Barrier {
            checkpoint_id: id,
            timestamp_ms: pending.triggered_ms,
            is_final,
        };
        for c in &self.source_controls {
            if c.send(SourceControl::Trigger(barrier)).is_err() {
                pending
                    .failure
                    .get_or_insert_with(|| "a source subtask has stopped".to_string());
            }
        }
        pending
    }

    /// Discards a failed checkpoint; an error once the failures in a row exceed the job's
    /// `tolerable_failed_checkpoints` (or the final checkpoint failed).
    fn fail(&self, p: &Pending, reason: &str, stats: &mut CoordinatorStats) -> Result<()> {
        stats.failed += 1;
        stats.failed_in_a_row += 1;
        metrics::counter!(m::CHECKPOINTS_FAILED).increment(1);
        metrics::gauge!(m::CHECKPOINTS_FAILED_IN_A_ROW).set(f64::from(stats.failed_in_a_row));
        let tolerable = self.config.tolerable_failed_checkpoints;
        let too_many = tolerable.is_some_and(|t| stats.failed_in_a_row > t);
        if !too_many && !p.is_final {
            tracing::warn!(
                checkpoint = p.id,
                reason,
                failed_in_a_row = stats.failed_in_a_row,
                "checkpoint failed; the job continues"
            );
        }
        self.notify(CheckpointEvent::Failed(p.id));
        if let Some(st) = &self.storage {
            if let Err(e) = st.discard(p.id) {
                tracing::warn!(checkpoint = p.id, error = %e, "could not discard failed checkpoint");
            }
        }
        if p.is_final {
            return Err(Error::CheckpointFailed {
                checkpoint: p.id,
                reason: format!("final checkpoint: {reason}"),
            });
        }
        if too_many {
            let t = tolerable.unwrap_or(0);
            tracing::error!(
                checkpoint = p.id,
                reason,
                failed_in_a_row = stats.failed_in_a_row,
                tolerable = t,
                "too many checkpoints failed in a row: the job fails"
            );
            return Err(Error::CheckpointFailed {
                checkpoint: p.id,
                reason: format!(
                    "{reason}; {} checkpoints failed in a row, {t} are tolerated (tolerable_failed_checkpoints): the job fails so that its restart commits what the last complete checkpoint names before the broker's transaction timeout",
                    stats.failed_in_a_row
                ),
            });
        }
        Ok(())
    }

    async fn complete(&self, p: &mut Pending) -> Result<()> {
        if let Some(st) = self.storage.clone() {
            let nodes = self
                .nodes
                .iter()
                .map(|(uid, par)| {
                    let mut files = p.files.remove(uid).unwrap_or_default();
                    files.sort_by_key(|f| f.subtask);
                    NodeMetadata {
                        uid: uid.clone(),
                        parallelism: *par as u32,
                        files,
                    }
                })
                .collect::<Vec<_>>();
            let bytes: u64 = nodes.iter().flat_map(|n| &n.files).map(|f| f.len).sum();
            let meta = CheckpointMetadata {
                checkpoint_id: p.id,
                job_name: self.config.name.clone(),
                max_parallelism: self.config.max_parallelism as u32,
                triggered_ms: p.triggered_ms,
                is_final: p.is_final,
                nodes,
            };
            tokio::task::spawn_blocking(move || st.commit_metadata(&meta))
                .await
                .map_err(|e| Error::Internal(e.to_string()))??;
            metrics::gauge!(m::CHECKPOINT_BYTES).set(bytes as f64);
        }
        Ok(())
    }

    /// Deletes complete checkpoints beyond the retention count and incomplete ones older
    /// than `completed` (left by failed attempts or crashes; they can never be restored).
    fn retain(&self, completed: CheckpointId) {
        let Some(st) = &self.storage else { return };
        if let (Ok(all), Ok(complete)) = (st.list_all(), st.list_complete()) {
            for id in all
                .iter()
                .filter(|id| **id < completed && !complete.contains(id))
            {
                if let Err(e) = st.discard(*id) {
                    tracing::warn!(checkpoint = id, error = %e, "could not delete incomplete checkpoint");
                }
            }
        }
        match st.list_complete() {
            Ok(ids) if ids.len() > self.config.retained_checkpoints => {
                for id in &ids[..ids.len() - self.config.retained_checkpoints] {
                    if let Err(e) = st.discard(*id) {
                        tracing::warn!(checkpoint = id, error = %e, "could not delete old checkpoint");
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not list checkpoints"),
        }
    }

    /// Runs until the final checkpoint completed (Ok) or failed (Err).
    pub(crate) async fn run(mut self, sources: usize) -> Result<CoordinatorStats> {
        let mut stats = CoordinatorStats::default();
        let mut pending: Option<Pending> = None;
        // a stop requested while the job was being set up (before this receiver could see
        // a change) is taken now
        let mut stopping = *self.stop_rx.borrow_and_update();
        if stopping {
            tracing::info!("stop requested during set-up: taking a final checkpoint");
        }
        let mut exhausted = 0usize;
        let mut stop_open = true;
        let interval = self.config.checkpoint_interval;
        let mut next_tick = interval.map(|i| tokio::time::Instant::now() + i);
        loop {
            if stopping && pending.is_none() {
                pending = Some(self.trigger(true).await);
            }
            let deadline = pending.as_ref().map(|p| {
                tokio::time::Instant::from_std(p.started + self.config.checkpoint_timeout)
            });
            let tick_at = if pending.is_none() && !stopping {
                next_tick
            } else {
                None
            };
            tokio::select! {
                _ = async { tokio::time::sleep_until(tick_at.unwrap_or_else(tokio::time::Instant::now)).await }, if tick_at.is_some() => {
                    next_tick = interval.map(|i| tokio::time::Instant::now() + i);
                    pending = Some(self.trigger(false).await);
                }
                _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() => {
                    if let Some(p) = pending.take() {
                        let reason = format!("timed out after {} ms (checkpoint_timeout)", self.config.checkpoint_timeout.as_millis());
                        self.fail(&p, &reason, &mut stats)?;
                    }
                }
                r = self.stop_rx.changed(), if stop_open => {
                    match r {
                        Ok(()) => if *self.stop_rx.borrow() {
                            tracing::info!("stop requested: taking a final checkpoint");
                            stopping = true;
                        },
                        Err(_) => stop_open = false,
                    }
                }
                msg = self.ack_rx.recv() => {
                    let Some(msg) = msg else {
                        return Err(Error::Internal(ALL_SUBTASKS_GONE.into()));
                    };
                    match msg {
                        CoordinatorMsg::SourceExhausted => {
                            exhausted += 1;
                            if exhausted >= sources {
                                stopping = true;
                            }
                        }
                        CoordinatorMsg::Ack { checkpoint, node_uid, subtask, result } => {
                            let Some(p) = pending.as_mut().filter(|p| p.id == checkpoint) else {
                                continue;
                            };
                            p.remaining -= 1;
                            tracing::debug!(checkpoint, node = %node_uid, subtask, ms = p.started.elapsed().as_millis() as u64, remaining = p.remaining, "checkpoint acknowledged");
                            match result {
                                Ok(Some(f)) => p.files.entry(node_uid).or_default().push(f),
                                Ok(None) => {}
                                Err(e) => { p.failure.get_or_insert(format!("{node_uid}#{subtask}: {e}")); }
                            }
                            if p.remaining == 0 {
                                let mut p = pending.take().expect("pending checked above");
                                let outcome = match p.failure.clone() {
                                    Some(f) => Err(f),
                                    None => self.complete(&mut p).await.map_err(|e| e.to_string()),
                                };
                                match outcome {
                                    Err(reason) => self.fail(&p, &reason, &mut stats)?,
                                    Ok(()) => {
                                        if let Some(hook) = self.config.completion_hook.clone() {
                                            let t0 = Instant::now();
                                            if let Err(e) = hook.seal(p.id).await {
                                                metrics::counter!(m::CHECKPOINTS_FAILED).increment(1);
                                                tracing::error!(checkpoint = p.id, error = %e, "sealing the checkpoint failed: the job stops");
                                                return Err(Error::CheckpointFailed { checkpoint: p.id, reason: format!("sealing failed: {e}") });
                                            }
                                            metrics::histogram!(m::CHECKPOINT_SEAL_SECONDS).record(t0.elapsed().as_secs_f64());
                                        }
                                        let took = p.started.elapsed();
                                        metrics::histogram!(m::CHECKPOINT_SECONDS).record(took.as_secs_f64());
                                        metrics::counter!(m::CHECKPOINTS_COMPLETED).increment(1);
                                        tracing::info!(checkpoint = p.id, ms = took.as_millis() as u64, "checkpoint complete");
                                        stats.completed += 1;
                                        stats.failed_in_a_row = 0;
                                        metrics::gauge!(m::CHECKPOINTS_FAILED_IN_A_ROW).set(0.0);
                                        metrics::gauge!(m::LAST_CHECKPOINT_TIME).set(unix_seconds());
                                        stats.last = Some(p.id);
                                        self.notify(CheckpointEvent::Completed(p.id));
                                        self.progress_tx.send_modify(|s| s.completed = p.id);
                                        self.retain(p.id);
                                        if p.is_final {
                                            return Ok(stats);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Seconds since the Unix epoch, for the last-checkpoint timestamp gauge.
fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
