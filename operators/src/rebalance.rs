//! `rebalance`: spreads records round robin over the next operator's subtasks (e.g. after a
//! skewed source), at the cost of one channel hop.

use onceflow_runtime::{Data, DataStream, Operator, Partitioning, Result};

/// Redistributes records evenly.
pub trait Rebalance<T> {
    /// The same records, distributed round robin over `parallelism` subtasks.
    fn rebalance(&self, parallelism: usize) -> DataStream<T>;
}

struct Identity;

impl<T> Operator<T, T> for Identity {
    fn process(&mut self, record: T, out: &mut Vec<T>) -> Result<()> {
        out.push(record);
        Ok(())
    }
}

impl<T: Data> Rebalance<T> for DataStream<T> {
    fn rebalance(&self, parallelism: usize) -> DataStream<T> {
        self.add_operator("rebalance", Partitioning::Rebalance, |_| Ok(Identity))
            .set_parallelism(parallelism)
    }
}
