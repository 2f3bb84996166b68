//! The window operator: keeps each key's windows in keyed state, fires them with event-time
//! timers when the watermark passes their end, handles late records (allowed lateness: a late
//! record updates and re-fires its window; later ones go to the late side output) and purges
//! a window once the watermark passes its end plus the allowed lateness.
//!
//! Semantics (Flink's `WindowOperator` with `EventTimeTrigger`), with `wm` the operator's
//! current watermark and `L` the allowed lateness:
//! - a window `w` is *late* when `w.max_timestamp() + L <= wm`; records are not added to late
//!   windows; a record all of whose windows are late goes to the side output;
//! - adding a record to a window with `w.max_timestamp() <= wm` fires it at once (late firing);
//!   otherwise the window fires when the watermark reaches `w.max_timestamp()`;
//! - a window is purged by the timer at `w.max_timestamp() + L`;
//! - session windows: a record's window `[t, t + gap)` merges with every overlapping window
//!   of its key (transitively); merging combines the states with [`WindowFunction::merge`];
//! - each key remembers the watermark its windows were last purged at (its *floor*, keyed state
//!   [`WINDOW_FLOOR`]): a window `w` with `w.max_timestamp() + L <= floor` is late for that
//!   key whatever the operator's watermark. After a restore whose watermark is lower than the
//!   one the state was written under (a scaled-out task moved to an instance whose watermark
//!   restarts, a rescale restoring the minimum over the old subtasks), a record that was late
//!   before stays late, so a purged window is never opened and fired a second time.

use std::collections::BTreeMap;
use std::sync::Arc;

use onceflow_runtime::state::{KeyedStateStore, OperatorSnapshot, RestoredState};
use onceflow_runtime::{CheckpointId, Data, Key, Operator, Result, SubtaskInfo, Watermark};

use crate::key_by::{store_for, KeyFn};
use crate::process::{encode_watermark, restored_watermark};
use crate::timer::{TimeDomain, TimerService};
use crate::window::{Window, WindowAssigner, WindowFunction, WindowOutput, WindowResult};

/// Keyed-state table with each key's windows and their states.
pub const WINDOW_STATE: &str = "__onceflow_windows";

/// Keyed-state table with each key's floor: the watermark at the latest purge of its
/// windows.
pub const WINDOW_FLOOR: &str = "__onceflow_window_floor";

/// Everything that defines a window operator besides its function.
pub struct WindowSpec<K, T> {
    /// Key of a record.
    pub key: KeyFn<T, K>,
    /// Event time of a record (ms).
    pub timestamp: Arc<dyn Fn(&T) -> i64 + Send + Sync>,
    /// The window assigner.
    pub assigner: WindowAssigner,
    /// Allowed lateness (ms).
    pub allowed_lateness: i64,
}

impl<K, T> Clone for WindowSpec<K, T> {
    fn clone(&self) -> Self {
        WindowSpec {
            key: self.key.clone(),
            timestamp: self.timestamp.clone(),
            assigner: self.assigner,
            allowed_lateness: self.allowed_lateness,
        }
    }
}

/// One subtask of a window operator.
pub struct WindowOperator<K, T, F: WindowFunction<K, T>> {
    spec: WindowSpec<K, T>,
    f: Arc<F>,
    store: KeyedStateStore<K>,
    timers: TimerService<K>,
    watermark: Option<i64>,
    /// The highest floor of any key (`None`: no key has one). While the watermark is at or
    /// above it no floor makes a window late that the watermark does not, and the per-key
    /// lookup is skipped: in a run without a restore to a lower watermark, always.
    max_floor: Option<i64>,
    results: Vec<F::Out>,
    /// `onceflow_window_firings_total`: results emitted.
    firings: metrics::Counter,
    /// `onceflow_window_late_records_total`: records sent to the late side output.
    late: metrics::Counter,
}

type Windows<A> = BTreeMap<Window, A>;

impl<K: Key, T: Data, F: WindowFunction<K, T>> WindowOperator<K, T, F> {
    /// Subtask `info.index` of a window operator.
    pub fn new(spec: WindowSpec<K, T>, f: Arc<F>, info: &SubtaskInfo) -> Result<Self> {
        spec.assigner.validate()?;
        let labels = [
            ("operator", info.operator.clone()),
            ("subtask", info.index.to_string()),
        ];
        Ok(WindowOperator {
            firings: metrics::counter!(super::FIRINGS, &labels),
            late: metrics::counter!(super::LATE_RECORDS, &labels),
            spec,
            f,
            store: store_for(info),
            timers: TimerService::new(),
            watermark: None,
            max_floor: None,
            results: Vec::new(),
        })
    }

