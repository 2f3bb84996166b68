//! The scaled-out Kafka source (`KafkaSource::in_group`) against the bundled broker with the
//! real client: one group member per instance owns the subscription, source subtasks read the
//! partition queues of the partitions the group gave the instance, and the
//! transactional-offsets sink commits their positions with the member's group metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_connectors::kafka::scale::{
    read_committed_offsets, GroupSourceReader, InstanceMember, MemberConfig, RebalanceListener,
    TopicPartition,
};
use onceflow_connectors::kafka::{
    Decoder, DeliveryMode, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource, OffsetsLink,
    SinkRecord,
};
use onceflow_runtime::{Sink, SinkFactory, Source, SourceFactory, SourcePoll};
use onceflow_testkit::clients::{committed_offsets, produce_values, read_committed_values};
use onceflow_testkit::inproc::{start_broker, subtask_info};

const INPUT: &str = "scale-in";
const PARTITIONS: i32 = 6;
const RECORDS: usize = 600;

struct Quiet;

impl RebalanceListener for Quiet {
    fn revoking(&self, _partitions: &[TopicPartition], _lost: bool) {}
    fn assigned(&self, _partitions: &[TopicPartition]) {}
}

fn member(brokers: &str, group: &str, instance: &str) -> InstanceMember {
    let mut config = MemberConfig::new(brokers, group, vec![INPUT.into()], instance);
    config.session_timeout = Duration::from_secs(6);
    InstanceMember::start(&config, Arc::new(Quiet), INPUT).expect("member starts")
}

fn input(brokers: &str) -> BTreeSet<String> {
    let values: Vec<String> = (0..RECORDS).map(|i| format!("v{i}")).collect();
    produce_values(brokers, INPUT, PARTITIONS, &values);
    values.into_iter().collect()
}

fn wait_owned(members: &[&InstanceMember], each: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let owned: Vec<usize> = members.iter().map(|m| m.member().owned().len()).collect();
        if owned.iter().all(|n| *n == each) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members own {owned:?} partitions, want {each} each"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls every reader until `want` records arrived in all, then a little longer to see that no
/// more come (records read twice would).
async fn read_all(
    readers: &mut [GroupSourceReader<KafkaMessage>],
    want: usize,
) -> Vec<Vec<KafkaMessage>> {
    let mut got: Vec<Vec<KafkaMessage>> = readers.iter().map(|_| Vec::new()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.iter().map(Vec::len).sum::<usize>() < want {
        assert!(
            Instant::now() < deadline,
            "read {} of {want} records",
            got.iter().map(Vec::len).sum::<usize>()
        );
        let mut idle = true;
        for (r, g) in readers.iter_mut().zip(got.iter_mut()) {
            let mut batch = Vec::new();
            if let SourcePoll::Ready = r.poll(&mut batch, 50).await.expect("poll") {
                idle = false;
            }
            g.extend(batch);
        }
        if idle {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    got
}

fn committed(brokers: &str, group: &str) -> BTreeMap<i32, i64> {
    committed_offsets(brokers, group, INPUT, PARTITIONS)
}

fn payload(m: &KafkaMessage) -> String {
    String::from_utf8(m.payload.clone().expect("payload")).expect("utf8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_two_subtasks_read_each_record_once_and_commit_the_offsets() {
    let broker = start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let sent = input(&brokers);

    let inst = member(&brokers, "scale-one", "node-a");
    // the source reads the partitions owned when it is created: wait for the assignment
    wait_owned(&[&inst], PARTITIONS as usize);
    let link = OffsetsLink::new();
    let source = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw())
        .transactional_offsets(link.clone())
        .in_group(inst.clone());
    let mut readers = vec![
        source.create(&subtask_info(0, 2, 0)).expect("subtask 0"),
        source.create(&subtask_info(1, 2, 0)).expect("subtask 1"),
    ];
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(brokers.clone(), "scale-out")
            .mode(DeliveryMode::TransactionalOffsets)
            .transactional_id_prefix("scale-one"),
    )
    .offsets_link(link);
    let mut writer = sink.create(&subtask_info(0, 1, 0)).expect("sink");
    writer.recover(Vec::new()).await.expect("sink recovers");

    let got = read_all(&mut readers, RECORDS).await;
    for (i, g) in got.iter().enumerate() {
        assert!(
            g.iter().all(|m| m.partition as usize % 2 == i),
            "subtask {i} read only partitions p % 2 == {i}"
        );
    }
    let mut seen = BTreeSet::new();
    for m in got.iter().flatten() {
        assert!(seen.insert(payload(m)), "{} read twice", payload(m));
    }
    assert_eq!(seen, sent, "every record read");

    let records: Vec<SinkRecord> = got
        .iter()
        .flatten()
        .map(|m| SinkRecord::new(None, payload(m).into_bytes()))
        .collect();
    writer.write_batch(records).await.expect("write");
    for r in &mut readers {
        r.snapshot_position(1).expect("position");
    }
    let pending = writer
        .pre_commit(1)
        .await
        .expect("pre-commit")
        .expect("pending");
    writer.commit(1, pending).await.expect("commit");

    let per_partition = (RECORDS / PARTITIONS as usize) as i64;
    let want: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, per_partition)).collect();
    assert_eq!(committed(&brokers, "scale-one"), want);
    let out: BTreeSet<String> = read_committed_values(&brokers, "scale-out")
        .into_iter()
        .collect();
    assert_eq!(out, sent, "the output committed with the offsets");
    drop(readers);
    drop(source);
    drop(inst);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_read_only_their_assigned_partitions() {
    let broker = start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let sent = input(&brokers);

    let a = member(&brokers, "scale-two", "node-a");
    let b = member(&brokers, "scale-two", "node-b");
    wait_owned(&[&a, &b], 3);
    let owned_a: BTreeSet<i32> = a.member().owned().iter().map(|p| p.partition).collect();
    let owned_b: BTreeSet<i32> = b.member().owned().iter().map(|p| p.partition).collect();
    assert!(owned_a.is_disjoint(&owned_b), "{owned_a:?} / {owned_b:?}");

    let source_a = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw()).in_group(a.clone());
    let source_b = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw()).in_group(b.clone());
    // a with two source subtasks: its three partitions are dealt out two and one
    let mut readers = vec![
        source_a.create(&subtask_info(0, 2, 0)).expect("a0"),
        source_a.create(&subtask_info(1, 2, 0)).expect("a1"),
        source_b.create(&subtask_info(0, 1, 0)).expect("b"),
    ];
    let got = read_all(&mut readers, RECORDS).await;
    let read_a0: BTreeSet<i32> = got[0].iter().map(|m| m.partition).collect();
    let read_a1: BTreeSet<i32> = got[1].iter().map(|m| m.partition).collect();
    let read_b: BTreeSet<i32> = got[2].iter().map(|m| m.partition).collect();
    assert_eq!(
        (read_a0.len(), read_a1.len()),
        (2, 1),
        "a's subtasks share its partitions: {read_a0:?} / {read_a1:?}"
    );
    let read_a: BTreeSet<i32> = read_a0.union(&read_a1).copied().collect();
    assert_eq!(read_a, owned_a, "a reads exactly its partitions");
    assert_eq!(read_b, owned_b, "b reads exactly its partitions");
    let mut seen = BTreeSet::new();
    for m in got.iter().flatten() {
        assert!(seen.insert(payload(m)), "{} read twice", payload(m));
    }
    assert_eq!(seen, sent);
    drop(readers);
    drop((source_a, source_b, a, b));
    broker.shutdown().await;
}

