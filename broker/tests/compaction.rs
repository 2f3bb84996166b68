//! Log compaction over TCP with rdkafka: a `cleanup.policy=compact` topic fed with keyed
//! updates, tombstones, aborted and committed transactions. Once the broker's cleaner logs
//! that the partition settled at the log end, reading from the beginning (read_committed and
//! read_uncommitted) gives exactly the latest record of each live key at its original offset:
//! no superseded value, no tombstone (delete.retention.ms has passed), no aborted record.
//!
//! The crash test kills -9 the broker binary while the cleaner is paused at a failpoint
//! (cleaned copy written, or swap file in place), restarts it on the same data dir, and checks
//! the same result with no lost or duplicated offset.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_testkit::broker_process::{BrokerProcess, Storage, TXN_DEBUG_LOG};
use onceflow_testkit::clients::{assign, consumer_with, send_retrying, T};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

const TOPIC: &str = "compacted";
const DELETE_RETENTION_MS: &str = "300";

/// Records each delivered operation's offset (the opaque is the operation's index).
#[derive(Default)]
struct Offsets(Mutex<HashMap<usize, i64>>);

#[derive(Clone, Default)]
struct Ctx(Arc<Offsets>);

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, r: &DeliveryResult<'_>, op: Box<usize>) {
        let m = r
            .as_ref()
            .unwrap_or_else(|(e, _)| panic!("delivery failed: {e}"));
        self.0 .0.lock().unwrap().insert(*op, m.offset());
    }
}

/// What was produced: per operation its key and value (None = tombstone), and whether its
/// transaction was aborted.
#[derive(Default)]
struct Workload {
    ops: Vec<(String, Option<String>, bool)>,
    ctx: Ctx,
}

impl Workload {
    fn producer(&self, bootstrap: &str, txn_id: Option<&str>) -> BaseProducer<Ctx> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "60000");
        if let Some(id) = txn_id {
            cfg.set("transactional.id", id)
                .set("transaction.timeout.ms", "60000");
        }
        let p: BaseProducer<Ctx> = cfg.create_with_context(self.ctx.clone()).expect("producer");
        if txn_id.is_some() {
            p.init_transactions(T).expect("init_transactions");
        }
        p
    }

    fn send(&mut self, p: &BaseProducer<Ctx>, key: String, value: Option<String>, aborted: bool) {
        let op = self.ops.len();
        self.ops.push((key.clone(), value.clone(), aborted));
        let mut rec: BaseRecord<'_, [u8], [u8], Box<usize>> =
            BaseRecord::with_opaque_to(TOPIC, Box::new(op))
                .partition(0)
                .key(key.as_bytes());
        if let Some(v) = &value {
            rec = rec.payload(v.as_bytes());
        }
        send_retrying(p, rec);
    }

    /// `updates` updates of `keys` keys (every tenth a tombstone), an aborted and a committed
    /// transaction after the first half, another pair at the end.
    fn produce(&mut self, bootstrap: &str, updates: usize, keys: usize) {
        let plain = self.producer(bootstrap, None);
        let aborter = self.producer(bootstrap, Some("compaction-aborter"));
        let committer = self.producer(bootstrap, Some("compaction-committer"));
        for half in 0..2 {
            for i in half * updates / 2..(half + 1) * updates / 2 {
                let key = format!("k{:05}", i % keys);
                let value = (i % 10 != 7).then(|| format!("v{i}"));
                self.send(&plain, key, value, false);
            }
            flush(&plain);
            aborter.begin_transaction().expect("begin");
            for k in 0..50 {
                self.send(
                    &aborter,
                    format!("k{k:05}"),
                    Some(format!("aborted-{half}")),
                    true,
                );
            }
            flush(&aborter);
            aborter.abort_transaction(T).expect("abort");
            committer.begin_transaction().expect("begin");
            for t in 0..100 / (half + 1) {
                self.send(
                    &committer,
                    format!("t{t:05}"),
                    Some(format!("c{half}-{t}")),
                    false,
                );
            }
            flush(&committer);
            committer.commit_transaction(T).expect("commit");
        }
    }

    /// The latest live record of each key: offset -> (key, value).
    fn expected(&self) -> BTreeMap<i64, (String, String)> {
        let offsets = self.ctx.0 .0.lock().unwrap();
        let mut latest: HashMap<&str, usize> = HashMap::new();
        for (op, (key, _, aborted)) in self.ops.iter().enumerate() {
            if !aborted {
                latest.insert(key, op);
            }
        }
        latest
            .values()
            .filter_map(|&op| {
                let (key, value, _) = &self.ops[op];
                let value = value.clone()?;
                Some((offsets[&op], (key.clone(), value)))
            })
            .collect()
    }
}

