//! Operators of onceflow: map, filter, flat_map, rebalance, key_by, keyed reduce/aggregate/process
//! (with timers), event-time windows and the two-input keyed co-process (connect). Each is an
//! extension trait on
//! [`onceflow_runtime::DataStream`] or a method of [`KeyedStream`], built on the runtime's
//! [`onceflow_runtime::Operator`] hooks.

mod aggregate;
mod connect;
mod filter;
mod flat_map;
mod key_by;
mod map;
mod process;
mod rebalance;
mod reduce;
pub mod timer;
pub mod window;

pub use connect::{Connect, ConnectedStreams, KeyedCoProcessFunction, KeyedConnectedStreams};
pub use filter::Filter;
pub use flat_map::FlatMap;
pub use key_by::{KeyBy, KeyedStream};
pub use map::Map;
pub use process::{KeyedContext, KeyedProcessFunction, WithTimers};
pub use rebalance::Rebalance;
pub use timer::TimeDomain;
