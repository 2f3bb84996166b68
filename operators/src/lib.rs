//! Operators of onceflow: map, filter, flat_map, key_by, keyed state, reduce/aggregate, timers, windows.
