//! Window functions: what is kept per window (an accumulator) and what a firing emits.
//! Reduce and aggregate keep one value per window; the full-window process function keeps
//! every record and sees them all at once.

use std::marker::PhantomData;

use onceflow_runtime::Data;

use crate::window::Window;

/// Incremental state of one window and its result (implemented by reduce, aggregate and
/// process; implement it for your own).
pub trait WindowFunction<K, T>: Send + Sync + 'static {
    /// Per-window state.
    type Acc: Data;
    /// Emitted record.
    type Out: Data;
    /// Adds `record` to the window's state (`None`: the window's first record).
    fn add(&self, acc: Option<Self::Acc>, record: T) -> Self::Acc;
    /// Combines the states of two session windows that merge (`a` starts earlier).
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The records a firing of `window` emits.
    fn emit(&self, key: &K, window: &Window, acc: &Self::Acc, out: &mut Vec<Self::Out>);
}

/// An incremental aggregation (Flink's `AggregateFunction`).
pub trait AggregateFunction<T>: Send + Sync + 'static {
    /// Accumulator.
    type Acc: Data;
    /// Result.
    type Out: Data;
    /// A new, empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Folds a record in.
    fn add(&self, acc: &mut Self::Acc, record: T);
    /// Merges two accumulators (session windows).
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The result of an accumulator.
    fn result(&self, acc: &Self::Acc) -> Self::Out;
}

/// `reduce(f)`: the window's value is `f` folded over its records.
pub struct Reduce<F>(pub F);

impl<K, T: Data, F: Fn(&T, &T) -> T + Send + Sync + 'static> WindowFunction<K, T> for Reduce<F> {
    type Acc = T;
    type Out = T;
    fn add(&self, acc: Option<T>, record: T) -> T {
        match acc {
            None => record,
            Some(a) => (self.0)(&a, &record),
        }
    }
    fn merge(&self, a: T, b: T) -> T {
        (self.0)(&a, &b)
    }
    fn emit(&self, _key: &K, _window: &Window, acc: &T, out: &mut Vec<T>) {
        out.push(acc.clone());
    }
}

/// Adapts an [`AggregateFunction`].
pub struct Aggregate<A>(pub A);

impl<K, T, A: AggregateFunction<T>> WindowFunction<K, T> for Aggregate<A> {
    type Acc = A::Acc;
    type Out = A::Out;
    fn add(&self, acc: Option<A::Acc>, record: T) -> A::Acc {
        let mut acc = acc.unwrap_or_else(|| self.0.create());
        self.0.add(&mut acc, record);
        acc
    }
    fn merge(&self, a: A::Acc, b: A::Acc) -> A::Acc {
        self.0.merge(a, b)
    }
    fn emit(&self, _key: &K, _window: &Window, acc: &A::Acc, out: &mut Vec<A::Out>) {
        out.push(self.0.result(acc));
    }
}

/// A full-window function: keeps every record; `f(key, window, records, out)` on firing.
pub struct Process<F, O>(pub F, pub PhantomData<fn() -> O>);

impl<K, T, O, F> WindowFunction<K, T> for Process<F, O>
where
    T: Data,
    O: Data,
    F: Fn(&K, &Window, &[T], &mut Vec<O>) + Send + Sync + 'static,
{
    type Acc = Vec<T>;
    type Out = O;
    fn add(&self, acc: Option<Vec<T>>, record: T) -> Vec<T> {
        let mut v = acc.unwrap_or_default();
        v.push(record);
        v
    }
    fn merge(&self, mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
        a.extend(b);
        a
    }
    fn emit(&self, key: &K, window: &Window, acc: &Vec<T>, out: &mut Vec<O>) {
        (self.0)(key, window, acc, out)
    }
}
