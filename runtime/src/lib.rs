//! The dataflow runtime of onceflow: graph, tasks, channels, barriers, checkpoints, state, recovery.
