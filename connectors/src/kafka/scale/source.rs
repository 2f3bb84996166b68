//! The Kafka source of a scaled-out instance: the instance's [`InstanceMember`] owns the
//! group subscription, and the subtasks of a source of one topic (the input, or a repartition
//! topic) share the partition queues of that topic's partitions the group assigned to the instance when the dataflow was built, dealt out evenly
//! ([`split_of`]); a subtask yields records of a partition only while the instance still owns
//! it under that assignment (an assignment change ends the dataflow, and the instance builds
//! the next one for the new assignment). Each partition starts where the group's committed
//! offsets say (librdkafka reads them on assignment), so checkpoint positions are not
//! restored. At each barrier a subtask
//! hands the next offset of every partition it read within the partition's current
//! assignment to the [`OffsetsLink`], which commits them in the instance's transaction with
//! the member's live group metadata (member id, generation).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use onceflow_runtime::{async_trait, CheckpointId, Source, SourceFactory, SourcePoll, SubtaskInfo};
use rdkafka::message::Message;

use super::member::TopicPartition;
use super::queues::{InstanceMember, RecordQueue};
use crate::kafka::json::{Decoder, KafkaMessage};
use crate::kafka::sink::OffsetsLink;
use crate::kafka::source::KafkaPosition;
use crate::kafka::{metrics as m, KafkaError};

/// Turns a record into the source's item; an error fails the job.
pub(crate) type Decode<T> = Arc<dyn Fn(KafkaMessage) -> crate::kafka::Result<T> + Send + Sync>;

/// Builds the source subtasks of a scaled-out instance (see [`crate::kafka::KafkaSource::in_group`]).
pub struct GroupSource<T> {
    member: InstanceMember,
    topic: String,
    decode: Decode<T>,
    link: Option<OffsetsLink>,
    /// Counter and label to count the records read under, besides the consumed-records one.
    counter: Option<(&'static str, &'static str)>,
    /// The event times kept with the group's committed offsets the partitions start from.
    committed_event_times: BTreeMap<i32, i64>,
}

impl<T: 'static> GroupSource<T> {
    /// Reads `topic`, one of the member's topics.
    pub(crate) fn new(
        member: InstanceMember,
        topic: String,
        decoder: Decoder<T>,
        link: Option<OffsetsLink>,
    ) -> Self {
        let decode: Decode<T> = Arc::new(move |m| Ok(decoder.decode_owned(m)));
        Self::decoding(member, topic, decode, link)
    }

    /// Reads `topic`, one of the member's topics, with a decoder that may refuse a record.
    pub(crate) fn decoding(
        member: InstanceMember,
        topic: String,
        decode: Decode<T>,
        link: Option<OffsetsLink>,
    ) -> Self {
        GroupSource {
            member,
            topic,
            decode,
            link,
            counter: None,
            committed_event_times: BTreeMap::new(),
        }
    }

    /// The event times kept in the metadata of the group's committed offsets of the owned
    /// partitions (read after the assignment was pinned, see
    /// [`crate::kafka::scale::read_committed`]): each partition's watermark resumes there.
    pub(crate) fn resuming_event_times(mut self, times: BTreeMap<i32, i64>) -> Self {
        self.committed_event_times = times;
        self
    }

    /// Also counts the records read in counter `name` with label `direction` = `value`.
    pub(crate) fn counting(mut self, name: &'static str, value: &'static str) -> Self {
        self.counter = Some((name, value));
        self
    }
}

/// The partitions source subtask `index` of `parallelism` reads: the partitions the instance
/// owns when the subtask is created, dealt out in order (the `j`-th owned one to subtask
/// `j % parallelism`, so each subtask gets its share of what this instance was given). A
/// partition the group assigns later is not read by this dataflow: its state is not restored
/// in it, so the instance builds a new dataflow for the new assignment.
fn split_of(owned: &[i32], index: usize, parallelism: usize) -> Vec<i32> {
    let mut owned = owned.to_vec();
    owned.sort_unstable();
    owned.dedup();
    owned
        .iter()
        .enumerate()
        .filter(|(j, _)| j % parallelism == index)
        .map(|(_, p)| *p)
        .collect()
}