/// A dataflow that read records and ended without committing them (its transaction aborted)
/// leaves the member's partitions past them; `rewind_to_committed` moves every owned
/// partition back to the group's committed offset, so the next dataflow of the instance reads
/// them again instead of going on after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_reads_again_what_an_uncommitted_dataflow_read() {
    let broker = start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let sent = input(&brokers);
    let inst = member(&brokers, "scale-rewind", "node-a");
    wait_owned(&[&inst], PARTITIONS as usize);

    let source = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw()).in_group(inst.clone());
    let mut first = vec![source.create(&subtask_info(0, 1, 0)).expect("subtask")];
    let got = read_all(&mut first, RECORDS).await;
    assert_eq!(got[0].len(), RECORDS);
    // the dataflow ends without a commit
    drop(first);
    drop(source);

    let reader: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "scale-rewind")
        .create()
        .expect("offsets reader");
    let owned: Vec<TopicPartition> = inst.member().owned().into_iter().collect();
    let committed =
        read_committed_offsets(&reader, &owned, Duration::from_secs(30)).expect("committed");
    assert_eq!(committed.len(), PARTITIONS as usize);
    assert!(
        committed.values().all(Option::is_none),
        "nothing was committed: {committed:?}"
    );
    inst.member()
        .rewind(&committed, Duration::from_secs(30))
        .expect("rewind");
    let source = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw()).in_group(inst.clone());
    let mut second = vec![source.create(&subtask_info(0, 1, 0)).expect("subtask")];
    let again = read_all(&mut second, RECORDS).await;
    let seen: BTreeSet<String> = again[0].iter().map(payload).collect();
    assert_eq!(again[0].len(), RECORDS, "each record read once more");
    assert_eq!(seen, sent, "the uncommitted records are read again");
    drop(second);
    drop(source);
    drop(inst);
    broker.shutdown().await;
}