    fn wm(&self) -> i64 {
        self.watermark.unwrap_or(i64::MIN)
    }

    /// Whether window `w` of a key with floor `floor` is late.
    fn is_late(&self, w: &Window, floor: Option<i64>) -> bool {
        let end = w.max_timestamp().saturating_add(self.spec.allowed_lateness);
        (self.watermark.is_some() && end <= self.wm()) || floor.is_some_and(|f| end <= f)
    }

    /// The key's floor where it can make a window late: the watermark its windows were last
    /// purged at, if that is above the current watermark.
    fn floor_of(&mut self, key: &K) -> Result<Option<i64>> {
        match self.max_floor {
            None => Ok(None),
            Some(max) if self.watermark.is_some_and(|w| w >= max) => Ok(None),
            Some(_) => self.stored_floor(key),
        }
    }

    /// The key's floor as stored.
    fn stored_floor(&mut self, key: &K) -> Result<Option<i64>> {
        let g = self.store.group_index(key)?;
        Ok(self
            .store
            .table::<i64>(WINDOW_FLOOR)?
            .group(g)
            .get(key)
            .copied())
    }

    /// Raises the key's floor to `at` (the watermark has reached `at`).
    fn raise_floor(&mut self, key: &K, at: i64) -> Result<()> {
        self.max_floor = Some(self.max_floor.map_or(at, |m| m.max(at)));
        if self.stored_floor(key)?.is_some_and(|f| f >= at) {
            return Ok(());
        }
        let g = self.store.group_index(key)?;
        self.store
            .table::<i64>(WINDOW_FLOOR)?
            .key_mut(g, key)
            .insert(key.clone(), at);
        Ok(())
    }

    fn emit(
        &mut self,
        key: &K,
        w: &Window,
        acc: &F::Acc,
        out: &mut Vec<WindowOutput<K, F::Out, T>>,
    ) {
        self.f.emit(key, w, acc, &mut self.results);
        self.firings.increment(1);
        for value in self.results.drain(..) {
            out.push(WindowOutput::Result(WindowResult {
                key: key.clone(),
                window: *w,
                value,
            }));
        }
    }

    /// Registers the firing timer (unless the window already fired) and the purge timer.
    fn schedule(&mut self, key: &K, w: &Window) -> Result<()> {
        let max = w.max_timestamp();
        if max > self.wm() {
            self.timers
                .register(&mut self.store, TimeDomain::EventTime, key, max)?;
        }
        let purge = max.saturating_add(self.spec.allowed_lateness);
        if purge != max {
            self.timers
                .register(&mut self.store, TimeDomain::EventTime, key, purge)?;
        }
        Ok(())
    }

    fn windows_of(&mut self, key: &K) -> Result<Windows<F::Acc>> {
        let g = self.store.group_index(key)?;
        Ok(self
            .store
            .table::<Windows<F::Acc>>(WINDOW_STATE)?
            .key_mut(g, key)
            .remove(key)
            .unwrap_or_default())
    }

    fn put_windows(&mut self, key: &K, windows: Windows<F::Acc>) -> Result<()> {
        let g = self.store.group_index(key)?;
        let map = self
            .store
            .table::<Windows<F::Acc>>(WINDOW_STATE)?
            .key_mut(g, key);
        if !windows.is_empty() {
            map.insert(key.clone(), windows);
        }
        Ok(())
    }

    fn add_merging(
        &mut self,
        key: &K,
        record: T,
        ts: i64,
        out: &mut Vec<WindowOutput<K, F::Out, T>>,
    ) -> Result<()> {
        let Some(own) = self.spec.assigner.assign(ts).into_iter().next() else {
            self.late.increment(1);
            out.push(WindowOutput::Late(record));
            return Ok(());
        };
        let mut windows = self.windows_of(key)?;
        let mut merged = own;
        loop {
            let grown = windows
                .keys()
                .filter(|w| w.intersects(&merged))
                .fold(merged, |m, w| m.cover(w));
            if grown == merged {
                break;
            }
            merged = grown;
        }
        let absorbed: Vec<Window> = windows
            .keys()
            .filter(|w| w.intersects(&merged))
            .copied()
            .collect();
        let floor = self.floor_of(key)?;
        if absorbed.is_empty() && self.is_late(&own, floor) {
            self.put_windows(key, windows)?;
            self.late.increment(1);
            out.push(WindowOutput::Late(record));
            return Ok(());
        }
        let absorbed_count = absorbed.len();
        let windows_had_merged = windows.contains_key(&merged);
        let mut acc: Option<F::Acc> = None;
        for w in absorbed {
            if let Some(a) = windows.remove(&w) {
                acc = Some(match acc {
                    None => a,
                    Some(prev) => self.f.merge(prev, a),
                });
            }
        }
        let unchanged = absorbed_count == 1 && windows_had_merged;
        let acc = self.f.add(acc, record);
        if merged.max_timestamp() <= self.wm() {
            self.emit(key, &merged, &acc, out);
        }
        // a window that already existed has its timers
        if !unchanged {
            self.schedule(key, &merged)?;
        }
        windows.insert(merged, acc);
        self.put_windows(key, windows)
    }