/// One source subtask of a scaled-out instance.
pub struct GroupSourceReader<T> {
    member: InstanceMember,
    topic: String,
    decode: Decode<T>,
    link: Option<OffsetsLink>,
    counter: Option<(&'static str, &'static str)>,
    /// The source node's uid: the link keeps positions per (node, subtask).
    node_uid: String,
    /// The partitions this subtask reads, each with its queue and the assignment it was
    /// owned under when the subtask was created.
    queues: Vec<(TopicPartition, Arc<RecordQueue>, u64)>,
    /// Next offset to read per partition, with the assignment it was read in.
    positions: BTreeMap<i32, (i64, u64)>,
    /// The queue the next poll starts with, so one busy partition does not starve the others.
    next_queue: usize,
    subtask: usize,
    /// The event times kept with the committed offsets the partitions start from.
    committed_event_times: BTreeMap<i32, i64>,
    /// The event times the watermark strategy handed over for the next position.
    event_times: BTreeMap<i32, i64>,
}

impl<T: Send + 'static> SourceFactory<T> for GroupSource<T> {
    type Source = GroupSourceReader<T>;

    fn create(&self, info: &SubtaskInfo) -> onceflow_runtime::Result<GroupSourceReader<T>> {
        let topic = self.topic.clone();
        if self.member.partitions_of(&topic).is_none() {
            return Err(KafkaError::Config(format!(
                "the scaled-out source reads {topic}, which its group member does not subscribe \
                 to (member topics: {:?})",
                self.member.topics().collect::<Vec<_>>()
            ))
            .into());
        }
        let owned = self.member.owned_as_built(&topic);
        let partitions: Vec<i32> = owned.keys().copied().collect();
        let queues: Vec<(TopicPartition, Arc<RecordQueue>, u64)> =
            split_of(&partitions, info.index, info.parallelism)
                .into_iter()
                .filter_map(|p| {
                    let q = self.member.queue(&topic, p)?;
                    let tp = TopicPartition {
                        topic: topic.clone(),
                        partition: p,
                    };
                    Some((tp, q, owned[&p]))
                })
                .collect();
        tracing::info!(
            subtask = info.index,
            topic = %topic,
            partitions = ?queues.iter().map(|(tp, _, _)| tp.partition).collect::<Vec<_>>(),
            "scaled-out source subtask reads its share of the owned partitions"
        );
        if let Some(link) = &self.link {
            link.register_group_member(
                &info.node_uid,
                info.parallelism,
                self.member.member().clone(),
            );
        }
        Ok(GroupSourceReader {
            member: self.member.clone(),
            topic,
            decode: self.decode.clone(),
            link: self.link.clone(),
            counter: self.counter,
            node_uid: info.node_uid.clone(),
            queues,
            positions: BTreeMap::new(),
            next_queue: 0,
            subtask: info.index,
            committed_event_times: self.committed_event_times.clone(),
            event_times: BTreeMap::new(),
        })
    }
}

