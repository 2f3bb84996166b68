//! Keyed `reduce`: a running reduction per key; emits the new value for every record.

use std::sync::Arc;

use onceflow_runtime::state::{KeyedStateStore, OperatorSnapshot, RestoredState};
use onceflow_runtime::{CheckpointId, Data, DataStream, Key, Operator, Result};

use crate::key_by::{store_for, KeyFn, KeyedStream};

const STATE: &str = "reduce";

struct ReduceOperator<K, T, F> {
    key_fn: KeyFn<T, K>,
    f: Arc<F>,
    store: KeyedStateStore<K>,
}

impl<K: Key, T: Data, F: Fn(&T, T) -> T + Send + Sync + 'static> Operator<T, T>
    for ReduceOperator<K, T, F>
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)
    }

    fn process(&mut self, record: T, out: &mut Vec<T>) -> Result<()> {
        let key = (self.key_fn)(&record);
        let g = self.store.group_index(&key)?;
        let map = self.store.table::<T>(STATE)?.key_mut(g, &key);
        let next = match map.get(&key) {
            Some(acc) => (self.f)(acc, record),
            None => record,
        };
        out.push(next.clone());
        map.insert(key, next);
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
    /// Combines each record with the key's previous result (`f(&acc, record)`), emitting every
    /// new result. The first record of a key is its initial result.
    pub fn reduce<F: Fn(&T, T) -> T + Send + Sync + 'static>(&self, f: F) -> DataStream<T> {
        let f = Arc::new(f);
        let key_fn = self.key_fn.clone();
        self.add_keyed_operator("reduce", move |info| {
            Ok(ReduceOperator {
                key_fn: key_fn.clone(),
                f: f.clone(),
                store: store_for(info),
            })
        })
    }
}
