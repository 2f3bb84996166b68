//! The Kafka source of a scaled-out instance: the instance's [`InstanceMember`] owns the
//! group subscription, and its source subtasks share the partition queues of the input
//! partitions, the ones the group assigned to the instance dealt out evenly ([`split_of`]);
//! a subtask yields records only of partitions the instance owns. Each partition starts where the group's committed offsets say (librdkafka reads
//! them on assignment), so checkpoint positions are not restored. At each barrier a subtask
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

/// Builds the source subtasks of a scaled-out instance (see [`crate::kafka::KafkaSource::in_group`]).
pub struct GroupSource<T> {
    member: InstanceMember,
    decoder: Decoder<T>,
    link: Option<OffsetsLink>,
}

impl<T> GroupSource<T> {
    pub(crate) fn new(
        member: InstanceMember,
        decoder: Decoder<T>,
        link: Option<OffsetsLink>,
    ) -> Self {
        GroupSource {
            member,
            decoder,
            link,
        }
    }
}

/// The partitions source subtask `index` of `parallelism` reads: the partitions the instance
/// owns when the subtask is created are dealt out in order (the `j`-th owned one to subtask
/// `j % parallelism`, so each subtask gets its share of what this instance was given), the
/// others of the topic's `partitions` by `p % parallelism` (they yield records only once the
/// group assigns them to this instance).
fn split_of(partitions: i32, owned: &[i32], index: usize, parallelism: usize) -> Vec<i32> {
    let mut owned: Vec<i32> = owned.iter().copied().filter(|p| *p < partitions).collect();
    owned.sort_unstable();
    owned.dedup();
    let mut mine: Vec<i32> = owned
        .iter()
        .enumerate()
        .filter(|(j, _)| j % parallelism == index)
        .map(|(_, p)| *p)
        .collect();
    mine.extend(
        (0..partitions)
            .filter(|p| owned.binary_search(p).is_err())
            .filter(|p| (*p as usize) % parallelism == index),
    );
    mine.sort_unstable();
    mine
}

/// One source subtask of a scaled-out instance.
pub struct GroupSourceReader<T> {
    member: InstanceMember,
    decoder: Decoder<T>,
    link: Option<OffsetsLink>,
    queues: Vec<(TopicPartition, Arc<RecordQueue>)>,
    /// Next offset to read per partition, with the assignment it was read in.
    positions: BTreeMap<i32, (i64, u64)>,
    /// The queue the next poll starts with, so one busy partition does not starve the others.
    next_queue: usize,
    subtask: usize,
}

impl<T: Send + 'static> SourceFactory<T> for GroupSource<T> {
    type Source = GroupSourceReader<T>;

    fn create(&self, info: &SubtaskInfo) -> onceflow_runtime::Result<GroupSourceReader<T>> {
        let topic = self.member.topic().to_string();
        let owned: Vec<i32> = self
            .member
            .member()
            .owned()
            .into_iter()
            .filter(|tp| tp.topic == topic)
            .map(|tp| tp.partition)
            .collect();
        let queues = split_of(
            self.member.partitions() as i32,
            &owned,
            info.index,
            info.parallelism,
        )
        .into_iter()
        .filter_map(|p| {
            self.member.queue(p).map(|q| {
                (
                    TopicPartition {
                        topic: topic.clone(),
                        partition: p,
                    },
                    q,
                )
            })
        })
        .collect();
        if let Some(link) = &self.link {
            link.register_group_member(info.parallelism, self.member.member().clone());
        }
        Ok(GroupSourceReader {
            member: self.member.clone(),
            decoder: self.decoder.clone(),
            link: self.link.clone(),
            queues,
            positions: BTreeMap::new(),
            next_queue: 0,
            subtask: info.index,
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
            .map(|(tp, _)| tp.partition as u32)
            .collect()
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
            let (tp, queue) = &self.queues[(self.next_queue + i) % self.queues.len()];
            // partitions are added to the owned set before librdkafka fetches them, so a
            // record of a partition not owned now was fetched before it was revoked: its new
            // owner reads it again from the committed offset
            let Some(assignment) = member.assignment_of(tp) else {
                while queue.poll(Duration::ZERO).is_some() {}
                continue;
            };
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
                        out.push(self.decoder.decode_owned(km));
                        n += 1;
                    }
                }
            }
        }
        self.next_queue = (self.next_queue + 1) % self.queues.len();
        if n > 0 {
            metrics::counter!(m::RECORDS_CONSUMED, "topic" => self.member.topic().to_string())
                .increment(n as u64);
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
        let topic = self.member.topic().to_string();
        // only partitions still owned under the assignment they were read in: a position of
        // an earlier assignment may lie behind what another owner committed meanwhile
        self.positions.retain(|p, (_, assignment)| {
            member.assignment_of(&TopicPartition {
                topic: topic.clone(),
                partition: *p,
            }) == Some(*assignment)
        });
        let pos = KafkaPosition {
            topic,
            offsets: self.positions.iter().map(|(p, (o, _))| (*p, *o)).collect(),
        };
        if let Some(link) = &self.link {
            link.record_positions(checkpoint, self.subtask, &pos);
        }
        Ok(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::split_of;

    #[test]
    fn owned_partitions_are_dealt_out_evenly_and_every_partition_has_a_reader() {
        // owning 0, 2, 4 of 6 with two subtasks: 0 and 4 to the first, 2 to the second
        assert_eq!(split_of(6, &[4, 0, 2], 0, 2), vec![0, 4]);
        assert_eq!(split_of(6, &[4, 0, 2], 1, 2), vec![1, 2, 3, 5]);
        // owning everything: p % n, as without a group
        assert_eq!(split_of(6, &[0, 1, 2, 3, 4, 5], 0, 2), vec![0, 2, 4]);
        // nothing owned yet: p % n
        assert_eq!(split_of(4, &[], 1, 2), vec![1, 3]);
        // each partition has exactly one reader
        let mut all: Vec<i32> = (0..3).flat_map(|i| split_of(7, &[6, 3, 1], i, 3)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
    }
}
