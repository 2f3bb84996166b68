//! `filter`: keeps the records a predicate accepts.

use std::sync::Arc;

use onceflow_runtime::{Data, DataStream, Operator, Partitioning, Result};

/// Keeps matching records.
pub trait Filter<T> {
    /// A stream of the records for which `f` returns true.
    fn filter<F: Fn(&T) -> bool + Send + Sync + 'static>(&self, f: F) -> DataStream<T>;
}

struct FilterOperator<F>(Arc<F>);

impl<T, F: Fn(&T) -> bool + Send + Sync + 'static> Operator<T, T> for FilterOperator<F> {
    fn process(&mut self, record: T, out: &mut Vec<T>) -> Result<()> {
        if (self.0)(&record) {
            out.push(record);
        }
        Ok(())
    }
}

impl<T: Data> Filter<T> for DataStream<T> {
    fn filter<F: Fn(&T) -> bool + Send + Sync + 'static>(&self, f: F) -> DataStream<T> {
        let f = Arc::new(f);
        self.add_operator("filter", Partitioning::Auto, move |_| {
            Ok(FilterOperator(f.clone()))
        })
    }
}
