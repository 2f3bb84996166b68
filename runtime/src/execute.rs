//! Running a job: restore, wire channels, set up every subtask (sinks recover here, before
//! any record flows), then run all subtasks and the checkpoint coordinator on tokio.

use std::any::Any;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::checkpoint::coordinator::{Coordinator, ALL_SUBTASKS_GONE};
use crate::checkpoint::{load_for_restore, CheckpointStorage, LoadedCheckpoint, LocalDirStorage};
use crate::connector::SubtaskInfo;
use crate::element::CheckpointId;
use crate::graph::{NodeKind, RestoredSubtask, SubtaskRun, SubtaskSetup};
use crate::keygroup::KeyGroupRange;
use crate::stream::StreamEnvironment;
use crate::task::{JobProgress, TaskServices};
use crate::{Error, Result};

/// What a finished job reports.
#[derive(Debug, Clone, Default)]
pub struct JobResult {
    /// The checkpoint the job restored from, if any.
    pub restored_from: Option<CheckpointId>,
    /// Checkpoints skipped at restore because they did not verify (each names the bad file).
    pub restore_errors: Vec<String>,
    /// Checkpoints completed by this run (including the final one).
    pub completed_checkpoints: u64,
    /// Checkpoints that failed in this run.
    pub failed_checkpoints: u64,
    /// The last completed checkpoint.
    pub last_checkpoint: Option<CheckpointId>,
}

fn restored_for(
    loaded: &LoadedCheckpoint,
    uid: &str,
    kind: NodeKind,
    range: KeyGroupRange,
    index: usize,
) -> Option<RestoredSubtask> {
    let snaps = loaded.nodes.get(uid)?;
    let mut r = RestoredSubtask::default();
    let mut event_times = std::collections::BTreeMap::<u32, i64>::new();
    for s in snaps {
        for (split, t) in &s.event_times {
            let e = event_times.entry(*split).or_insert(*t);
            *e = (*e).max(*t);
        }
        r.key_groups.extend(
            s.key_groups
                .iter()
                .filter(|k| range.contains(k.key_group))
                .cloned(),
        );
        if let Some(op) = &s.operator_state {
            r.operator_states.push(op.clone());
        }
        // all pending commits go to sink subtask 0, which recovers them before data flows
        if kind == NodeKind::Sink && index == 0 {
            r.pending_commits.extend(s.pending_commits.iter().cloned());
        }
    }
    r.event_times = event_times.into_iter().collect();
    Some(r)
}

/// SIGTERM and SIGINT (Ctrl-C) stop the job with a final checkpoint; a second SIGINT exits
/// the process at once (exit code 130, as a shell reports an interrupted program), for when
/// the final checkpoint cannot finish (e.g. the external system is down).
fn spawn_stop_on_signals(stop: Arc<watch::Sender<bool>>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let install = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| Error::Internal(format!("cannot install {name} handler: {e}")))
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            Some(()) = term.recv() => {
                tracing::info!("SIGTERM: stopping with a final checkpoint");
            }
            Some(()) = int.recv() => {
                tracing::info!("SIGINT: stopping with a final checkpoint (press Ctrl-C again to exit at once)");
            }
        }
        stop.send_replace(true);
        if int.recv().await.is_some() {
            eprintln!("second SIGINT: exiting at once, without a final checkpoint");
            std::process::exit(130);
        }
    });
    Ok(())
}

impl StreamEnvironment {
    /// Runs the job on a new tokio runtime and blocks until it ends.
    pub fn execute_blocking(self) -> Result<JobResult> {
        let threads = self.graph.borrow().config.worker_threads;
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.enable_all();
        if threads > 0 {
            b.worker_threads(threads);
        }
        let rt = b
            .build()
            .map_err(|e| Error::Internal(format!("cannot start tokio runtime: {e}")))?;
        rt.block_on(self.execute())
    }