#[async_trait]
impl<T: Send + 'static> Source<T> for GroupSourceReader<T> {
    type Position = KafkaPosition;

    fn restore(&mut self, positions: Vec<KafkaPosition>) -> onceflow_runtime::Result<()> {
        // the group's committed offsets are the truth of a scaled-out job: another instance
        // may have moved the partitions on since this checkpoint
        tracing::debug!(
            subtask = self.subtask,
            checkpoint_positions = positions.len(),
            "scaled-out source starts from the group's committed offsets, not the checkpoint"
        );
        Ok(())
    }

    fn splits(&self) -> Vec<u32> {
        self.queues
            .iter()
            .map(|(tp, _, _)| tp.partition as u32)
            .collect()
    }

    fn keep_event_times(&mut self, times: &[(u32, i64)]) {
        self.event_times = times.iter().map(|(p, t)| (*p as i32, *t)).collect();
    }

    fn kept_event_times(&self) -> Option<Vec<(u32, i64)>> {
        // the group's committed offsets are where every partition starts
        Some(
            self.committed_event_times
                .iter()
                .map(|(p, t)| (*p as u32, *t))
                .collect(),
        )
    }

    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> onceflow_runtime::Result<SourcePoll> {
        if let Some(why) = self.member.broken() {
            return Err(KafkaError::Protocol(why).into());
        }
        if let Some(link) = &self.link {
            link.source_started();
        }
        if self.queues.is_empty() {
            return Ok(SourcePoll::Idle(Duration::from_millis(100)));
        }
        let member = self.member.member().clone();
        let mut n = 0;
        for i in 0..self.queues.len() {
            if n >= max {
                break;
            }
            let (tp, queue, assignment) = &self.queues[(self.next_queue + i) % self.queues.len()];
            // read only under the assignment the subtask was created for: a partition revoked
            // since is read by its next owner from the committed offset (librdkafka drops
            // records fetched under an earlier assignment), one gained back is read by the
            // dataflow built for the new assignment, after its state is restored
            if member.assignment_of(tp) != Some(*assignment) {
                continue;
            }
            let assignment = *assignment;
            while n < max {
                match queue.poll(Duration::ZERO) {
                    None => break,
                    Some(Err(e))
                        if e.rdkafka_error_code()
                            == Some(rdkafka::types::RDKafkaErrorCode::AutoOffsetReset) =>
                    {
                        return Err(KafkaError::DataLoss(format!(
                            "input {tp} lost records before this job read them ({e}); onceflow stops instead of skipping them"
                        ))
                        .into());
                    }
                    Some(Err(e)) => {
                        tracing::warn!(subtask = self.subtask, partition = %tp, error = %e, "partition queue");
                        break;
                    }
                    Some(Ok(msg)) => {
                        let km = KafkaMessage {
                            topic: tp.topic.clone(),
                            partition: msg.partition(),
                            offset: msg.offset(),
                            key: msg.key().map(<[u8]>::to_vec),
                            payload: msg.payload().map(<[u8]>::to_vec),
                            timestamp_ms: msg.timestamp().to_millis(),
                        };
                        self.positions
                            .insert(km.partition, (km.offset + 1, assignment));
                        out.push((self.decode)(km)?);
                        n += 1;
                    }
                }
            }
        }
        self.next_queue = (self.next_queue + 1) % self.queues.len();
        if n > 0 {
            metrics::counter!(m::RECORDS_CONSUMED, "topic" => self.topic.clone())
                .increment(n as u64);
            if let Some((name, direction)) = self.counter {
                metrics::counter!(name, "direction" => direction).increment(n as u64);
            }
            Ok(SourcePoll::Ready)
        } else {
            Ok(SourcePoll::Idle(Duration::from_millis(5)))
        }
    }

    fn snapshot_position(
        &mut self,
        checkpoint: CheckpointId,
    ) -> onceflow_runtime::Result<KafkaPosition> {
        let member = self.member.member();
        let topic = self.topic.clone();
        // only partitions still owned under the assignment they were read in: a position of
        // an earlier assignment may lie behind what another owner committed meanwhile
        self.positions.retain(|p, (_, assignment)| {
            member.assignment_of(&TopicPartition {
                topic: topic.clone(),
                partition: *p,
            }) == Some(*assignment)
        });
        let pos = KafkaPosition::with_event_times(
            topic,
            self.positions.iter().map(|(p, (o, _))| (*p, *o)).collect(),
            &self.event_times,
        );
        if let Some(link) = &self.link {
            link.record_positions(checkpoint, &self.node_uid, self.subtask, &pos);
        }
        Ok(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::split_of;

    #[test]
    fn owned_partitions_are_dealt_out_evenly() {
        // owning 0, 2, 4 with two subtasks: 0 and 4 to the first, 2 to the second
        assert_eq!(split_of(&[4, 0, 2], 0, 2), vec![0, 4]);
        assert_eq!(split_of(&[4, 0, 2], 1, 2), vec![2]);
        // nothing owned: nothing to read
        assert!(split_of(&[], 1, 2).is_empty());
        // each owned partition has exactly one reader
        let mut all: Vec<i32> = (0..3).flat_map(|i| split_of(&[6, 3, 1], i, 3)).collect();
        all.sort_unstable();
        assert_eq!(all, vec![1, 3, 6]);
    }
}
