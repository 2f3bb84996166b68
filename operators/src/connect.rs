//! `connect`: two streams keyed by the same key type into one keyed co-process function with
//! shared keyed state (e.g. joins, enrichment). Barriers are aligned over both inputs.

use onceflow_runtime::state::{KeyedStateStore, OperatorSnapshot, RestoredState};
use onceflow_runtime::{CheckpointId, Data, DataStream, Key, Operator, Result, TwoInputs};

use crate::key_by::{key_partitioning, store_for, KeyFn};
use crate::process::KeyedContext;
use std::sync::Arc;

/// Two streams to be processed together.
pub struct ConnectedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

/// Connects streams.
pub trait Connect<A> {
    /// Pairs this stream with `other`.
    fn connect<B: Data>(&self, other: &DataStream<B>) -> ConnectedStreams<A, B>;
}

impl<A: Data> Connect<A> for DataStream<A> {
    fn connect<B: Data>(&self, other: &DataStream<B>) -> ConnectedStreams<A, B> {
        ConnectedStreams {
            first: self.clone(),
            second: other.clone(),
        }
    }
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Keys both inputs by the same key type.
    pub fn key_by<K: Key>(
        self,
        first_key: impl Fn(&A) -> K + Send + Sync + 'static,
        second_key: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> KeyedConnectedStreams<K, A, B> {
        KeyedConnectedStreams {
            first: self.first,
            second: self.second,
            first_key: Arc::new(first_key),
            second_key: Arc::new(second_key),
        }
    }
}

/// Two streams keyed by the same key type.
pub struct KeyedConnectedStreams<K, A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
    first_key: KeyFn<A, K>,
    second_key: KeyFn<B, K>,
}

/// A keyed function over two inputs sharing keyed state.
pub trait KeyedCoProcessFunction<K, A, B, O>: Send + 'static {
    /// A record of the first input.
    fn process_first(&mut self, record: A, ctx: &mut KeyedContext<'_, K, O>) -> Result<()>;
    /// A record of the second input.
    fn process_second(&mut self, record: B, ctx: &mut KeyedContext<'_, K, O>) -> Result<()>;
}

struct CoProcessOperator<K, A, B, F> {
    first_key: KeyFn<A, K>,
    second_key: KeyFn<B, K>,
    f: F,
    store: KeyedStateStore<K>,
}

impl<K: Key, A: Data, B: Data, O: Data, F: KeyedCoProcessFunction<K, A, B, O>>
    Operator<TwoInputs<A, B>, O> for CoProcessOperator<K, A, B, F>
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)
    }

    fn process(&mut self, record: TwoInputs<A, B>, out: &mut Vec<O>) -> Result<()> {
        match record {
            TwoInputs::First(a) => {
                let key = (self.first_key)(&a);
                let mut ctx = KeyedContext::new(&mut self.store, &key, out)?;
                self.f.process_first(a, &mut ctx)
            }
            TwoInputs::Second(b) => {
                let key = (self.second_key)(&b);
                let mut ctx = KeyedContext::new(&mut self.store, &key, out)?;
                self.f.process_second(b, &mut ctx)
            }
        }
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<OperatorSnapshot> {
        Ok(OperatorSnapshot {
            key_groups: self.store.snapshot()?,
            operator_state: None,
        })
    }

    fn state_entries(&self) -> usize {
        self.store.entries()
    }

    fn track_state_changes(&mut self) {
        self.store.track_changes();
    }

    fn take_state_changes(&mut self) -> Result<Option<Vec<onceflow_runtime::state::StateChange>>> {
        self.store.take_changes().map(Some)
    }
}

impl<K: Key, A: Data, B: Data> KeyedConnectedStreams<K, A, B> {
    /// Runs `f` over both inputs; `f` is cloned for every subtask.
    pub fn process<O: Data, F: KeyedCoProcessFunction<K, A, B, O> + Clone + Sync>(
        &self,
        name: &str,
        f: F,
    ) -> DataStream<O> {
        let max = self.first.max_parallelism();
        let (k1, k2) = (self.first_key.clone(), self.second_key.clone());
        self.first.add_two_input_operator(
            &self.second,
            name,
            key_partitioning(self.first_key.clone(), max),
            key_partitioning(self.second_key.clone(), max),
            move |info| {
                Ok(CoProcessOperator {
                    first_key: k1.clone(),
                    second_key: k2.clone(),
                    f: f.clone(),
                    store: store_for(info),
                })
            },
        )
    }
}
