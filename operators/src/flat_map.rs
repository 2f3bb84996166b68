//! `flat_map`: zero or more output records per input record.

use std::sync::Arc;

use onceflow_runtime::{Data, DataStream, Operator, Partitioning, Result};

/// Expands every record into any number of records.
pub trait FlatMap<T> {
    /// A stream of every item of `f(record)`.
    fn flat_map<U: Data, I: IntoIterator<Item = U>, F: Fn(T) -> I + Send + Sync + 'static>(
        &self,
        f: F,
    ) -> DataStream<U>;
}

struct FlatMapOperator<F>(Arc<F>);

impl<T, U, I: IntoIterator<Item = U>, F: Fn(T) -> I + Send + Sync + 'static> Operator<T, U>
    for FlatMapOperator<F>
{
    fn process(&mut self, record: T, out: &mut Vec<U>) -> Result<()> {
        out.extend((self.0)(record));
        Ok(())
    }
}

impl<T: Data> FlatMap<T> for DataStream<T> {
    fn flat_map<U: Data, I: IntoIterator<Item = U>, F: Fn(T) -> I + Send + Sync + 'static>(
        &self,
        f: F,
    ) -> DataStream<U> {
        let f = Arc::new(f);
        self.add_operator("flat_map", Partitioning::Auto, move |_| {
            Ok(FlatMapOperator(f.clone()))
        })
    }
}
