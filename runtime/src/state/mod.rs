//! State: keyed state tables per key group, typed handles, snapshot types and file framing.

pub mod format;
pub mod keyed;
pub mod snapshot;

pub use keyed::{KeyedStateStore, ListState, MapState, StateTable, ValueState};
pub use snapshot::{KeyGroupSnapshot, OperatorSnapshot, RestoredState, SubtaskSnapshot};