fn flush(p: &BaseProducer<Ctx>) {
    p.poll(Duration::from_millis(0));
    p.flush(T).expect("flush");
}

/// The topic's log settings: tiny segments rolled after 200 ms, tombstones kept 300 ms.
fn topic_configs() -> Vec<(&'static str, &'static str)> {
    vec![
        ("cleanup.policy", "compact"),
        ("segment.bytes", "65536"),
        ("segment.ms", "200"),
        ("delete.retention.ms", DELETE_RETENTION_MS),
        ("min.cleanable.dirty.ratio", "0.01"),
    ]
}

fn create_topic(bootstrap: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    let mut topic = NewTopic::new(TOPIC, 1, TopicReplication::Fixed(1));
    for (k, v) in topic_configs() {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(T));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let res = rt
        .block_on(admin.create_topics([&topic], &opts))
        .expect("create");
    assert!(res.iter().all(Result::is_ok), "create topic: {res:?}");
}

/// Reads the partition from the beginning to the end of the log: offset -> (key, value);
/// panics on a tombstone or a repeated offset.
fn read_all(bootstrap: &str, read_committed: bool) -> BTreeMap<i64, (String, String)> {
    let c = consumer_with(bootstrap, read_committed, true);
    assign(&c, &[(TOPIC, 0)]);
    let mut out = BTreeMap::new();
    let mut last = -1;
    let deadline = Instant::now() + T;
    loop {
        assert!(
            Instant::now() < deadline,
            "no end of partition within {T:?}"
        );
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return out,
            Some(Err(e)) => panic!("consume: {e}"),
            Some(Ok(m)) => {
                assert!(
                    m.offset() > last,
                    "offsets must increase: {} after {last}",
                    m.offset()
                );
                last = m.offset();
                let key = String::from_utf8_lossy(m.key().expect("keyed")).into_owned();
                let value = m
                    .payload()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| panic!("tombstone of {key} at {last} survived"));
                out.insert(m.offset(), (key, value));
            }
        }
    }
}

fn log_end(bootstrap: &str) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer");
    c.fetch_watermarks(TOPIC, 0, T).expect("watermarks").1
}

fn check(bootstrap: &str, expected: &BTreeMap<i64, (String, String)>) {
    for read_committed in [true, false] {
        let got = read_all(bootstrap, read_committed);
        if &got != expected {
            let missing: Vec<_> = expected
                .iter()
                .filter(|(o, _)| !got.contains_key(o))
                .take(5)
                .collect();
            let extra: Vec<_> = got
                .iter()
                .filter(|(o, _)| !expected.contains_key(o))
                .take(5)
                .collect();
            panic!(
                "read_committed={read_committed}: {} records, expected {}; missing {missing:?}, \
                 unexpected {extra:?}",
                got.len(),
                expected.len()
            );
        }
    }
}

fn settled_line(end: i64) -> String {
    format!("cleaner settled {TOPIC}-0 at offset {end}")
}

#[test]
fn compaction_keeps_the_latest_live_record_of_each_key_at_its_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let broker = BrokerProcess::durable_txn_debug(&data, &["--log-cleaner-backoff-ms", "50"]);
    create_topic(broker.bootstrap());
    let mut w = Workload::default();
    w.produce(broker.bootstrap(), 100_000, 1_000);
    let end = log_end(broker.bootstrap());
    // The cleaner rolls the last segment after segment.ms and cleans up to the log end.
    broker.wait_for_log(&settled_line(end), 1, Duration::from_secs(300));
    let expected = w.expected();
    assert_eq!(
        expected.len(),
        900 + 100,
        "live keys: 900 k-keys and 100 t-keys"
    );
    check(broker.bootstrap(), &expected);
}

/// The failpoint's cleaned-copy file is on disk right now (the kill lands on that state).
fn has_file(dir: &Path, ext: &str) -> bool {
    std::fs::read_dir(dir.join(format!("{TOPIC}-0")))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(ext))
        })
        .unwrap_or(false)
}

