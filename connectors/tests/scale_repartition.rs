//! A keyed exchange through a repartition topic (`key_by_through`): the input's records are
//! not partitioned by the aggregation key, so sub-topology S1 writes them to the key's task of
//! the job's repartition topic inside the instance transaction, and S2 reads that topic
//! read_committed in the job's group before the keyed reduce. Totals are exact with one and
//! with two instances (each key's output from one instance only), every repartition record
//! lies on its key's task, the group's committed offsets cover the input and the repartition
//! topic, the repartition records of a transaction that does not commit are invisible, and a
//! new instance restores the state of the repartition topic's tasks (not the input's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_broker::BrokerConfig;
use onceflow_connectors::kafka::scale::{
    ensure_changelog_topics, ensure_repartition_topics, key_by_through, task_of, ChangelogTopic,
    InstanceMember, KafkaKey, MemberConfig, RebalanceListener, Repartition, RepartitionTopic,
    StateChangelog, TopicPartition,
};
use onceflow_connectors::kafka::{
    ClientProperties, Decoder, DeliveryMode, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource,
    OffsetsLink, SinkRecord,
};
use onceflow_operators::Map;
use onceflow_runtime::keygroup::KeyGroupRange;
use onceflow_runtime::state::{change_from_record, snapshots_from_changes, KeyedStateStore};
use onceflow_runtime::{JobConfig, StopHandle, StreamEnvironment};
use onceflow_testkit::clients::{committed_offsets, create_topics, produce_values, read_topic};
use onceflow_testkit::inproc::{block_on, InProcessBroker};

const INPUT: &str = "rp-in";
const OUTPUT: &str = "rp-out";
const PARTITIONS: i32 = 4;
const RECORDS: usize = 2_000;
const KEYS: usize = 31;
/// Nodes of the pipeline below: source n00, parse n01, repartition writer n02, repartition
/// reader n03, reduce n04, to-record n05, sink n06.
const REDUCE: &str = "n04-reduce";
const MAX_PARALLELISM: usize = 128;

/// An input topic and its partition count.
struct Input {
    topic: &'static str,
    partitions: i32,
}

/// The input of most tests: as many partitions as the repartition topic.
const IN: Input = Input {
    topic: INPUT,
    partitions: PARTITIONS,
};

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

/// The job's topics: the repartition topic of the sum and the reduce's changelog, fed by it.
fn job_topics(prefix: &str) -> (RepartitionTopic, ChangelogTopic) {
    let repartition = RepartitionTopic::new(prefix, "sum", PARTITIONS);
    let changelog =
        ChangelogTopic::new::<String>(prefix, REDUCE, PARTITIONS).fed_by(&repartition.name);
    (repartition, changelog)
}

fn ensure_topics(brokers: &str, repartition: &RepartitionTopic, changelog: &ChangelogTopic) {
    let props = ClientProperties::new();
    block_on(ensure_repartition_topics(
        brokers,
        &props,
        std::slice::from_ref(repartition),
        -1,
    ))
    .expect("repartition topic");
    block_on(ensure_changelog_topics(
        brokers,
        &props,
        std::slice::from_ref(changelog),
        -1,
    ))
    .expect("changelog topic");
}

/// `id,key,amount` lines spread round-robin over the input partitions (so a key's records lie
/// on every partition); the expected final sum per key.
fn input(brokers: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    produce(brokers, &IN, 0, RECORDS, &mut sums);
    sums
}

/// Produces lines `from..to` to `input` and adds them to `sums`.
fn produce(brokers: &str, input: &Input, from: usize, to: usize, sums: &mut BTreeMap<String, u64>) {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let key = format!("k{}", (i * 7) % KEYS);
            let amount = (i % 13) as u64 + 1;
            *sums.entry(key.clone()).or_insert(0) += amount;
            format!("{i},{key},{amount}")
        })
        .collect();
    produce_values(brokers, input.topic, input.partitions, &values);
}

fn parse(m: KafkaMessage) -> (String, u64) {
    let line = String::from_utf8(m.payload.unwrap_or_default()).unwrap_or_default();
    let mut fields = line.split(',').skip(1);
    let key = fields.next().unwrap_or_default().to_string();
    let amount = fields.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    (key, amount)
}

fn member(brokers: &str, group: &str, repartition: &str, instance: &str) -> InstanceMember {
    member_of(brokers, &IN, group, repartition, instance)
}

