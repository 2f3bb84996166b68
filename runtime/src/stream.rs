//! The typed builder API: a [`StreamEnvironment`] creates sources, a [`DataStream`] adds
//! operators and sinks. Operators themselves (map, key_by, reduce, ...) are extension traits
//! in `onceflow-operators` built on [`DataStream::add_operator`].

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::JobConfig;
use crate::connector::{SinkFactory, SourceFactory, SubtaskInfo};
use crate::element::{Data, TwoInputs};
use crate::graph::{
    direct, first, second, Edge, Node, NodeKind, OperatorRunner, SinkRunner, SourceRunner,
    TypedEdge,
};
use crate::operator::Operator;
use crate::output::Partitioning;
use crate::Result;

pub(crate) struct Graph {
    pub config: JobConfig,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

/// Requests a running job to stop with a final checkpoint.
#[derive(Clone)]
pub struct StopHandle(Arc<watch::Sender<bool>>);

impl StopHandle {
    /// Asks the job to take a final checkpoint, commit and end.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// How a keyed operator's key is routed to a task outside this process, when its state is
/// partitioned over many processes (a scaled-out job's changelog partitions): maps a key's
/// state encoding (`state::format`) to the bytes whose hash names the key's task, e.g. the
/// key's Kafka key bytes. Within a process keys still go to subtasks by key group.
pub type KeyRoute = Arc<dyn Fn(&[u8]) -> crate::Result<Vec<u8>> + Send + Sync>;

/// Builds a job; [`StreamEnvironment::execute`] runs it.
#[derive(Clone)]
pub struct StreamEnvironment {
    pub(crate) graph: Rc<RefCell<Graph>>,
    pub(crate) stop: Arc<watch::Sender<bool>>,
}

impl StreamEnvironment {
    /// A new, empty job.
    pub fn new(config: JobConfig) -> Self {
        let (stop, _) = watch::channel(false);
        StreamEnvironment {
            graph: Rc::new(RefCell::new(Graph {
                config,
                nodes: Vec::new(),
                edges: Vec::new(),
            })),
            stop: Arc::new(stop),
        }
    }

    /// The job's configuration.
    pub fn config(&self) -> JobConfig {
        self.graph.borrow().config.clone()
    }

    /// A handle that stops the job (with a final checkpoint) from another task or thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    fn add_node(
        &self,
        name: &str,
        kind: NodeKind,
        runner: Arc<dyn crate::graph::NodeRunner>,
    ) -> usize {
        let mut g = self.graph.borrow_mut();
        let id = g.nodes.len();
        let parallelism = g.config.parallelism;
        let clean: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        g.nodes.push(Node {
            name: name.to_string(),
            uid: format!("n{id:02}-{clean}"),
            parallelism,
            kind,
            runner,
            key_route: None,
            keyed_input: false,
        });
        id
    }

    /// Uses `writer` for the keyed state changelog (as `JobConfig::state_changelog`), set
    /// after the pipeline is built, when the keyed operators and their
    /// [`key routes`](StreamEnvironment::key_routes) are known.
    pub fn set_state_changelog(&self, writer: Arc<dyn crate::state::ChangelogWriter>) {
        self.graph.borrow_mut().config.state_changelog = Some(writer);
    }

    /// The keyed operators whose key stream declared a [`KeyRoute`], by node uid.
    pub fn key_routes(&self) -> Vec<(String, KeyRoute)> {
        self.graph
            .borrow()
            .nodes
            .iter()
            .filter_map(|n| n.key_route.clone().map(|r| (n.uid.clone(), r)))
            .collect()
    }

    /// The names of the keyed operators (a keyed input edge) whose key stream declared no
    /// [`KeyRoute`]: a job whose keyed state must live outside the process (a scaled-out
    /// job's changelog) cannot place their state and refuses them.
    pub fn keyed_operators_without_route(&self) -> Vec<String> {
        self.graph
            .borrow()
            .nodes
            .iter()
            .filter(|n| n.keyed_input && n.key_route.is_none())
            .map(|n| n.name.clone())
            .collect()
    }

