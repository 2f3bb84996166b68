//! Event-time windows on keyed streams: tumbling, sliding and session (merging) windows with
//! reduce, aggregate and full-window process functions, allowed lateness and a side output
//! for records that arrive too late.
//!
//! ```ignore
//! let counts = events
//!     .key_by(|e: &Event| e.user.clone())
//!     .window(WindowAssigner::tumbling(Duration::from_secs(60)), |e: &Event| e.ts)
//!     .allowed_lateness(Duration::from_secs(5))
//!     .aggregate("per-minute", Count);
//! counts.results().sink("out", ..);      // WindowResult { key, window, value }
//! counts.late_records().sink("late", ..); // records later than the allowed lateness
//! ```
//!
//! Window contents and pending timers live in keyed state, so they are part of every
//! checkpoint; see `operator.rs` for the exact firing rules and docs/WINDOWS.md.

mod assigner;
mod function;
mod operator;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use onceflow_runtime::{Data, DataStream, Key};

use onceflow_runtime::metrics::{MetricDef, MetricKind};

use crate::flat_map::FlatMap;
use crate::key_by::KeyedStream;

/// Counter: window results emitted, labels `operator`, `subtask`.
pub const FIRINGS: &str = "onceflow_window_firings_total";
/// Counter: records that arrived after their window closed (sent to the late side output or
/// dropped), labels `operator`, `subtask`.
pub const LATE_RECORDS: &str = "onceflow_window_late_records_total";

/// The window operators' metrics.
pub const METRICS: &[MetricDef] = &[
    MetricDef {
        name: FIRINGS,
        kind: MetricKind::Counter,
        unit: "results",
        labels: "operator, subtask",
        help: "Window results emitted.",
        buckets: &[],
    },
    MetricDef {
        name: LATE_RECORDS,
        kind: MetricKind::Counter,
        unit: "records",
        labels: "operator, subtask",
        help: "Records that arrived after every window they belong to had closed (the late side output).",
        buckets: &[],
    },
];

pub use assigner::{Window, WindowAssigner};
pub use function::{Aggregate, AggregateFunction, Process, Reduce, WindowFunction};
pub use operator::{WindowOperator, WindowSpec, WINDOW_FLOOR, WINDOW_STATE};

/// One firing of a window.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WindowResult<K, O> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: Window,
    /// What the window function emitted.
    pub value: O,
}

/// What a window operator emits: results, and (the side output) records that arrived after
/// their windows' allowed lateness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowOutput<K, O, T> {
    /// A window fired.
    Result(WindowResult<K, O>),
    /// A record too late for every one of its windows.
    Late(T),
}

/// A keyed stream with a window assigner.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    spec: WindowSpec<K, T>,
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Groups each key's records into the windows of `assigner` by event time
    /// `timestamp(record)` (ms), fired by watermarks.
    pub fn window(
        &self,
        assigner: WindowAssigner,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> WindowedStream<K, T> {
        WindowedStream {
            keyed: self.clone(),
            spec: WindowSpec {
                key: self.key_fn.clone(),
                timestamp: Arc::new(timestamp),
                assigner,
                allowed_lateness: 0,
            },
        }
    }
}

impl<K: Key, T: Data> WindowedStream<K, T> {
    /// Keeps windows `lateness` past their end: a record arriving in that time updates its
    /// window and fires it again; later records go to the side output.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.spec.allowed_lateness = i64::try_from(lateness.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// Any [`WindowFunction`].
    pub fn apply<F: WindowFunction<K, T>>(
        &self,
        name: &str,
        f: F,
    ) -> WindowedResults<K, F::Out, T> {
        let spec = self.spec.clone();
        let f = Arc::new(f);
        let stream = self.keyed.add_keyed_operator(name, move |info| {
            WindowOperator::new(spec.clone(), f.clone(), info)
        });
        WindowedResults { stream }
    }

    /// The window's records folded with `f`.
    pub fn reduce(
        &self,
        name: &str,
        f: impl Fn(&T, &T) -> T + Send + Sync + 'static,
    ) -> WindowedResults<K, T, T> {
        self.apply(name, Reduce(f))
    }

    /// An incremental aggregation per window.
    pub fn aggregate<A: AggregateFunction<T>>(
        &self,
        name: &str,
        agg: A,
    ) -> WindowedResults<K, A::Out, T> {
        self.apply(name, Aggregate(agg))
    }

    /// A full-window function: `f(key, window, records, out)` sees all records at once.
    pub fn process<O: Data>(
        &self,
        name: &str,
        f: impl Fn(&K, &Window, &[T], &mut Vec<O>) + Send + Sync + 'static,
    ) -> WindowedResults<K, O, T> {
        self.apply(name, Process(f, PhantomData))
    }
}

/// The output of a window operator: results plus the late-record side output.
pub struct WindowedResults<K, O, T> {
    stream: DataStream<WindowOutput<K, O, T>>,
}

impl<K: Key, O: Data, T: Data> WindowedResults<K, O, T> {
    /// Both outputs on one stream.
    pub fn stream(&self) -> &DataStream<WindowOutput<K, O, T>> {
        &self.stream
    }

    /// The window results.
    pub fn results(&self) -> DataStream<WindowResult<K, O>> {
        self.stream.flat_map(|o| match o {
            WindowOutput::Result(r) => Some(r),
            WindowOutput::Late(_) => None,
        })
    }

    /// The side output: records later than the allowed lateness.
    pub fn late_records(&self) -> DataStream<T> {
        self.stream.flat_map(|o| match o {
            WindowOutput::Result(_) => None,
            WindowOutput::Late(t) => Some(t),
        })
    }
}