fn member_of(
    brokers: &str,
    input: &Input,
    group: &str,
    repartition: &str,
    instance: &str,
) -> InstanceMember {
    let mut config = MemberConfig::new(
        brokers,
        group,
        vec![input.topic.into(), repartition.into()],
        instance,
    );
    config.session_timeout = Duration::from_secs(6);
    InstanceMember::start(&config, Arc::new(Quiet), input.topic).expect("member")
}

/// Waits until the members own every partition of the input and the repartition topic
/// between them, each partition once, and every member owns some: the group settled. Pins
/// each member's assignment and returns what each owns.
fn wait_settled(members: &[&InstanceMember], repartition: &str) -> Vec<BTreeSet<TopicPartition>> {
    wait_settled_on(members, &IN, repartition)
}

fn wait_settled_on(
    members: &[&InstanceMember],
    input: &Input,
    repartition: &str,
) -> Vec<BTreeSet<TopicPartition>> {
    let all: BTreeSet<TopicPartition> =
        [(input.topic, input.partitions), (repartition, PARTITIONS)]
            .iter()
            .flat_map(|(t, n)| {
                (0..*n).map(|p| TopicPartition {
                    topic: t.to_string(),
                    partition: p,
                })
            })
            .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let owned: Vec<BTreeSet<TopicPartition>> =
            members.iter().map(|m| m.member().owned()).collect();
        let union: BTreeSet<TopicPartition> = owned.iter().flatten().cloned().collect();
        let count: usize = owned.iter().map(BTreeSet::len).sum();
        if union == all && count == all.len() && owned.iter().all(|o| !o.is_empty()) {
            for (m, o) in members.iter().zip(&owned) {
                m.pin_assignment();
                eprintln!("settled: {} partitions owned: {o:?}", o.len());
            }
            return owned;
        }
        assert!(Instant::now() < deadline, "group not settled: {owned:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One instance's dataflow: source -> parse -> key_by_through(key) -> reduce(sum) ->
/// transactional-offsets sink; each output value is `sum,instance`.
fn pipeline(
    brokers: &str,
    input: &str,
    prefix: &str,
    instance: &str,
    member: InstanceMember,
) -> StreamEnvironment {
    let (repartition, changelog) = job_topics(prefix);
    let link = OffsetsLink::new();
    let state = StateChangelog::new(link.clone(), vec![changelog]).restoring_from(
        brokers,
        ClientProperties::new(),
        member.clone(),
    );
    let config = JobConfig::new("repartition")
        .parallelism(2)
        .checkpoint_interval(Duration::from_millis(200))
        .state_changelog(Arc::new(state));
    let env = StreamEnvironment::new(config);
    let sink_config = KafkaSinkConfig::new(brokers, OUTPUT)
        .mode(DeliveryMode::TransactionalOffsets)
        .transactional_id_prefix(format!("{prefix}-{instance}"));
    let through = Repartition::new(
        repartition,
        member.clone(),
        link.clone(),
        sink_config.clone(),
    )
    .expect("repartition");
    let parsed = env
        .source(
            "input",
            KafkaSource::new(brokers, input, Decoder::raw())
                .transactional_offsets(link.clone())
                .in_group(member),
        )
        .map(parse);
    let instance = instance.to_string();
    key_by_through(&parsed, |(k, _): &(String, u64)| k.clone(), &through)
        .reduce(|(k, a): &(String, u64), (_, b)| (k.clone(), a + b))
        .map(move |(k, sum): (String, u64)| {
            SinkRecord::new(
                Some(k.into_bytes()),
                format!("{sum},{instance}").into_bytes(),
            )
        })
        .sink("output", KafkaSink::new(sink_config).offsets_link(link));
    env
}

/// Runs the instances' dataflows in threads until the group committed the whole input and
/// every repartition record, then stops them.
fn run(brokers: &str, prefix: &str, group: &str, instances: &[(&str, InstanceMember)]) {
    run_on(brokers, &IN, RECORDS, prefix, group, instances)
}

/// Runs the instances' dataflows on `input` until the group committed `records` input records
/// and as many repartition records, then stops them.
fn run_on(
    brokers: &str,
    input: &Input,
    records: usize,
    prefix: &str,
    group: &str,
    instances: &[(&str, InstanceMember)],
) {
    let (repartition, _) = job_topics(prefix);
    let mut jobs = Vec::new();
    for (instance, member) in instances {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<StopHandle>();
        let brokers = brokers.to_string();
        let prefix = prefix.to_string();
        let instance = instance.to_string();
        let member = member.clone();
        let topic = input.topic;
        let job = std::thread::spawn(move || {
            let env = pipeline(&brokers, topic, &prefix, &instance, member);
            let _ = stop_tx.send(env.stop_handle());
            env.execute_blocking()
        });
        jobs.push((stop_rx.recv().expect("stop handle"), job));
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        for (_, job) in &jobs {
            assert!(!job.is_finished(), "a dataflow ended early");
        }
        let input_done = committed_offsets(brokers, group, input.topic, input.partitions)
            .values()
            .sum::<i64>()
            >= records as i64;
        if input_done && repartition_committed(brokers, group, &repartition.name, records) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "input and repartition records not committed in 180 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (stop, _) in &jobs {
        stop.stop();
    }
    for (_, job) in jobs {
        job.join().expect("job thread").expect("job runs");
    }
}

/// Whether the group's committed offset of every repartition partition lies past its last
/// committed record (read_committed), and `want` records were written.
fn repartition_committed(brokers: &str, group: &str, topic: &str, want: usize) -> bool {
    let records = read_topic(brokers, topic, true);
    if records.len() < want {
        return false;
    }
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &records {
        let end = ends.entry(r.partition).or_default();
        *end = (*end).max(r.offset + 1);
    }
    let committed = committed_offsets(brokers, group, topic, PARTITIONS);
    ends.iter()
        .all(|(p, end)| committed.get(p).is_some_and(|c| c >= end))
}

/// Checks every repartition record: on its key's task, keyed by the key's bytes, decoding to
/// the parsed record; returns how many there are.
fn check_repartition_records(brokers: &str, topic: &str) -> usize {
    let records = read_topic(brokers, topic, true);
    for r in &records {
        let (key, amount): (String, u64) =
            onceflow_runtime::state::format::decode(&r.value).expect("decodes");
        assert_eq!(r.key, key.key_bytes(), "keyed by the key's bytes");
        assert!(amount > 0);
        assert_eq!(
            r.partition,
            task_of(&key.key_bytes(), PARTITIONS as u32) as i32,
            "{key} on its task"
        );
    }
    records.len()
}

/// The last committed total per key in the output, with the instances that wrote the key.
fn output(brokers: &str) -> (BTreeMap<String, u64>, BTreeMap<String, BTreeSet<String>>) {
    let mut last = BTreeMap::new();
    let mut writers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in read_topic(brokers, OUTPUT, true) {
        let key = String::from_utf8(r.key).expect("utf8");
        let value = String::from_utf8(r.value).expect("utf8");
        let (sum, instance) = value.split_once(',').expect("sum,instance");
        last.insert(key.clone(), sum.parse::<u64>().expect("sum"));
        writers.entry(key).or_default().insert(instance.to_string());
    }
    (last, writers)
}

/// Folds the read_committed changelog into the reduce's state; each record on its key's
/// task (the repartition partition the key's records were read from).
fn changelog_state(brokers: &str, topic: &str) -> BTreeMap<String, u64> {
    let mut changes = Vec::new();
    for r in read_topic(brokers, topic, true) {
        let (uid, change) =
            change_from_record(&r.key, Some(&r.value), MAX_PARALLELISM).expect("decodes");
        assert_eq!(uid, REDUCE);
        let key: String = onceflow_runtime::state::format::decode(&change.key).expect("key");
        assert_eq!(
            r.partition,
            task_of(&key.key_bytes(), PARTITIONS as u32) as i32
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

#[test]
fn one_instance_sums_exactly_through_the_repartition_topic() {
    let broker = broker();
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[INPUT, OUTPUT], PARTITIONS);
    let want = input(&brokers);
    let (repartition, changelog) = job_topics("rp-one");
    ensure_topics(&brokers, &repartition, &changelog);

    let a = member(&brokers, "rp-one-group", &repartition.name, "node-a");
    wait_settled(&[&a], &repartition.name);
    run(&brokers, "rp-one", "rp-one-group", &[("node-a", a)]);

    assert_eq!(
        check_repartition_records(&brokers, &repartition.name),
        RECORDS,
        "every input record went through the repartition topic once"
    );
    let (last, _) = output(&brokers);
    assert_eq!(last, want, "each key's last total is the sum of its inputs");
    assert_eq!(
        changelog_state(&brokers, changelog.topic()),
        want,
        "the changelog folds to the totals"
    );
    let input_committed = committed_offsets(&brokers, "rp-one-group", INPUT, PARTITIONS);
    assert_eq!(
        input_committed.values().sum::<i64>(),
        RECORDS as i64,
        "the input's committed offsets are its ends: {input_committed:?}"
    );
}

#[test]
fn two_instances_sum_exactly_and_each_key_has_one_owner() {
    let broker = broker();
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[INPUT, OUTPUT], PARTITIONS);
    let want = input(&brokers);
    let (repartition, changelog) = job_topics("rp-two");
    ensure_topics(&brokers, &repartition, &changelog);

    let a = member(&brokers, "rp-two-group", &repartition.name, "node-a");
    let b = member(&brokers, "rp-two-group", &repartition.name, "node-b");
    let owned = wait_settled(&[&a, &b], &repartition.name);
    // the instance that owns a key's task of the repartition topic
    let owner_of = |key: &str| -> &str {
        let task = TopicPartition {
            topic: repartition.name.clone(),
            partition: task_of(&key.key_bytes(), PARTITIONS as u32) as i32,
        };
        if owned[0].contains(&task) {
            "node-a"
        } else {
            "node-b"
        }
    };
    run(
        &brokers,
        "rp-two",
        "rp-two-group",
        &[("node-a", a), ("node-b", b)],
    );

    assert_eq!(
        check_repartition_records(&brokers, &repartition.name),
        RECORDS
    );
    let (last, writers) = output(&brokers);
    assert_eq!(last, want, "each key's last total is the sum of its inputs");
    for (key, instances) in &writers {
        assert_eq!(
            instances,
            &BTreeSet::from([owner_of(key).to_string()]),
            "{key} written only by the owner of its task"
        );
    }
    let by: BTreeSet<&String> = writers.values().flatten().collect();
    eprintln!("output written by {by:?}");
    assert_eq!(changelog_state(&brokers, changelog.topic()), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repartition_records_of_a_transaction_that_does_not_commit_are_invisible() {
    use onceflow_connectors::kafka::scale::GroupSourceReader;
    use onceflow_runtime::{Sink, SinkFactory, Source, SourceFactory, SourcePoll};
    use onceflow_testkit::inproc::subtask_info;

    let broker = onceflow_testkit::inproc::start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let sink_config = KafkaSinkConfig::new(brokers.clone(), OUTPUT)
        .mode(DeliveryMode::TransactionalOffsets)
        .transactional_id_prefix("rp-abort");
    let repartition = RepartitionTopic::new("rp-abort", "sum", PARTITIONS);
    ensure_repartition_topics(
        &brokers,
        &ClientProperties::new(),
        std::slice::from_ref(&repartition),
        -1,
    )
    .await
    .expect("repartition topic");
    let lines = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|i| format!("{i},k{},1", i % KEYS)).collect()
    };
    produce_values(&brokers, INPUT, PARTITIONS, &lines(0, 400));

    let member = {
        let brokers = brokers.clone();
        let topic = repartition.name.clone();
        tokio::task::spawn_blocking(move || {
            let m = member(&brokers, "rp-abort-group", &topic, "node-a");
            wait_settled(&[&m], &topic);
            m
        })
        .await
        .expect("member thread")
    };
    let link = OffsetsLink::new();
    let source = KafkaSource::new(brokers.clone(), INPUT, Decoder::raw())
        .transactional_offsets(link.clone())
        .in_group(member.clone());
    let mut reader: GroupSourceReader<KafkaMessage> =
        source.create(&subtask_info(0, 1, 0)).expect("reader");
    let through = Repartition::new(
        repartition.clone(),
        member.clone(),
        link.clone(),
        sink_config.clone(),
    )
    .expect("repartition");
    let mut writer = through
        .writer(|(k, _): &(String, u64)| k.clone())
        .create(&subtask_info(0, 1, 0))
        .expect("writer");
    writer.recover(Vec::new()).await.expect("recovers");

    // reads `n` input records and hands them to the repartition writer
    async fn pass_on<W: Sink<(String, u64)>>(
        reader: &mut GroupSourceReader<KafkaMessage>,
        writer: &mut W,
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
            writer
                .write_batch(batch.into_iter().map(parse).collect())
                .await
                .expect("write");
        }
    }
    let visible = |brokers: String, topic: String, committed: bool| async move {
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, committed).len())
            .await
            .expect("reader thread")
    };

    // checkpoint 1 commits: its repartition records become visible
    pass_on(&mut reader, &mut writer, 400).await;
    reader.snapshot_position(1).expect("position 1");
    let pending = writer
        .pre_commit(1)
        .await
        .expect("pre-commit")
        .expect("pending");
    writer.commit(1, pending).await.expect("commit 1");
    assert_eq!(
        visible(brokers.clone(), repartition.name.clone(), true).await,
        400
    );

    // checkpoint 2's records reach the log, then another incarnation of the instance fences
    // this one before it commits
    produce_values(&brokers, INPUT, PARTITIONS, &lines(400, 800));
    pass_on(&mut reader, &mut writer, 400).await;
    reader.snapshot_position(2).expect("position 2");
    let pending = writer
        .pre_commit(2)
        .await
        .expect("pre-commit")
        .expect("pending");
    let deadline = Instant::now() + Duration::from_secs(60);
    while visible(brokers.clone(), repartition.name.clone(), false).await < 800 {
        assert!(
            Instant::now() < deadline,
            "checkpoint 2's records never reached the log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

    // the aborted records are in the log but read_committed sees only checkpoint 1's,
    // matching the committed input offsets
    assert_eq!(
        visible(brokers.clone(), repartition.name.clone(), true).await,
        400
    );
    assert_eq!(
        visible(brokers.clone(), repartition.name.clone(), false).await,
        800
    );
    let committed = {
        let brokers = brokers.clone();
        tokio::task::spawn_blocking(move || {
            committed_offsets(&brokers, "rp-abort-group", INPUT, PARTITIONS)
        })
        .await
        .expect("offsets thread")
    };
    assert_eq!(committed.values().sum::<i64>(), 400);
    drop(reader);
    drop(source);
    drop(writer);
    drop(through);
    drop(member);
    broker.shutdown().await;
}

#[test]
fn a_repartition_topic_of_the_wrong_shape_is_refused_at_start() {
    let broker = broker();
    let brokers = broker.bootstrap();
    let props = ClientProperties::new();

    create_topics(&brokers, &["shape-sum-repartition"], 3);
    let err = block_on(ensure_repartition_topics(
        &brokers,
        &props,
        &[RepartitionTopic::new("shape", "sum", PARTITIONS)],
        -1,
    ))
    .expect_err("3 partitions refused")
    .to_string();
    assert!(
        err.contains("repartition topic shape-sum-repartition has 3 partitions, the job needs 4"),
        "{err}"
    );

    let compacted = ChangelogTopic::new::<String>("policy", "sum", PARTITIONS);
    block_on(ensure_changelog_topics(
        &brokers,
        &props,
        std::slice::from_ref(&compacted),
        -1,
    ))
    .expect("a compacted topic");
    let err = block_on(ensure_repartition_topics(
        &brokers,
        &props,
        &[RepartitionTopic {
            name: compacted.topic().to_string(),
            partitions: PARTITIONS,
        }],
        -1,
    ))
    .expect_err("cleanup.policy=compact refused")
    .to_string();
    assert!(err.contains("has cleanup.policy=compact"), "{err}");

    let fresh = [RepartitionTopic::new("fresh", "sum", PARTITIONS)];
    block_on(ensure_repartition_topics(&brokers, &props, &fresh, -1)).expect("created");
    block_on(ensure_repartition_topics(&brokers, &props, &fresh, -1)).expect("checked");
}

#[test]
fn a_new_instance_restores_the_tasks_of_the_repartition_topic() {
    // the input has 2 partitions, the repartition topic (and the changelog) 4: a restore that
    // took its tasks from the input would miss the state of tasks 2 and 3
    const NARROW: Input = Input {
        topic: "rp-narrow",
        partitions: 2,
    };
    let broker = broker();
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[NARROW.topic], NARROW.partitions);
    create_topics(&brokers, &[OUTPUT], PARTITIONS);
    let (repartition, changelog) = job_topics("rp-restore");
    ensure_topics(&brokers, &repartition, &changelog);
    let mut sums = BTreeMap::new();

    produce(&brokers, &NARROW, 0, 1_000, &mut sums);
    let a = member_of(
        &brokers,
        &NARROW,
        "rp-restore-group",
        &repartition.name,
        "node-a",
    );
    wait_settled_on(&[&a], &NARROW, &repartition.name);
    run_on(
        &brokers,
        &NARROW,
        1_000,
        "rp-restore",
        "rp-restore-group",
        &[("node-a", a)],
    );
    assert_eq!(output(&brokers).0, sums, "node-a's totals");

    // node-a is gone; node-b, another instance without local state, takes every task once
    // node-a's session expired
    produce(&brokers, &NARROW, 1_000, 2_000, &mut sums);
    let b = member_of(
        &brokers,
        &NARROW,
        "rp-restore-group",
        &repartition.name,
        "node-b",
    );
    wait_settled_on(&[&b], &NARROW, &repartition.name);
    run_on(
        &brokers,
        &NARROW,
        2_000,
        "rp-restore",
        "rp-restore-group",
        &[("node-b", b)],
    );
    assert_eq!(
        output(&brokers).0,
        sums,
        "node-b's totals continue node-a's: the state of every repartition task was restored"
    );
}
