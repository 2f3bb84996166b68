//! State: keyed state tables per key group, typed handles, snapshot types and file framing.

pub mod changelog;
pub mod format;
pub mod keyed;
pub mod snapshot;

pub use changelog::{change_from_record, changelog_key, ChangelogWriter};
pub use keyed::{
    snapshots_from_changes, KeyedStateStore, ListState, MapState, StateChange, StateTable,
    ValueState,
};
pub use snapshot::{KeyGroupSnapshot, OperatorSnapshot, RestoredState, SubtaskSnapshot};
