//! Keyed state in Kafka: a scaled-out job's keyed operator writes its changes to its compacted
//! changelog topic in the instance transaction, with the output and the input offsets.
//! Reading the changelog read_committed and folding it gives exactly the job's final keyed
//! state, each record on its key's task; changelog records of a transaction that does not
//! commit are invisible; an existing changelog topic of the wrong shape is refused at start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_broker::BrokerConfig;
use onceflow_connectors::kafka::scale::{
    ensure_changelog_topics, task_of, ChangelogTopic, InstanceMember, KafkaKey, MemberConfig,
    RebalanceListener, StateChangelog, TopicPartition,
};
use onceflow_connectors::kafka::{
    ClientProperties, Decoder, DeliveryMode, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource,
    OffsetsLink, SinkRecord,
};
use onceflow_operators::{KeyBy, Map};
use onceflow_runtime::keygroup::KeyGroupRange;
use onceflow_runtime::state::{change_from_record, snapshots_from_changes, KeyedStateStore};
use onceflow_runtime::{JobConfig, StreamEnvironment};
use onceflow_testkit::clients::{committed_offsets, create_topics, produce_values, read_topic};
use onceflow_testkit::inproc::{block_on, InProcessBroker};

const INPUT: &str = "cl-in";
const OUTPUT: &str = "cl-out";
const PARTITIONS: i32 = 4;
const RECORDS: usize = 2_000;
const KEYS: usize = 37;
const PREFIX: &str = "cl-job";
/// The reduce node of the pipeline below: source n00, map n01, reduce n02.
const REDUCE: &str = "n02-reduce";
const MAX_PARALLELISM: usize = 128;

struct Quiet;

impl RebalanceListener for Quiet {
    fn revoking(&self, _partitions: &[TopicPartition], _lost: bool) {}
    fn assigned(&self, _partitions: &[TopicPartition]) {}
}

fn broker() -> InProcessBroker {
    InProcessBroker::start(BrokerConfig {
        default_partitions: PARTITIONS,
        ..BrokerConfig::default()
    })
    .expect("broker starts")
}

/// `key,amount` lines; the expected final sum per key.
fn input(brokers: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    let values: Vec<String> = (0..RECORDS)
        .map(|i| {
            let key = format!("k{}", i % KEYS);
            let amount = (i % 11) as u64 + 1;
            *sums.entry(key.clone()).or_insert(0) += amount;
            format!("{key},{amount}")
        })
        .collect();
    produce_values(brokers, INPUT, PARTITIONS, &values);
    sums
}

fn parse(m: KafkaMessage) -> (String, u64) {
    let line = String::from_utf8(m.payload.unwrap_or_default()).unwrap_or_default();
    let (k, a) = line.split_once(',').unwrap_or(("", "0"));
    (k.to_string(), a.parse().unwrap_or(0))
}

fn committed_total(brokers: &str, group: &str) -> i64 {
    committed_offsets(brokers, group, INPUT, PARTITIONS)
        .values()
        .sum()
}

/// Folds the changelog topic, read_committed, into the reduce operator's state; checks that
/// every record lies on its key's task.
fn changelog_state(brokers: &str, topic: &str) -> BTreeMap<String, u64> {
    let records = read_topic(brokers, topic, true);
    let mut changes = Vec::new();
    for r in &records {
        let (uid, change) =
            change_from_record(&r.key, Some(&r.value), MAX_PARALLELISM).expect("decodes");
        assert_eq!(uid, REDUCE);
        let key: String = onceflow_runtime::state::format::decode(&change.key).expect("key");
        assert_eq!(
            r.partition,
            task_of(&key.key_bytes(), PARTITIONS as u32) as i32,
            "{key} on its task"
        );
        changes.push(change);
    }
    let mut store: KeyedStateStore<String> = KeyedStateStore::new(
        MAX_PARALLELISM,
        KeyGroupRange::for_subtask(MAX_PARALLELISM, 1, 0),
    );
    store
        .restore(snapshots_from_changes(changes).expect("folds"))
        .expect("restores");
    let table = store
        .table::<(String, u64)>("reduce")
        .expect("reduce state");
    let mut out = BTreeMap::new();
    for g in 0..MAX_PARALLELISM {
        for (k, (_, sum)) in table.group(g) {
            out.insert(k.clone(), *sum);
        }
    }
    out
}

