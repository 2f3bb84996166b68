//! Keyed `process`: a user function per record with the record's key, keyed state handles
//! (value, map, list) and an output.

use std::collections::HashMap;

use onceflow_runtime::state::{
    KeyedStateStore, ListState, MapState, OperatorSnapshot, RestoredState, ValueState,
};
use onceflow_runtime::{CheckpointId, Data, DataStream, Key, Operator, Result};

use crate::key_by::{store_for, KeyFn, KeyedStream};

/// What a keyed function sees for one record: its key, keyed state and the output.
pub struct KeyedContext<'a, K, O> {
    store: &'a mut KeyedStateStore<K>,
    key: &'a K,
    group: usize,
    out: &'a mut Vec<O>,
}

impl<'a, K: Key, O> KeyedContext<'a, K, O> {
    pub(crate) fn new(
        store: &'a mut KeyedStateStore<K>,
        key: &'a K,
        out: &'a mut Vec<O>,
    ) -> Result<Self> {
        let group = store.group_index(key)?;
        Ok(KeyedContext {
            store,
            key,
            group,
            out,
        })
    }

    /// The current key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// Emits a record.
    pub fn emit(&mut self, record: O) {
        self.out.push(record);
    }

    /// The value state `name` of the current key.
    pub fn value<V: Data>(&mut self, name: &str) -> Result<ValueState<'_, K, V>> {
        let t = self.store.table::<V>(name)?;
        Ok(ValueState::new(t, self.group, self.key))
    }

    /// The map state `name` of the current key.
    pub fn map<MK: Key, MV: Data>(&mut self, name: &str) -> Result<MapState<'_, K, MK, MV>> {
        let t = self.store.table::<HashMap<MK, MV>>(name)?;
        Ok(MapState::new(t, self.group, self.key))
    }

    /// The list state `name` of the current key.
    pub fn list<V: Data>(&mut self, name: &str) -> Result<ListState<'_, K, V>> {
        let t = self.store.table::<Vec<V>>(name)?;
        Ok(ListState::new(t, self.group, self.key))
    }
}

/// A function over a keyed stream with keyed state.
pub trait KeyedProcessFunction<K, I, O>: Send + 'static {
    /// Processes one record of key `ctx.key()`.
    fn process(&mut self, record: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()>;
}

impl<K, I, O, F> KeyedProcessFunction<K, I, O> for F
where
    F: FnMut(I, &mut KeyedContext<'_, K, O>) -> Result<()> + Send + 'static,
{
    fn process(&mut self, record: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()> {
        self(record, ctx)
    }
}

struct ProcessOperator<K, T, F> {
    key_fn: KeyFn<T, K>,
    f: F,
    store: KeyedStateStore<K>,
}

impl<K: Key, T: Data, O: Data, F: KeyedProcessFunction<K, T, O>> Operator<T, O>
    for ProcessOperator<K, T, F>
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)
    }

    fn process(&mut self, record: T, out: &mut Vec<O>) -> Result<()> {
        let key = (self.key_fn)(&record);
        let mut ctx = KeyedContext::new(&mut self.store, &key, out)?;
        self.f.process(record, &mut ctx)
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
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Runs `f` for every record with keyed state; `f` is cloned for every subtask.
    pub fn process<O: Data, F: KeyedProcessFunction<K, T, O> + Clone + Sync>(
        &self,
        name: &str,
        f: F,
    ) -> DataStream<O> {
        let key_fn = self.key_fn.clone();
        self.stream
            .add_operator(name, self.partitioning(), move |info| {
                Ok(ProcessOperator {
                    key_fn: key_fn.clone(),
                    f: f.clone(),
                    store: store_for(info),
                })
            })
    }
}
