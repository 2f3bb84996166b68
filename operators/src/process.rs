//! Keyed `process`: a user function per record with the record's key, keyed state handles
//! (value, map, list), timers (event time and processing time, see [`crate::timer`]) and an
//! output. [`KeyedProcessFunction::on_timer`] is called when a timer fires, in timestamp
//! order, with the timer's key as the current key.

use std::collections::HashMap;

use onceflow_runtime::state::{
    KeyedStateStore, ListState, MapState, OperatorSnapshot, RestoredState, ValueState,
};
use onceflow_runtime::{CheckpointId, Data, DataStream, Error, Key, Operator, Result, Watermark};

use crate::key_by::{store_for, KeyFn, KeyedStream};
use crate::timer::{processing_time_ms, TimeDomain, TimerService};

/// What a keyed function sees for one record: its key, keyed state, timers and the output.
pub struct KeyedContext<'a, K, O> {
    store: &'a mut KeyedStateStore<K>,
    key: &'a K,
    group: usize,
    out: &'a mut Vec<O>,
    timers: Option<&'a mut TimerService<K>>,
    watermark: Option<i64>,
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
            timers: None,
            watermark: None,
        })
    }

    pub(crate) fn with_timers(
        mut self,
        timers: &'a mut TimerService<K>,
        watermark: Option<i64>,
    ) -> Self {
        self.timers = Some(timers);
        self.watermark = watermark;
        self
    }

    /// The operator's current event-time watermark (`None` before the first one).
    pub fn current_watermark(&self) -> Option<i64> {
        self.watermark
    }

    /// The processing-time clock: ms since the Unix epoch.
    pub fn current_processing_time(&self) -> i64 {
        processing_time_ms()
    }

    fn timer_op(&mut self, domain: TimeDomain, ts: i64, register: bool) -> Result<()> {
        let Some(timers) = self.timers.as_deref_mut() else {
            return Err(Error::InvalidJob(
                "timers are only available in a keyed process function".into(),
            ));
        };
        if register {
            timers.register(self.store, domain, self.key, ts)
        } else {
            timers.delete(self.store, domain, self.key, ts)
        }
    }

    /// Registers an event-time timer for the current key: `on_timer` runs once the watermark
    /// reaches `timestamp` (once, however often it is registered).
    pub fn register_event_time_timer(&mut self, timestamp: i64) -> Result<()> {
        self.timer_op(TimeDomain::EventTime, timestamp, true)
    }

    /// Registers a processing-time timer (ms since the Unix epoch) for the current key.
    pub fn register_processing_time_timer(&mut self, timestamp: i64) -> Result<()> {
        self.timer_op(TimeDomain::ProcessingTime, timestamp, true)
    }

    /// Deletes an event-time timer of the current key (no-op if absent).
    pub fn delete_event_time_timer(&mut self, timestamp: i64) -> Result<()> {
        self.timer_op(TimeDomain::EventTime, timestamp, false)
    }

    /// Deletes a processing-time timer of the current key (no-op if absent).
    pub fn delete_processing_time_timer(&mut self, timestamp: i64) -> Result<()> {
        self.timer_op(TimeDomain::ProcessingTime, timestamp, false)
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

    /// A timer of key `ctx.key()` fired at `timestamp` (no-op by default).
    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        _ctx: &mut KeyedContext<'_, K, O>,
    ) -> Result<()> {
        Ok(())
    }
}

/// A [`KeyedProcessFunction`] made of two closures: one per record, one per timer.
#[derive(Clone)]
pub struct WithTimers<P, T> {
    /// Called for every record.
    pub process: P,
    /// Called for every fired timer with its timestamp and domain.
    pub on_timer: T,
}

