//! Keyed `aggregate`: an accumulator per key (create, add, result), emitting the result for
//! every record.

use std::sync::Arc;

use onceflow_runtime::state::{KeyedStateStore, OperatorSnapshot, RestoredState};
use onceflow_runtime::{CheckpointId, Data, DataStream, Key, Operator, Result};

use crate::key_by::{store_for, KeyFn, KeyedStream};

const STATE: &str = "aggregate";

struct AggregateOperator<K, T, A, I, F, R> {
    key_fn: KeyFn<T, K>,
    init: Arc<I>,
    add: Arc<F>,
    result: Arc<R>,
    store: KeyedStateStore<K>,
    _a: std::marker::PhantomData<fn() -> A>,
}

impl<K, T, A, O, I, F, R> Operator<T, O> for AggregateOperator<K, T, A, I, F, R>
where
    K: Key,
    T: Data,
    A: Data,
    I: Fn() -> A + Send + Sync + 'static,
    F: Fn(&mut A, T) + Send + Sync + 'static,
    R: Fn(&K, &A) -> O + Send + Sync + 'static,
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)
    }

    fn process(&mut self, record: T, out: &mut Vec<O>) -> Result<()> {
        let key = (self.key_fn)(&record);
        let g = self.store.group_index(&key)?;
        let map = self.store.table::<A>(STATE)?.key_mut(g, &key);
        let acc = map.entry(key.clone()).or_insert_with(|| (self.init)());
        (self.add)(acc, record);
        out.push((self.result)(&key, acc));
        Ok(())
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

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Aggregates per key: `init()` creates a key's accumulator, `add` folds a record in,
    /// `result` maps the accumulator to the emitted record.
    pub fn aggregate<A, O, I, F, R>(&self, init: I, add: F, result: R) -> DataStream<O>
    where
        A: Data,
        O: Data,
        I: Fn() -> A + Send + Sync + 'static,
        F: Fn(&mut A, T) + Send + Sync + 'static,
        R: Fn(&K, &A) -> O + Send + Sync + 'static,
    {
        let (init, add, result) = (Arc::new(init), Arc::new(add), Arc::new(result));
        let key_fn = self.key_fn.clone();
        self.add_keyed_operator("aggregate", move |info| {
            Ok(AggregateOperator {
                key_fn: key_fn.clone(),
                init: init.clone(),
                add: add.clone(),
                result: result.clone(),
                store: store_for(info),
                _a: std::marker::PhantomData,
            })
        })
    }
}
