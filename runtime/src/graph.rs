//! The job graph: nodes (sources, operators, sinks) with their parallelism and typed edges.
//! Types are checked when the graph is built; at execution each node's runner and each
//! edge's factory restore the types behind `Any` boxes that were created for them.

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use crate::channel::{DirectReceiver, InputGate, InputReceiver, MappedReceiver};
use crate::connector::{Sink, SinkFactory, Source, SourceFactory, SubtaskInfo};
use crate::element::{CheckpointId, Data, StreamElement};
use crate::keygroup::KeyGroupRange;
use crate::operator::Operator;
use crate::output::{EdgeWriter, Output, Partitioning};
use crate::state::format::decode;
use crate::state::{KeyGroupSnapshot, RestoredState};
use crate::task::{SourceControl, TaskContext, TaskServices};
use crate::{Error, Result};

/// What kind of node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    Source,
    Operator,
    Sink,
}

/// State restored for one subtask, already re-sliced for its key-group range.
#[derive(Default)]
pub(crate) struct RestoredSubtask {
    pub key_groups: Vec<KeyGroupSnapshot>,
    pub operator_states: Vec<Vec<u8>>,
    pub pending_commits: Vec<(CheckpointId, Vec<u8>)>,
    /// (sources) The highest event time per split over every subtask of the previous run.
    pub event_times: Vec<(u32, i64)>,
}

/// Everything a node runner gets to set up one subtask.
pub(crate) struct SubtaskSetup {
    pub info: SubtaskInfo,
    pub inputs: Vec<Box<dyn Any + Send>>,
    pub outputs: Vec<Box<dyn Any + Send>>,
    pub restored: Option<RestoredSubtask>,
    pub services: Arc<TaskServices>,
    pub control: Option<mpsc::UnboundedReceiver<SourceControl>>,
}

/// The running part of a subtask, returned once it is set up.
pub(crate) type SubtaskRun = BoxFuture<'static, Result<()>>;

/// Creates and sets up the subtasks of one node.
pub(crate) trait NodeRunner: Send + Sync {
    /// Sets up a subtask (create, restore, recover) and returns its loop.
    fn prepare(&self, setup: SubtaskSetup) -> BoxFuture<'static, Result<SubtaskRun>>;
}

pub(crate) struct Node {
    pub name: String,
    pub uid: String,
    pub parallelism: usize,
    pub kind: NodeKind,
    pub runner: Arc<dyn NodeRunner>,
    /// A keyed operator's [`crate::KeyRoute`], if its key stream declared one.
    pub key_route: Option<crate::KeyRoute>,
    /// Whether an input edge of this node is keyed (its records arrive by key group).
    pub keyed_input: bool,
}

/// Builds the channels of one edge.
pub(crate) trait EdgeFactory: Send + Sync {
    /// Returns one writer per producer subtask and, per consumer subtask, its receivers.
    #[allow(clippy::type_complexity)]
    fn build(
        &self,
        producers: usize,
        consumers: usize,
        max_parallelism: usize,
        capacity: usize,
    ) -> Result<(Vec<Box<dyn Any + Send>>, Vec<Vec<Box<dyn Any + Send>>>)>;
}

pub(crate) struct Edge {
    pub from: usize,
    pub to: usize,
    pub factory: Box<dyn EdgeFactory>,
}

/// Wraps a typed receiver into the consumer's input type.
pub(crate) type WrapFn<T, In> = fn(mpsc::Receiver<StreamElement<T>>) -> Box<dyn InputReceiver<In>>;

pub(crate) struct TypedEdge<T, In> {
    pub partitioning: Partitioning<T>,
    pub wrap: WrapFn<T, In>,
}

pub(crate) fn direct<T: Send + 'static>(
    rx: mpsc::Receiver<StreamElement<T>>,
) -> Box<dyn InputReceiver<T>> {
    Box::new(DirectReceiver(rx))
}

