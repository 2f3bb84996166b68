//! Building blocks for running many instances of one job in a consumer group
//! (`docs/SCALE-OUT.md`): which task a key belongs to, as Kafka's default partitioner
//! decides it.

mod key;

pub use key::{murmur2, task_of, KafkaKey};