impl<K, I, O, P, T> KeyedProcessFunction<K, I, O> for WithTimers<P, T>
where
    P: FnMut(I, &mut KeyedContext<'_, K, O>) -> Result<()> + Send + 'static,
    T: FnMut(i64, TimeDomain, &mut KeyedContext<'_, K, O>) -> Result<()> + Send + 'static,
{
    fn process(&mut self, record: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()> {
        (self.process)(record, ctx)
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, O>,
    ) -> Result<()> {
        (self.on_timer)(timestamp, domain, ctx)
    }
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
    timers: TimerService<K>,
    watermark: Option<i64>,
}

const WATERMARK_STATE_VERSION: u8 = 1;

impl<K: Key, T: Data, F> ProcessOperator<K, T, F> {
    fn fire<O>(&mut self, domain: TimeDomain, up_to: i64, out: &mut Vec<O>) -> Result<()>
    where
        F: KeyedProcessFunction<K, T, O>,
    {
        while let Some((key, ts)) = self.timers.pop_due(&mut self.store, domain, up_to)? {
            let mut ctx = KeyedContext::new(&mut self.store, &key, out)?
                .with_timers(&mut self.timers, self.watermark);
            self.f.on_timer(ts, domain, &mut ctx)?;
        }
        Ok(())
    }
}

impl<K: Key, T: Data, O: Data, F: KeyedProcessFunction<K, T, O>> Operator<T, O>
    for ProcessOperator<K, T, F>
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)?;
        self.timers.restore(&mut self.store)?;
        self.watermark = restored_watermark(&state.operator_states);
        Ok(())
    }

    fn process(&mut self, record: T, out: &mut Vec<O>) -> Result<()> {
        let key = (self.key_fn)(&record);
        let mut ctx = KeyedContext::new(&mut self.store, &key, out)?
            .with_timers(&mut self.timers, self.watermark);
        self.f.process(record, &mut ctx)
    }

    fn handle_watermark(&mut self, wm: Watermark, out: &mut Vec<O>) -> Result<Option<Watermark>> {
        if self.watermark.is_some_and(|w| w >= wm.0) {
            return Ok(None);
        }
        self.watermark = Some(wm.0);
        self.fire(TimeDomain::EventTime, wm.0, out)?;
        Ok(Some(wm))
    }

    fn processing_deadline(&self) -> Option<std::time::Instant> {
        self.timers.processing_deadline()
    }

    fn on_processing_time(&mut self, _now: std::time::Instant, out: &mut Vec<O>) -> Result<()> {
        self.fire(TimeDomain::ProcessingTime, processing_time_ms(), out)
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<OperatorSnapshot> {
        Ok(OperatorSnapshot {
            key_groups: self.store.snapshot()?,
            operator_state: Some(encode_watermark(self.watermark)),
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
    /// Runs `f` for every record with keyed state; `f` is cloned for every subtask.
    pub fn process<O: Data, F: KeyedProcessFunction<K, T, O> + Clone + Sync>(
        &self,
        name: &str,
        f: F,
    ) -> DataStream<O> {
        let key_fn = self.key_fn.clone();
        self.add_keyed_operator(name, move |info| {
            Ok(ProcessOperator {
                key_fn: key_fn.clone(),
                f: f.clone(),
                store: store_for(info),
                timers: TimerService::new(),
                watermark: None,
            })
        })
    }
}

/// Operator state holding a keyed operator's event-time watermark.
pub(crate) fn encode_watermark(wm: Option<i64>) -> Vec<u8> {
    let mut v = vec![WATERMARK_STATE_VERSION];
    if let Some(w) = wm {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v
}

/// The watermark to resume with: the minimum over the previous subtasks' watermarks (a
/// subtask without one, or an unreadable state, means none).
pub(crate) fn restored_watermark(states: &[Vec<u8>]) -> Option<i64> {
    let mut min: Option<i64> = None;
    for s in states {
        let w = match s.as_slice() {
            [WATERMARK_STATE_VERSION, rest @ ..] => <[u8; 8]>::try_from(rest).ok()?,
            _ => return None,
        };
        let w = i64::from_le_bytes(w);
        min = Some(min.map_or(w, |m| m.min(w)));
    }
    min
}
