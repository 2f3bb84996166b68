//! Building blocks for running many instances of one job in a consumer group
//! (`docs/SCALE-OUT.md`): which task a key belongs to, as Kafka's default partitioner
//! decides it, and the instance's membership of the job's group.

mod key;
pub mod member;

pub use key::{murmur2, task_of, KafkaKey};
pub use member::{GroupMember, MemberConfig, RebalanceListener, TopicPartition};