    /// Runs the job until its sources are exhausted (or it is stopped) and the final
    /// checkpoint is committed.
    pub async fn execute(self) -> Result<JobResult> {
        let (config, nodes, edges) = {
            let mut g = self.graph.borrow_mut();
            (
                g.config.clone(),
                std::mem::take(&mut g.nodes),
                std::mem::take(&mut g.edges),
            )
        };
        config.validate()?;
        if !nodes.iter().any(|n| n.kind == NodeKind::Source) {
            return Err(Error::InvalidJob("the job has no source".into()));
        }
        for n in &nodes {
            if n.parallelism == 0 || n.parallelism > config.max_parallelism {
                return Err(Error::InvalidJob(format!(
                    "`{}` has parallelism {}, allowed 1..={}",
                    n.name, n.parallelism, config.max_parallelism
                )));
            }
        }
        let max = config.max_parallelism;
        // before anything is set up: a job reports that it started while its sinks recover
        // (below), and a SIGTERM from then on must stop it with a final checkpoint, not kill
        // it; a stop requested during the set-up is taken by the coordinator when it starts
        if config.stop_on_sigterm {
            spawn_stop_on_signals(self.stop.clone())?;
        }

        let storage: Option<Arc<dyn CheckpointStorage>> = match &config.checkpoint_dir {
            Some(d) => Some(Arc::new(LocalDirStorage::new(d)?)),
            None => None,
        };
        let (loaded, restore_errors) = match &storage {
            Some(s) => load_for_restore(
                s.as_ref(),
                config.restore,
                max,
                config.restore_older_if_corrupt,
            )?,
            None => (None, Vec::new()),
        };
        let restored_id = loaded.as_ref().map(|l| l.id());
        if let Some(l) = &loaded {
            tracing::info!(checkpoint = l.id(), "restoring");
            for uid in l.nodes.keys() {
                if !nodes.iter().any(|n| &n.uid == uid) {
                    tracing::warn!(uid, "checkpoint has state for a node the job no longer has");
                }
            }
        }
        let highest = match &storage {
            Some(s) => s.highest_id()?,
            None => 0,
        };
        let first_id = highest.max(restored_id.unwrap_or(0)) + 1;

        // channels
        let mut inputs: Vec<Vec<Vec<Box<dyn Any + Send>>>> = nodes
            .iter()
            .map(|n| (0..n.parallelism).map(|_| Vec::new()).collect())
            .collect();
        let mut outputs: Vec<Vec<Vec<Box<dyn Any + Send>>>> = nodes
            .iter()
            .map(|n| (0..n.parallelism).map(|_| Vec::new()).collect())
            .collect();
        for e in &edges {
            let (writers, receivers) = e.factory.build(
                nodes[e.from].parallelism,
                nodes[e.to].parallelism,
                max,
                config.channel_capacity,
            )?;
            for (i, w) in writers.into_iter().enumerate() {
                outputs[e.from][i].push(w);
            }
            for (j, rs) in receivers.into_iter().enumerate() {
                inputs[e.to][j].extend(rs);
            }
        }

        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let (progress_tx, progress_rx) = watch::channel(JobProgress {
            completed: restored_id.unwrap_or(0),
            failed: false,
        });
        let progress_tx = Arc::new(progress_tx);
        let services = Arc::new(TaskServices {
            ack_tx,
            progress: progress_rx,
            storage: storage.clone(),
            state_inline_threshold: config.state_inline_threshold,
            batch_size: config.batch_size,
            externally_sealed: config.completion_hook.is_some(),
            changelog: config.state_changelog.clone(),
        });

        // set up every subtask; sinks recover here, before anything runs
        let mut runs: Vec<(String, SubtaskRun)> = Vec::new();
        let mut source_controls = Vec::new();
        for (ni, node) in nodes.iter().enumerate() {
            let node_inputs = std::mem::take(&mut inputs[ni]);
            let node_outputs = std::mem::take(&mut outputs[ni]);
            let mut setups = Vec::with_capacity(node.parallelism);
            for (index, (ins, outs)) in node_inputs.into_iter().zip(node_outputs).enumerate() {
                let range = KeyGroupRange::for_subtask(max, node.parallelism, index);
                let control = if node.kind == NodeKind::Source {
                    let (tx, rx) = mpsc::unbounded_channel();
                    source_controls.push(tx);
                    Some(rx)
                } else {
                    None
                };
                let setup = SubtaskSetup {
                    info: SubtaskInfo {
                        job_name: config.name.clone(),
                        operator: node.name.clone(),
                        node_uid: node.uid.clone(),
                        index,
                        parallelism: node.parallelism,
                        max_parallelism: max,
                        restored_checkpoint: restored_id.unwrap_or(0),
                    },
                    inputs: ins,
                    outputs: outs,
                    restored: loaded
                        .as_ref()
                        .and_then(|l| restored_for(l, &node.uid, node.kind, range, index)),
                    services: services.clone(),
                    control,
                };
                setups.push(setup);
            }
            // Subtask 0 first: a sink's subtask 0 recovers the previous run's pre-commits and
            // fences its transactional ids before any other subtask may start a producer.
            // The others then together: each may wait on I/O (a transactional producer's
            // set-up takes 100-200 ms), and a job's start-up should not grow with its
            // parallelism.
            let mut setups = setups.into_iter();
            if let Some(first) = setups.next() {
                runs.push((
                    format!("{}#0", node.name),
                    node.runner.prepare(first).await?,
                ));
            }
            let rest =
                futures::future::try_join_all(setups.map(|s| node.runner.prepare(s))).await?;
            for (i, run) in rest.into_iter().enumerate() {
                runs.push((format!("{}#{}", node.name, i + 1), run));
            }
        }
        drop(services);

        let sources = source_controls.len();
        let coordinator = Coordinator {
            config: config.clone(),
            storage,
            nodes: nodes
                .iter()
                .map(|n| (n.uid.clone(), n.parallelism))
                .collect(),
            source_controls,
            ack_rx,
            progress_tx: progress_tx.clone(),
            stop_rx: self.stop.subscribe(),
            next_id: first_id,
        };
        let mut tasks = JoinSet::new();
        for (name, run) in runs {
            let span = tracing::info_span!("subtask", job = %config.name, subtask = %name);
            tasks.spawn(async move { run.await.map_err(|e| (name, e)) }.instrument(span));
        }
        let mut coord = tokio::spawn(coordinator.run(sources));
        let mut coord_done = None;
        let fail = |e: Error, tasks: &mut JoinSet<_>, coord: &tokio::task::JoinHandle<_>| {
            progress_tx.send_modify(|p| p.failed = true);
            tasks.abort_all();
            coord.abort();
            Err(e)
        };
        loop {
            tokio::select! {
                r = &mut coord, if coord_done.is_none() => {
                    match r {
                        Ok(Ok(stats)) => coord_done = Some(stats),
                        Ok(Err(e)) => {
                            // the coordinator only saw the subtasks go: their error is the cause
                            let cause = match &e {
                                Error::Internal(m) if m == ALL_SUBTASKS_GONE => {
                                    subtask_failure(&mut tasks).await.unwrap_or(e)
                                }
                                _ => e,
                            };
                            return fail(cause, &mut tasks, &coord);
                        }
                        Err(e) => return fail(Error::Internal(format!("coordinator panicked: {e}")), &mut tasks, &coord),
                    }
                }
                t = tasks.join_next() => {
                    match t {
                        None => break,
                        Some(Ok(Ok(()))) => {}
                        Some(Ok(Err((name, e)))) => {
                            // a closed channel is mostly the echo of the coordinator's failure
                            // (e.g. a failed seal): report the cause, not the echo
                            // or of another subtask's failure: whichever reports a cause first
                            if matches!(e, Error::ChannelClosed(_)) && coord_done.is_none() {
                                // (when no other subtask has a cause, the coordinator's answer
                                // decides: the pattern below disables that branch)
                                let cause = tokio::select! {
                                    r = tokio::time::timeout(ECHO_WAIT, &mut coord) => match r {
                                        Ok(Ok(Err(Error::Internal(m)))) if m == ALL_SUBTASKS_GONE => None,
                                        Ok(Ok(Err(cause))) => Some(cause),
                                        _ => None,
                                    },
                                    Some(f) = subtask_failure(&mut tasks) => Some(f),
                                };
                                // the coordinator can answer first that every subtask went
                                // while the failing one's result still waits in the set:
                                // look there before reporting the echo
                                let cause = match cause {
                                    None if coord.is_finished() => subtask_failure(&mut tasks).await,
                                    found => found,
                                };
                                if let Some(cause) = cause {
                                    return fail(cause, &mut tasks, &coord);
                                }
                            }
                            tracing::error!(subtask = %name, error = %e, "subtask failed; the job fails");
                            return fail(e, &mut tasks, &coord);
                        }
                        Some(Err(e)) => return fail(Error::Internal(format!("a subtask panicked: {e}")), &mut tasks, &coord),
                    }
                }
            }
        }
        let stats = match coord_done {
            Some(s) => s,
            None => match coord.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(Error::Internal(format!("coordinator panicked: {e}"))),
            },
        };
        Ok(JobResult {
            restored_from: restored_id,
            restore_errors,
            completed_checkpoints: stats.completed,
            failed_checkpoints: stats.failed,
            last_checkpoint: stats.last,
        })
    }
}

/// How long a failing job waits for the cause of a failure when it first sees an echo of it
/// (a closed channel, or the coordinator seeing every subtask go). The parties are already
/// ending, so the wait is short in practice; the bound is generous so that a loaded machine
/// still reports the cause, and only guards against a subtask that never ends.
const ECHO_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The first error a subtask failed with (a panic included), skipping subtasks that ended
/// well and closed channels (echoes of another failure); waits at most [`ECHO_WAIT`], since
/// the subtasks are ending when this is asked.
async fn subtask_failure<N: std::fmt::Display + Send + 'static>(
    tasks: &mut JoinSet<std::result::Result<(), (N, Error)>>,
) -> Option<Error> {
    let first = async {
        while let Some(t) = tasks.join_next().await {
            match t {
                Ok(Err((name, e))) if !matches!(e, Error::ChannelClosed(_)) => {
                    tracing::error!(subtask = %name, error = %e, "subtask failed; the job fails");
                    return Some(e);
                }
                Err(e) => return Some(Error::Internal(format!("a subtask panicked: {e}"))),
                _ => {}
            }
        }
        None
    };
    tokio::time::timeout(ECHO_WAIT, first).await.ok().flatten()
}