pub(crate) fn first<A: Send + 'static, B: Send + 'static>(
    rx: mpsc::Receiver<StreamElement<A>>,
) -> Box<dyn InputReceiver<crate::TwoInputs<A, B>>> {
    Box::new(MappedReceiver::new(rx, crate::TwoInputs::First))
}

pub(crate) fn second<A: Send + 'static, B: Send + 'static>(
    rx: mpsc::Receiver<StreamElement<B>>,
) -> Box<dyn InputReceiver<crate::TwoInputs<A, B>>> {
    Box::new(MappedReceiver::new(rx, crate::TwoInputs::Second))
}

impl<T: Data, In: Send + 'static> EdgeFactory for TypedEdge<T, In> {
    fn build(
        &self,
        producers: usize,
        consumers: usize,
        max_parallelism: usize,
        capacity: usize,
    ) -> Result<(Vec<Box<dyn Any + Send>>, Vec<Vec<Box<dyn Any + Send>>>)> {
        let forward = match &self.partitioning {
            Partitioning::Forward if producers != consumers => {
                return Err(Error::InvalidJob(format!(
                    "forward edge between parallelism {producers} and {consumers}"
                )))
            }
            Partitioning::Forward => true,
            Partitioning::Auto => producers == consumers,
            _ => false,
        };
        let mut writers: Vec<Box<dyn Any + Send>> = Vec::with_capacity(producers);
        let mut receivers: Vec<Vec<Box<dyn Any + Send>>> =
            (0..consumers).map(|_| Vec::new()).collect();
        if forward {
            for rx_list in receivers.iter_mut() {
                let (tx, rx) = mpsc::channel(capacity);
                writers.push(Box::new(EdgeWriter::new(
                    &Partitioning::Forward,
                    vec![tx],
                    max_parallelism,
                )));
                rx_list.push(Box::new((self.wrap)(rx)));
            }
        } else {
            for _ in 0..producers {
                let mut senders = Vec::with_capacity(consumers);
                for rx_list in receivers.iter_mut() {
                    let (tx, rx) = mpsc::channel(capacity);
                    senders.push(tx);
                    rx_list.push(Box::new((self.wrap)(rx)));
                }
                writers.push(Box::new(EdgeWriter::new(
                    &self.partitioning,
                    senders,
                    max_parallelism,
                )));
            }
        }
        Ok((writers, receivers))
    }
}