/// source -> parse -> key_by(key) -> reduce(sum) -> transactional-offsets sink, with the
/// reduce's changes going to its changelog in the instance transaction.
fn pipeline(
    brokers: &str,
    member: InstanceMember,
    topics: Vec<ChangelogTopic>,
) -> StreamEnvironment {
    let link = OffsetsLink::new();
    let config = JobConfig::new("changelog")
        .parallelism(2)
        .checkpoint_interval(Duration::from_millis(200))
        .state_changelog(Arc::new(StateChangelog::new(link.clone(), topics)));
    let env = StreamEnvironment::new(config);
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(brokers, OUTPUT)
            .mode(DeliveryMode::TransactionalOffsets)
            .transactional_id_prefix(PREFIX),
    )
    .offsets_link(link.clone());
    env.source(
        "input",
        KafkaSource::new(brokers, INPUT, Decoder::raw())
            .transactional_offsets(link)
            .in_group(member),
    )
    .map(parse)
    .key_by(|(k, _): &(String, u64)| k.clone())
    .reduce(|(k, a): &(String, u64), (_, b)| (k.clone(), a + b))
    .map(|(k, sum): (String, u64)| {
        SinkRecord::new(Some(k.into_bytes()), sum.to_string().into_bytes())
    })
    .sink("output", sink);
    env
}