    /// Adds a source; each subtask is created by `factory`.
    pub fn source<T: Data, F: SourceFactory<T>>(&self, name: &str, factory: F) -> DataStream<T> {
        let runner = SourceRunner::<T, F> {
            factory: Arc::new(factory),
            _t: PhantomData,
        };
        let id = self.add_node(name, NodeKind::Source, Arc::new(runner));
        DataStream {
            env: self.clone(),
            producers: vec![id],
            _t: PhantomData,
        }
    }
}

/// A typed stream: the output of one or more (after `union`) nodes.
pub struct DataStream<T> {
    env: StreamEnvironment,
    producers: Vec<usize>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream {
            env: self.env.clone(),
            producers: self.producers.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Data> DataStream<T> {
    /// The environment this stream belongs to.
    pub fn env(&self) -> &StreamEnvironment {
        &self.env
    }

    /// Number of key groups of the job.
    pub fn max_parallelism(&self) -> usize {
        self.env.graph.borrow().config.max_parallelism
    }

    /// Sets the parallelism of the node(s) producing this stream.
    pub fn set_parallelism(self, parallelism: usize) -> Self {
        {
            let mut g = self.env.graph.borrow_mut();
            for p in &self.producers {
                g.nodes[*p].parallelism = parallelism;
            }
        }
        self
    }

    /// Declares how the node(s) producing this stream (keyed operators) route a key to a
    /// task outside this process: `route` maps a key's state encoding to the bytes that
    /// decide its task (e.g. its Kafka key bytes). See [`KeyRoute`].
    pub fn set_key_route(&self, route: KeyRoute) {
        let mut g = self.env.graph.borrow_mut();
        for p in &self.producers {
            g.nodes[*p].key_route = Some(route.clone());
        }
    }

    /// The uids of the node(s) producing this stream.
    pub fn node_uids(&self) -> Vec<String> {
        let g = self.env.graph.borrow();
        self.producers
            .iter()
            .map(|p| g.nodes[*p].uid.clone())
            .collect()
    }

    /// Merges two streams of the same type (no extra task: consumers read both).
    pub fn union(&self, other: &DataStream<T>) -> DataStream<T> {
        let mut producers = self.producers.clone();
        producers.extend(other.producers.iter().copied());
        DataStream {
            env: self.env.clone(),
            producers,
            _t: PhantomData,
        }
    }

    fn connect_input<In: Send + 'static>(
        &self,
        to: usize,
        partitioning: &Partitioning<T>,
        wrap: crate::graph::WrapFn<T, In>,
    ) {
        let mut g = self.env.graph.borrow_mut();
        if matches!(partitioning, Partitioning::KeyGroups(_)) {
            g.nodes[to].keyed_input = true;
        }
        for p in &self.producers {
            g.edges.push(Edge {
                from: *p,
                to,
                factory: Box::new(TypedEdge {
                    partitioning: partitioning.clone(),
                    wrap,
                }),
            });
        }
    }

    /// Adds a one-input operator; `factory` creates one instance per subtask.
    pub fn add_operator<Out: Data, Op: Operator<T, Out>>(
        &self,
        name: &str,
        partitioning: Partitioning<T>,
        factory: impl Fn(&SubtaskInfo) -> Result<Op> + Send + Sync + 'static,
    ) -> DataStream<Out> {
        let runner = OperatorRunner::<T, Out, Op> {
            factory: Arc::new(factory),
            _t: PhantomData,
        };
        let id = self
            .env
            .add_node(name, NodeKind::Operator, Arc::new(runner));
        self.connect_input(id, &partitioning, direct::<T>);
        DataStream {
            env: self.env.clone(),
            producers: vec![id],
            _t: PhantomData,
        }
    }

    /// Adds a two-input operator reading this stream as the first input and `other` as the
    /// second; barriers are aligned across both.
    pub fn add_two_input_operator<B: Data, Out: Data, Op: Operator<TwoInputs<T, B>, Out>>(
        &self,
        other: &DataStream<B>,
        name: &str,
        first_partitioning: Partitioning<T>,
        second_partitioning: Partitioning<B>,
        factory: impl Fn(&SubtaskInfo) -> Result<Op> + Send + Sync + 'static,
    ) -> DataStream<Out> {
        let runner = OperatorRunner::<TwoInputs<T, B>, Out, Op> {
            factory: Arc::new(factory),
            _t: PhantomData,
        };
        let id = self
            .env
            .add_node(name, NodeKind::Operator, Arc::new(runner));
        self.connect_input(id, &first_partitioning, first::<T, B>);
        other.connect_input(id, &second_partitioning, second::<T, B>);
        DataStream {
            env: self.env.clone(),
            producers: vec![id],
            _t: PhantomData,
        }
    }

    /// Adds a sink with the job's default parallelism.
    pub fn sink<F: SinkFactory<T>>(&self, name: &str, factory: F) {
        let p = self.env.graph.borrow().config.parallelism;
        self.sink_with_parallelism(name, p, factory)
    }

    /// Adds a sink with the given parallelism.
    pub fn sink_with_parallelism<F: SinkFactory<T>>(
        &self,
        name: &str,
        parallelism: usize,
        factory: F,
    ) {
        let runner = SinkRunner::<T, F> {
            factory: Arc::new(factory),
            _t: PhantomData,
        };
        let id = self.env.add_node(name, NodeKind::Sink, Arc::new(runner));
        self.env.graph.borrow_mut().nodes[id].parallelism = parallelism;
        self.connect_input(id, &Partitioning::Auto, direct::<T>);
    }
}