fn crash_at(point: &str, ext: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::builder(Storage::durable(&data))
        .args(&["--log-cleaner-backoff-ms", "50"])
        .env("ONCEFLOW_TEST_CLEANER_FAILPOINT", point)
        .rust_log(TXN_DEBUG_LOG)
        .spawn()
        .expect("broker starts");
    create_topic(broker.bootstrap());
    let mut w = Workload::default();
    w.produce(broker.bootstrap(), 5_000, 200);
    let end = log_end(broker.bootstrap());
    let line = format!("test failpoint: cleaner {}", point.replace('-', " "));
    broker.wait_for_log(&line, 1, Duration::from_secs(120));
    assert!(has_file(&data, ext), "no .{ext} file at the failpoint");
    broker.kill9().expect("kill -9 the broker");

    // Restart in process on the same data dir: the topic's configs (cleanup.policy=compact and
    // the cleaner settings of CreateTopics) come back from `topics.configs`.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = onceflow_broker::BrokerConfig::default();
    config.storage.data_dir = Some(data.clone());
    config.storage.cleaner_interval = Some(Duration::from_millis(50));
    let handle = rt
        .block_on(onceflow_broker::start(config))
        .expect("restart");
    assert!(
        !has_file(&data, "cleaned") && !has_file(&data, "swap"),
        "recovery left files"
    );
    let bootstrap = handle.bootstrap_servers();
    assert_eq!(log_end(&bootstrap), end, "log end survives");
    let store = handle.store().clone();
    let mut lc = store.default_log_config();
    for (k, v) in topic_configs() {
        assert!(lc.apply(k, v), "{k}");
    }
    let restored = store
        .partition(TOPIC, 0)
        .expect("partition after restart")
        .log_config();
    assert_eq!(*restored, lc, "the topic's configs survive the restart");
    // Polled condition: a pass over the whole log with nothing left to remove (bounded only
    // against a hang; each wait is for a delete horizon the pass reported).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the log did not settle");
        match store.clean_now(TOPIC, 0).expect("clean") {
            Some(r) if r.cleaned_up_to == end && r.next_due.is_none() => break,
            Some(r) if r.next_due.is_some() => {
                let wait = r.next_due.unwrap_or(0) - now_ms();
                std::thread::sleep(Duration::from_millis(wait.clamp(1, 1_000) as u64));
            }
            // The tail is still in the active segment until the segment.ms roll.
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    check(&bootstrap, &w.expected());
    rt.block_on(handle.shutdown());
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[test]
fn kill9_at_cleaner_failpoints_then_restart_gives_the_same_log() {
    crash_at("before-swap", "cleaned");
    crash_at("mid-swap", "swap");
}

#[test]
fn a_compacted_topic_refuses_records_without_a_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let broker = BrokerProcess::durable_txn_debug(&data, &[]);
    create_topic(broker.bootstrap());
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    // One batch each: a refused batch fails as a whole.
    p.send(
        BaseRecord::<(), str>::to(TOPIC)
            .partition(0)
            .payload("no key"),
    )
    .map_err(|(e, _)| e)
    .expect("enqueue");
    p.flush(T).expect("flush");
    p.send(
        BaseRecord::<str, str>::to(TOPIC)
            .partition(0)
            .key("k")
            .payload("keyed"),
    )
    .map_err(|(e, _)| e)
    .expect("enqueue");
    p.flush(T).expect("flush");
    // Only the keyed record is in the log.
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .expect("consumer");
    let (_, high) = c.fetch_watermarks(TOPIC, 0, T).expect("watermarks");
    assert_eq!(high, 1, "the keyless record was refused");
}

/// Counts delivery failures by error code (librdkafka's number).
#[derive(Clone, Default)]
struct FailureCounts(Arc<Mutex<BTreeMap<i32, usize>>>);

impl ClientContext for FailureCounts {}

impl ProducerContext for FailureCounts {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((KafkaError::MessageProduction(code), _)) = result {
            *self.0.lock().unwrap().entry(*code as i32).or_default() += 1;
        }
    }
}

/// KIP-467: a batch refused for some of its records names them (Produce `record_errors`), so
/// the client fails exactly those with INVALID_RECORD and the rest of the batch with
/// INVALID_DIFFERENT_RECORD (they may be retried), as librdkafka's test 0011 expects.
#[test]
fn a_refused_batch_names_its_keyless_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = BrokerProcess::durable_txn_debug(&dir.path().join("data"), &[]);
    create_topic(broker.bootstrap());
    let counts = FailureCounts::default();
    let p: BaseProducer<FailureCounts> = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("message.timeout.ms", "60000")
        .set("linger.ms", "30000")
        .set("batch.num.messages", "10")
        .create_with_context(counts.clone())
        .expect("producer");
    // ten records in one batch (batch.num.messages), records 3 and 7 without a key
    for i in 0..10 {
        let value = format!("v{i}");
        let key = format!("k{i}");
        let mut rec = BaseRecord::<str, str>::to(TOPIC)
            .partition(0)
            .payload(&value);
        if i != 3 && i != 7 {
            rec = rec.key(&key);
        }
        p.send(rec).map_err(|(e, _)| e).expect("enqueue");
    }
    p.flush(T).expect("flush");
    let counts = counts.0.lock().unwrap().clone();
    assert_eq!(
        counts.get(&(RDKafkaErrorCode::InvalidRecord as i32)),
        Some(&2),
        "{counts:?}"
    );
    assert_eq!(
        counts.get(&(RDKafkaErrorCode::InvalidDifferentRecord as i32)),
        Some(&8),
        "{counts:?}"
    );
}
