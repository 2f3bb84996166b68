//! Restore from the changelog: an instance that takes over a job's tasks from a stopped one
//! (another instance id, no checkpoint directory) starts its keyed operators from the tasks'
//! changelog partitions, so its totals continue where the other instance's committed ones
//! ended, and its changelog keeps folding to the job's whole keyed state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_broker::BrokerConfig;
use onceflow_connectors::kafka::scale::{
    ensure_changelog_topics, ChangelogTopic, InstanceMember, MemberConfig, RebalanceListener,
    StateChangelog, TopicPartition,
};
use onceflow_connectors::kafka::{
    ClientProperties, Decoder, DeliveryMode, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource,
    OffsetsLink, SinkRecord,
};
use onceflow_operators::{KeyBy, Map};
use onceflow_runtime::{JobConfig, StreamEnvironment};
use onceflow_testkit::clients::{committed_offsets, create_topics, produce_values, read_topic};
use onceflow_testkit::inproc::{block_on, InProcessBroker};

const INPUT: &str = "rs-in";
const OUTPUT: &str = "rs-out";
const GROUP: &str = "rs-group";
const PARTITIONS: i32 = 4;
const KEYS: usize = 29;
const PREFIX: &str = "rs-job";
/// The reduce node of the pipeline below: source n00, map n01, reduce n02.
const REDUCE: &str = "n02-reduce";

struct Quiet;

impl RebalanceListener for Quiet {
    fn revoking(&self, _partitions: &[TopicPartition], _lost: bool) {}
    fn assigned(&self, _partitions: &[TopicPartition]) {}
}

/// Produces lines `from..to` (`key,amount`) and adds them to `sums`.
fn produce(brokers: &str, from: usize, to: usize, sums: &mut BTreeMap<String, u64>) {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let key = format!("k{}", i % KEYS);
            let amount = (i % 7) as u64 + 1;
            *sums.entry(key.clone()).or_insert(0) += amount;
            format!("{key},{amount}")
        })
        .collect();
    produce_values(brokers, INPUT, PARTITIONS, &values);
}

fn parse(m: KafkaMessage) -> (String, u64) {
    let line = String::from_utf8(m.payload.unwrap_or_default()).unwrap_or_default();
    let (k, a) = line.split_once(',').unwrap_or(("", "0"));
    (k.to_string(), a.parse().unwrap_or(0))
}

fn committed_total(brokers: &str) -> i64 {
    committed_offsets(brokers, GROUP, INPUT, PARTITIONS)
        .values()
        .sum()
}

fn member(brokers: &str, instance: &str) -> InstanceMember {
    let mut config = MemberConfig::new(brokers, GROUP, vec![INPUT.into()], instance);
    config.session_timeout = Duration::from_secs(6);
    let m = InstanceMember::start(&config, Arc::new(Quiet), INPUT).expect("member");
    // the dataflow is built for the assignment: wait for it (all partitions: no other live
    // instance)
    let deadline = Instant::now() + Duration::from_secs(90);
    while m.member().owned().len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "{instance} owns {:?}",
            m.member().owned()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

/// Runs one instance of the job until the group committed `upto` input records, then stops it.
fn run_instance(brokers: &str, instance: &str, upto: i64) {
    let topics = vec![ChangelogTopic::new::<String>(PREFIX, REDUCE, PARTITIONS)];
    block_on(ensure_changelog_topics(
        brokers,
        &ClientProperties::new(),
        &topics,
        -1,
    ))
    .expect("changelog topics");
    let member = member(brokers, instance);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let job = {
        let brokers = brokers.to_string();
        let member = member.clone();
        let txn_prefix = format!("{PREFIX}-{instance}");
        std::thread::spawn(move || {
            let link = OffsetsLink::new();
            let changelog = StateChangelog::new(link.clone(), topics).restoring_from(
                brokers.clone(),
                ClientProperties::new(),
                member.clone(),
            );
            let config = JobConfig::new("restore")
                .parallelism(2)
                .checkpoint_interval(Duration::from_millis(200))
                .state_changelog(Arc::new(changelog));
            let env = StreamEnvironment::new(config);
            let sink = KafkaSink::new(
                KafkaSinkConfig::new(brokers.clone(), OUTPUT)
                    .mode(DeliveryMode::TransactionalOffsets)
                    .transactional_id_prefix(txn_prefix),
            )
            .offsets_link(link.clone());
            env.source(
                "input",
                KafkaSource::new(brokers.clone(), INPUT, Decoder::raw())
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
            let _ = stop_tx.send(env.stop_handle());
            env.execute_blocking()
        })
    };
    let stop = stop_rx.recv().expect("stop handle");
    let deadline = Instant::now() + Duration::from_secs(120);
    while committed_total(brokers) < upto {
        assert!(
            !job.is_finished(),
            "{instance} ended early: {:?}",
            job.join().map(|r| r.map(|_| ()))
        );
        assert!(Instant::now() < deadline, "{instance}: input not committed");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.stop();
    job.join().expect("job thread").expect("job runs");
}

/// The last committed total per key in the output.
fn last_totals(brokers: &str) -> BTreeMap<String, u64> {
    let mut last = BTreeMap::new();
    for r in read_topic(brokers, OUTPUT, true) {
        last.insert(
            String::from_utf8(r.key).expect("utf8"),
            String::from_utf8(r.value)
                .expect("utf8")
                .parse::<u64>()
                .expect("total"),
        );
    }
    last
}

#[test]
fn a_new_instance_continues_the_totals_from_the_changelog() {
    let broker = InProcessBroker::start(BrokerConfig {
        default_partitions: PARTITIONS,
        ..BrokerConfig::default()
    })
    .expect("broker");
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[INPUT, OUTPUT], PARTITIONS);
    let mut sums = BTreeMap::new();

    produce(&brokers, 0, 1_000, &mut sums);
    run_instance(&brokers, "node-a", 1_000);
    assert_eq!(last_totals(&brokers), sums, "node-a's totals");

    // node-a is gone; node-b, a different instance without any local state, takes its tasks
    produce(&brokers, 1_000, 2_000, &mut sums);
    run_instance(&brokers, "node-b", 2_000);
    assert_eq!(
        last_totals(&brokers),
        sums,
        "node-b's totals continue node-a's: its state came from the changelog"
    );
}
