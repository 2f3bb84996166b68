//! Building blocks for running many instances of one job in a consumer group
//! (`docs/SCALE-OUT.md`): which task a key belongs to, as Kafka's default partitioner
//! decides it, the instance's membership of the job's group, the source that reads the
//! partitions the group gives the instance, and the changelog topics of its keyed state.

mod changelog;
mod key;
pub mod member;
mod queues;
mod source;

pub use changelog::{
    changelog_topic_name, ensure_changelog_topics, ChangelogRecord, ChangelogTopic, StateChangelog,
    CHANGELOG_BYTES_PER_COMMIT, CHANGELOG_RECORDS, RESTORE_RECORDS, RESTORE_SECONDS,
};
pub use key::{murmur2, task_of, KafkaKey};
pub use member::{GroupMember, MemberConfig, RebalanceListener, TopicPartition};
pub use queues::{InstanceMember, RecordQueue};
pub use source::{GroupSource, GroupSourceReader};
