//! Restore from the changelog: an instance that takes over a job's tasks from a stopped one
//! (another instance id, no checkpoint directory) starts its keyed operators from the tasks'
//! changelog partitions, so its totals continue where the other instance's committed ones
//! ended, and its changelog keeps folding to the job's whole keyed state. An instance with a
//! local changelog cache restores from it and reads only the changelog's tail, whether the
//! cache is current, stale (another instance owned the tasks since) or damaged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceflow_broker::BrokerConfig;
use onceflow_connectors::kafka::scale::{
    ensure_changelog_topics, ChangelogCache, ChangelogTopic, InstanceMember, MemberConfig,
    RebalanceListener, StateChangelog, TopicPartition,
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
    run_cached_instance(brokers, instance, upto, None);
}

/// Changelog records the restore of one run read from Kafka and took from the cache.
#[derive(Debug, Clone, Copy)]
struct Restored {
    from_changelog: u64,
    from_cache: u64,
}

/// [`run_instance`] with a local changelog cache in `cache` (positions moved at every commit).
fn run_cached_instance(
    brokers: &str,
    instance: &str,
    upto: i64,
    cache: Option<&std::path::Path>,
) -> Restored {
    let topics = vec![ChangelogTopic::new::<String>(PREFIX, REDUCE, PARTITIONS)];
    block_on(ensure_changelog_topics(
        brokers,
        &ClientProperties::new(),
        &topics,
        -1,
    ))
    .expect("changelog topics");
    let member = member(brokers, instance);
    let link = OffsetsLink::new();
    let mut changelog = StateChangelog::new(link.clone(), topics).restoring_from(
        brokers,
        ClientProperties::new(),
        member.clone(),
    );
    if let Some(dir) = cache {
        let cache = ChangelogCache::open(dir)
            .expect("cache dir")
            .advance_every(Duration::ZERO);
        changelog = changelog.with_cache(Arc::new(cache));
    }
    let changelog = Arc::new(changelog);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let job = {
        let brokers = brokers.to_string();
        let member = member.clone();
        let txn_prefix = format!("{PREFIX}-{instance}");
        let changelog = changelog.clone();
        std::thread::spawn(move || {
            let config = JobConfig::new("restore")
                .parallelism(2)
                .checkpoint_interval(Duration::from_millis(200))
                .state_changelog(changelog);
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
    let (from_changelog, from_cache) = changelog.restored_records();
    Restored {
        from_changelog,
        from_cache,
    }
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

fn start_broker() -> (InProcessBroker, String) {
    let broker = InProcessBroker::start(BrokerConfig {
        default_partitions: PARTITIONS,
        ..BrokerConfig::default()
    })
    .expect("broker");
    let brokers = broker.bootstrap();
    create_topics(&brokers, &[INPUT, OUTPUT], PARTITIONS);
    (broker, brokers)
}

#[test]
fn a_restart_with_the_cache_reads_only_the_changelog_tail() {
    let (_broker, brokers) = start_broker();
    let cache = tempfile::tempdir().expect("cache dir");
    let mut sums = BTreeMap::new();

    produce(&brokers, 0, 1_000, &mut sums);
    let first = run_cached_instance(&brokers, "node-a", 1_000, Some(cache.path()));
    assert_eq!(last_totals(&brokers), sums);
    assert_eq!(first.from_cache, 0, "{first:?}");
    let written = read_topic(&brokers, &format!("{PREFIX}-{REDUCE}-changelog"), true).len();
    assert!(written >= KEYS, "{written} changelog records");

    // the same instance again: every key from the cache, nothing left to read (the position
    // moved at the last commit)
    produce(&brokers, 1_000, 2_000, &mut sums);
    let again = run_cached_instance(&brokers, "node-a", 2_000, Some(cache.path()));
    assert_eq!(
        last_totals(&brokers),
        sums,
        "totals after a restore from the cache"
    );
    assert_eq!(again.from_cache, KEYS as u64, "{again:?}");
    assert_eq!(again.from_changelog, 0, "{again:?}");
}

#[test]
fn a_stale_cache_is_brought_up_to_date_from_the_changelog() {
    let (_broker, brokers) = start_broker();
    let cache_a = tempfile::tempdir().expect("cache dir");
    let cache_b = tempfile::tempdir().expect("cache dir");
    let mut sums = BTreeMap::new();

    produce(&brokers, 0, 1_000, &mut sums);
    run_cached_instance(&brokers, "node-a", 1_000, Some(cache_a.path()));
    // node-b owns the tasks for a while: node-a's cache misses its changes
    produce(&brokers, 1_000, 2_000, &mut sums);
    run_cached_instance(&brokers, "node-b", 2_000, Some(cache_b.path()));
    assert_eq!(last_totals(&brokers), sums);

    produce(&brokers, 2_000, 3_000, &mut sums);
    let back = run_cached_instance(&brokers, "node-a", 3_000, Some(cache_a.path()));
    assert_eq!(
        last_totals(&brokers),
        sums,
        "node-a's totals include node-b's changes, read from the changelog over its cache"
    );
    assert_eq!(back.from_cache, KEYS as u64, "{back:?}");
    assert!(back.from_changelog >= KEYS as u64, "{back:?}");
}

#[test]
fn a_damaged_cache_is_ignored() {
    let (_broker, brokers) = start_broker();
    let cache = tempfile::tempdir().expect("cache dir");
    let mut sums = BTreeMap::new();

    produce(&brokers, 0, 1_000, &mut sums);
    run_cached_instance(&brokers, "node-a", 1_000, Some(cache.path()));
    // every file: one cut short to half, one overwritten in its middle, the rest garbage
    let mut files: Vec<_> = std::fs::read_dir(cache.path())
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert_eq!(files.len(), PARTITIONS as usize, "{files:?}");
    for (i, f) in files.iter().enumerate() {
        let mut bytes = std::fs::read(f).expect("cache file");
        match i {
            0 => bytes.truncate(bytes.len() / 2),
            1 => {
                let mid = bytes.len() / 2;
                bytes[mid..].iter_mut().take(16).for_each(|b| *b ^= 0x5a);
            }
            _ => bytes = b"not a cache file".to_vec(),
        }
        std::fs::write(f, bytes).expect("damage");
    }

    produce(&brokers, 1_000, 2_000, &mut sums);
    let again = run_cached_instance(&brokers, "node-a", 2_000, Some(cache.path()));
    assert_eq!(
        last_totals(&brokers),
        sums,
        "totals after a restore with a damaged cache"
    );
    assert!(again.from_changelog > 0, "{again:?}");
}
