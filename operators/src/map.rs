//! `map`: one output record per input record.

use std::sync::Arc;

use onceflow_runtime::{Data, DataStream, Operator, Partitioning, Result};

/// Applies a function to every record.
pub trait Map<T> {
    /// A stream of `f(record)`.
    fn map<U: Data, F: Fn(T) -> U + Send + Sync + 'static>(&self, f: F) -> DataStream<U>;
}

struct MapOperator<F>(Arc<F>);

impl<T, U, F: Fn(T) -> U + Send + Sync + 'static> Operator<T, U> for MapOperator<F> {
    fn process(&mut self, record: T, out: &mut Vec<U>) -> Result<()> {
        out.push((self.0)(record));
        Ok(())
    }
}

impl<T: Data> Map<T> for DataStream<T> {
    fn map<U: Data, F: Fn(T) -> U + Send + Sync + 'static>(&self, f: F) -> DataStream<U> {
        let f = Arc::new(f);
        self.add_operator("map", Partitioning::Auto, move |_| {
            Ok(MapOperator(f.clone()))
        })
    }
}