    fn add(&mut self, record: T, out: &mut Vec<WindowOutput<K, F::Out, T>>) -> Result<()> {
        let key = (self.spec.key)(&record);
        let ts = (self.spec.timestamp)(&record);
        if self.spec.assigner.is_merging() {
            return self.add_merging(&key, record, ts, out);
        }
        let floor = self.floor_of(&key)?;
        let assigned: Vec<Window> = self
            .spec
            .assigner
            .assign(ts)
            .into_iter()
            .filter(|w| !self.is_late(w, floor))
            .collect();
        if assigned.is_empty() {
            self.late.increment(1);
            out.push(WindowOutput::Late(record));
            return Ok(());
        }
        let mut windows = self.windows_of(&key)?;
        let last = assigned.len() - 1;
        let mut record = Some(record);
        for (i, w) in assigned.into_iter().enumerate() {
            let r = if i == last {
                record.take()
            } else {
                record.clone()
            };
            let Some(r) = r else { break };
            let existing = windows.remove(&w);
            let is_new = existing.is_none();
            let acc = self.f.add(existing, r);
            if w.max_timestamp() <= self.wm() {
                self.emit(&key, &w, &acc, out);
            }
            // a window that already existed has its timers
            if is_new {
                self.schedule(&key, &w)?;
            }
            windows.insert(w, acc);
        }
        self.put_windows(&key, windows)
    }

    fn on_timer(
        &mut self,
        key: &K,
        ts: i64,
        out: &mut Vec<WindowOutput<K, F::Out, T>>,
    ) -> Result<()> {
        let mut windows = self.windows_of(key)?;
        let fire: Vec<Window> = windows
            .keys()
            .filter(|w| w.max_timestamp() == ts)
            .copied()
            .collect();
        for w in fire {
            if let Some(acc) = windows.get(&w) {
                let acc = acc.clone();
                self.emit(key, &w, &acc, out);
            }
        }
        let lateness = self.spec.allowed_lateness;
        let before = windows.len();
        windows.retain(|w, _| w.max_timestamp().saturating_add(lateness) > ts);
        if windows.len() < before {
            // the watermark (at least `ts`) makes every window ending at or before it late
            let at = self.wm().max(ts);
            self.raise_floor(key, at)?;
        }
        self.put_windows(key, windows)
    }

    /// The operator's current watermark.
    pub fn current_watermark(&self) -> Option<i64> {
        self.watermark
    }
}

impl<K: Key, T: Data, F: WindowFunction<K, T>> Operator<T, WindowOutput<K, F::Out, T>>
    for WindowOperator<K, T, F>
{
    fn restore(&mut self, state: RestoredState) -> Result<()> {
        self.store.restore(state.key_groups)?;
        self.timers.restore(&mut self.store)?;
        self.watermark = restored_watermark(&state.operator_states);
        let groups = self.store.range().len();
        let floors = self.store.table::<i64>(WINDOW_FLOOR)?;
        self.max_floor = (0..groups)
            .flat_map(|g| floors.group(g).values().copied())
            .max();
        Ok(())
    }

    fn process(&mut self, record: T, out: &mut Vec<WindowOutput<K, F::Out, T>>) -> Result<()> {
        self.add(record, out)
    }

    fn handle_watermark(
        &mut self,
        wm: Watermark,
        out: &mut Vec<WindowOutput<K, F::Out, T>>,
    ) -> Result<Option<Watermark>> {
        if self.watermark.is_some_and(|w| w >= wm.0) {
            return Ok(None);
        }
        self.watermark = Some(wm.0);
        while let Some((key, ts)) =
            self.timers
                .pop_due(&mut self.store, TimeDomain::EventTime, wm.0)?
        {
            self.on_timer(&key, ts, out)?;
        }
        Ok(Some(wm))
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