#[test]
fn folding_the_committed_changelog_gives_the_final_keyed_state() {
    let broker = broker();
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[INPUT, OUTPUT], PARTITIONS);
    let want = input(&brokers);

    let topics = vec![ChangelogTopic::new::<String>(PREFIX, REDUCE, PARTITIONS)];
    block_on(ensure_changelog_topics(
        &brokers,
        &ClientProperties::new(),
        &topics,
        -1,
    ))
    .expect("changelog topics");

    let member = InstanceMember::start(
        &MemberConfig::new(&brokers, "cl-group", vec![INPUT.into()], "node-a"),
        Arc::new(Quiet),
        INPUT,
    )
    .expect("member");
    // the dataflow reads the partitions owned when it is built: wait for the assignment
    let deadline = Instant::now() + Duration::from_secs(90);
    while member.member().owned().len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "owns {:?}",
            member.member().owned()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let job = {
        let brokers = brokers.clone();
        let member = member.clone();
        let topics = topics.clone();
        std::thread::spawn(move || {
            let env = pipeline(&brokers, member, topics);
            let _ = stop_tx.send(env.stop_handle());
            env.execute_blocking()
        })
    };
    let stop = stop_rx.recv().expect("stop handle");

    // the group's committed offsets reach the end of the input: every record's state change
    // was released by a committed barrier
    let deadline = Instant::now() + Duration::from_secs(120);
    while committed_total(&brokers, "cl-group") < RECORDS as i64 {
        assert!(
            !job.is_finished(),
            "the job ended early: {:?}",
            job.join().map(|r| r.map(|_| ()))
        );
        assert!(Instant::now() < deadline, "input not committed in 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.stop();
    job.join().expect("job thread").expect("job runs");
    drop(member);

    assert_eq!(
        changelog_state(&brokers, topics[0].topic()),
        want,
        "the folded changelog is the final keyed state"
    );
    // the output's last value per key agrees
    let mut last = BTreeMap::new();
    for r in read_topic(&brokers, OUTPUT, true) {
        last.insert(
            String::from_utf8(r.key).expect("utf8"),
            String::from_utf8(r.value)
                .expect("utf8")
                .parse::<u64>()
                .expect("sum"),
        );
    }
    assert_eq!(last, want);
}

#[test]
fn a_changelog_topic_of_the_wrong_shape_is_refused_at_start() {
    let broker = broker();
    let brokers = broker.bootstrap();
    let props = ClientProperties::new();

    // wrong partition count
    create_topics(&brokers, &["shape-n02-reduce-changelog"], 3);
    let topics = vec![ChangelogTopic::new::<String>("shape", REDUCE, PARTITIONS)];
    let err = block_on(ensure_changelog_topics(&brokers, &props, &topics, -1))
        .expect_err("3 partitions refused")
        .to_string();
    assert!(
        err.contains("shape-n02-reduce-changelog has 3 partitions, the job needs 4"),
        "{err}"
    );

    // right partition count, but deleted by retention instead of compacted
    create_topics(&brokers, &["policy-n02-reduce-changelog"], PARTITIONS);
    let topics = vec![ChangelogTopic::new::<String>("policy", REDUCE, PARTITIONS)];
    let err = block_on(ensure_changelog_topics(&brokers, &props, &topics, -1))
        .expect_err("cleanup.policy=delete refused")
        .to_string();
    assert!(
        err.contains("policy-n02-reduce-changelog has cleanup.policy=delete"),
        "{err}"
    );

    // created by the job: accepted, and accepted again on the next start
    let topics = vec![ChangelogTopic::new::<String>("fresh", REDUCE, PARTITIONS)];
    block_on(ensure_changelog_topics(&brokers, &props, &topics, -1)).expect("created");
    block_on(ensure_changelog_topics(&brokers, &props, &topics, -1)).expect("checked");
}

/// Adds `amount` to `key`'s sum in the store, as the reduce operator does.
fn add(store: &mut KeyedStateStore<String>, key: &str, amount: u64) {
    let key = key.to_string();
    let g = store.group_index(&key).expect("group");
    let map = store
        .table::<(String, u64)>("reduce")
        .expect("table")
        .key_mut(g, &key);
    let sum = map.get(&key).map_or(0, |(_, s)| *s) + amount;
    map.insert(key.clone(), (key, sum));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelog_records_of_a_transaction_that_does_not_commit_are_invisible() {
    use onceflow_connectors::kafka::scale::GroupSourceReader;
    use onceflow_runtime::state::ChangelogWriter;
    use onceflow_runtime::{Sink, SinkFactory, Source, SourceFactory, SourcePoll};
    use onceflow_testkit::inproc::subtask_info;

    let broker = onceflow_testkit::inproc::start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let sink_config = KafkaSinkConfig::new(brokers.clone(), OUTPUT)
        .mode(DeliveryMode::TransactionalOffsets)
        .transactional_id_prefix("abort-job");
    let topics = vec![ChangelogTopic::new::<String>(
        "abort-job",
        REDUCE,
        PARTITIONS,
    )];
    ensure_changelog_topics(&brokers, &ClientProperties::new(), &topics, -1)
        .await
        .expect("changelog topics");
    let lines = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|i| format!("k{},{}", i % KEYS, 1)).collect()
    };
    produce_values(&brokers, INPUT, PARTITIONS, &lines(0, 400));

    let member = InstanceMember::start(
        &MemberConfig::new(&brokers, "abort-group", vec![INPUT.into()], "node-a"),
        Arc::new(Quiet),
        INPUT,
    )
    .expect("member");
    // the source reads the partitions owned when it is created: wait for the assignment
    let deadline = Instant::now() + Duration::from_secs(90);
    while member.member().owned().len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "owns {:?}",
            member.member().owned()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let link = OffsetsLink::new();
    let changelog = StateChangelog::new(link.clone(), topics.clone());
    let source = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw())
        .transactional_offsets(link.clone())
        .in_group(member.clone());
    let mut reader: GroupSourceReader<KafkaMessage> =
        source.create(&subtask_info(0, 1, 0)).expect("reader");
    let mut writer = KafkaSink::new(sink_config.clone())
        .offsets_link(link.clone())
        .create(&subtask_info(0, 1, 0))
        .expect("writer");
    writer.recover(Vec::new()).await.expect("recovers");
    let mut store: KeyedStateStore<String> = KeyedStateStore::new(
        MAX_PARALLELISM,
        KeyGroupRange::for_subtask(MAX_PARALLELISM, 1, 0),
    )
    .tracking_changes();

    // reads `n` records into the store
    async fn read_into(
        reader: &mut GroupSourceReader<KafkaMessage>,
        store: &mut KeyedStateStore<String>,
        n: usize,
    ) {
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < n {
            assert!(Instant::now() < deadline, "read {got} of {n}");
            let mut batch = Vec::new();
            if let SourcePoll::Idle(d) = reader.poll(&mut batch, 100).await.expect("poll") {
                tokio::time::sleep(d).await;
            }
            got += batch.len();
            for m in batch {
                let (k, a) = parse(m);
                add(store, &k, a);
            }
        }
    }

    // checkpoint 1 commits: its changes become visible
    read_into(&mut reader, &mut store, 400).await;
    changelog
        .write_for_checkpoint(1, REDUCE, 0, store.take_changes().expect("changes"))
        .expect("changelog 1");
    reader.snapshot_position(1).expect("position 1");
    let pending = writer
        .pre_commit(1)
        .await
        .expect("pre-commit")
        .expect("pending");
    writer.commit(1, pending).await.expect("commit 1");
    let state_1 = changelog_state(&brokers, topics[0].topic());
    assert_eq!(state_1.len(), KEYS);
    assert_eq!(state_1.values().sum::<u64>(), 400);

    // checkpoint 2's changes are handed over, then another incarnation of the instance fences
    // this one before it commits
    produce_values(&brokers, INPUT, PARTITIONS, &lines(400, 800));
    read_into(&mut reader, &mut store, 400).await;
    changelog
        .write_for_checkpoint(2, REDUCE, 0, store.take_changes().expect("changes"))
        .expect("changelog 2");
    reader.snapshot_position(2).expect("position 2");
    let pending = writer
        .pre_commit(2)
        .await
        .expect("pre-commit")
        .expect("pending");
    let next = OffsetsLink::new();
    let fencing_config = sink_config.clone();
    tokio::task::spawn_blocking(move || next.fence_previous(&fencing_config, 1))
        .await
        .expect("fencing thread")
        .expect("the next incarnation fences this one");
    let err = writer
        .commit(2, pending)
        .await
        .expect_err("a fenced instance cannot commit");
    assert!(
        err.to_string().contains("fenced") || err.to_string().contains("aborted"),
        "{err}"
    );

    // only checkpoint 1's state is in the changelog, matching the committed offsets
    assert_eq!(changelog_state(&brokers, topics[0].topic()), state_1);
    assert_eq!(committed_total(&brokers, "abort-group"), 400);
    drop(reader);
    drop(source);
    drop(member);
    broker.shutdown().await;
}
