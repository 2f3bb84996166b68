//! Building blocks for running many instances of one job in a consumer group
//! (`docs/SCALE-OUT.md`): which task a key belongs to, as Kafka's default partitioner
//! decides it, the instance's membership of the job's group, the source that reads the
//! partitions the group gives the instance, the changelog topics of its keyed state, and the
//! repartition topics that carry a keyed exchange between instances.

mod cache;
mod changelog;
mod key;
pub mod member;
mod queues;
mod repartition;
mod source;

pub use cache::{CachedTask, ChangelogCache, RESTORE_CACHED_RECORDS};
pub use changelog::{
    changelog_topic_name, ensure_changelog_topics, ChangelogRecord, ChangelogTopic, RoutedRecord,
    StateChangelog, CHANGELOG_BYTES_PER_COMMIT, CHANGELOG_RECORDS, RESTORE_RECORDS,
    RESTORE_SECONDS,
};
pub use key::{murmur2, task_of, KafkaKey};
pub use member::{
    member_client_id, read_committed, read_committed_offsets, wait_until_instance_is_free,
    GroupMember, MemberConfig, RebalanceListener, TopicPartition,
};
pub use queues::{InstanceMember, RecordQueue};
pub use repartition::{
    ensure_repartition_topics, key_by_through, repartition_topic_name, Repartition,
    RepartitionPurger, RepartitionSink, RepartitionTopic, RepartitionWriter, REPARTITION_PURGES,
    REPARTITION_RECORDS,
};
pub use source::{GroupSource, GroupSourceReader};