fn downcast_outputs<T: Data>(
    outputs: Vec<Box<dyn Any + Send>>,
    ctx: &TaskContext,
) -> Result<Output<T>> {
    let edges = outputs
        .into_iter()
        .map(|b| {
            b.downcast::<EdgeWriter<T>>()
                .map(|b| *b)
                .map_err(|_| Error::Internal("edge writer of the wrong type".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Output::new(
        edges,
        ctx.services.batch_size,
        ctx.metrics.records_out.clone(),
    ))
}

fn downcast_inputs<In: Send + 'static>(inputs: Vec<Box<dyn Any + Send>>) -> Result<InputGate<In>> {
    let rx = inputs
        .into_iter()
        .map(|b| {
            b.downcast::<Box<dyn InputReceiver<In>>>()
                .map(|b| *b)
                .map_err(|_| Error::Internal("input receiver of the wrong type".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    if rx.is_empty() {
        return Err(Error::InvalidJob("an operator has no input".into()));
    }
    Ok(InputGate::new(rx))
}

pub(crate) struct SourceRunner<T, F> {
    pub factory: Arc<F>,
    pub _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: Data, F: SourceFactory<T>> NodeRunner for SourceRunner<T, F> {
    fn prepare(&self, setup: SubtaskSetup) -> BoxFuture<'static, Result<SubtaskRun>> {
        let factory = self.factory.clone();
        Box::pin(async move {
            let ctx = TaskContext::new(setup.info, setup.services);
            let mut source = factory.create(&ctx.info).map_err(|e| ctx.op_err(e))?;
            if let Some(r) = setup.restored {
                let positions = r
                    .operator_states
                    .iter()
                    .map(|b| decode::<<F::Source as Source<T>>::Position>(b))
                    .collect::<Result<Vec<_>>>()?;
                source.restore(positions).map_err(|e| ctx.op_err(e))?;
                source.resume_event_times(r.event_times);
            }
            let output = downcast_outputs::<T>(setup.outputs, &ctx)?;
            let control = setup
                .control
                .ok_or_else(|| Error::Internal("source without control channel".into()))?;
            let run: SubtaskRun = Box::pin(crate::task::source::run_source(
                source, output, control, ctx,
            ));
            Ok(run)
        })
    }
}

/// Creates one operator instance per subtask.
pub type OperatorFactory<Op> = Arc<dyn Fn(&SubtaskInfo) -> Result<Op> + Send + Sync>;

pub(crate) struct OperatorRunner<In, Out, Op> {
    pub factory: OperatorFactory<Op>,
    pub _t: std::marker::PhantomData<fn() -> (In, Out)>,
}

impl<In: Data, Out: Data, Op: Operator<In, Out>> NodeRunner for OperatorRunner<In, Out, Op> {
    fn prepare(&self, setup: SubtaskSetup) -> BoxFuture<'static, Result<SubtaskRun>> {
        let factory = self.factory.clone();
        Box::pin(async move {
            let ctx = TaskContext::new(setup.info, setup.services);
            let mut op = factory(&ctx.info).map_err(|e| ctx.op_err(e))?;
            let mut restored = setup.restored.map(|r| RestoredState {
                key_groups: r.key_groups,
                operator_states: r.operator_states,
            });
            if let Some(changelog) = ctx.services.changelog.clone() {
                op.track_state_changes();
                let uid = ctx.info.node_uid.clone();
                let max = ctx.info.max_parallelism;
                let range = KeyGroupRange::for_subtask(max, ctx.info.parallelism, ctx.info.index);
                let from_changelog =
                    tokio::task::spawn_blocking(move || changelog.restore(&uid, range, max))
                        .await
                        .map_err(|e| Error::Internal(format!("changelog restore task: {e}")))?
                        .map_err(|e| ctx.op_err(e))?;
                if let Some(key_groups) = from_changelog {
                    let operator_states = restored.take().map(|r| r.operator_states);
                    restored = Some(RestoredState {
                        key_groups,
                        operator_states: operator_states.unwrap_or_default(),
                    });
                }
            }
            if let Some(r) = restored {
                op.restore(r).map_err(|e| ctx.op_err(e))?;
            }
            op.open(&ctx.info).map_err(|e| ctx.op_err(e))?;
            let gate = downcast_inputs::<In>(setup.inputs)?;
            let output = downcast_outputs::<Out>(setup.outputs, &ctx)?;
            let run: SubtaskRun =
                Box::pin(crate::task::operator::run_operator(op, gate, output, ctx));
            Ok(run)
        })
    }
}

pub(crate) struct SinkRunner<T, F> {
    pub factory: Arc<F>,
    pub _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: Data, F: SinkFactory<T>> NodeRunner for SinkRunner<T, F> {
    fn prepare(&self, setup: SubtaskSetup) -> BoxFuture<'static, Result<SubtaskRun>> {
        let factory = self.factory.clone();
        Box::pin(async move {
            let ctx = TaskContext::new(setup.info, setup.services);
            let mut sink = factory.create(&ctx.info).map_err(|e| ctx.op_err(e))?;
            let pending = match setup.restored {
                Some(r) => r
                    .pending_commits
                    .iter()
                    .map(|(_, b)| decode::<<F::Sink as Sink<T>>::Pending>(b))
                    .collect::<Result<Vec<_>>>()?,
                None => Vec::new(),
            };
            if !pending.is_empty() {
                tracing::info!(
                    subtask = ctx.info.index,
                    count = pending.len(),
                    "sink recovering pending commits"
                );
            }
            sink.recover(pending).await.map_err(|e| ctx.op_err(e))?;
            let gate = downcast_inputs::<T>(setup.inputs)?;
            let run: SubtaskRun = Box::pin(crate::task::sink::run_sink(sink, gate, ctx));
            Ok(run)
        })
    }
}
