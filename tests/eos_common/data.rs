//! Input data of the exactly-once tests (unique ids over 4 partitions plus malformed records),
//! the paced rdkafka producer, read_committed / read_uncommitted readers and the record-by-record
//! exactly-once checker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// Partitions of every topic of the tests.
pub const PARTITIONS: i32 = 4;

/// One input record.
#[derive(Debug, Clone)]
pub struct InputRecord {
    /// Input partition.
    pub partition: i32,
    /// Kafka key.
    pub key: String,
    /// Value bytes (JSON, or malformed).
    pub value: Vec<u8>,
}

/// The whole input of a scenario and what the output must be.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Records in production order (valid and malformed interleaved).
    pub records: Vec<InputRecord>,
    /// id -> (key, amount) of every valid record.
    pub expected: HashMap<u64, (String, i64)>,
    /// Unique markers `bad#N#` carried by the malformed records (each must reach the DLQ once).
    pub bad_markers: Vec<String>,
}

impl Dataset {
    /// `n` valid records with unique ids (partition = id % 4, 64 keys, amounts -50..=1000) and
    /// `n / 10_000 + 8` malformed ones spread through the input.
    pub fn generate(n: u64, seed: u64) -> Dataset {
        let mut rng = StdRng::seed_from_u64(seed);
        let bad = n / 10_000 + 8;
        let mut records = Vec::with_capacity((n + bad) as usize);
        let mut expected = HashMap::with_capacity(n as usize);
        let mut bad_markers = Vec::new();
        let every = (n / bad).max(1);
        for id in 0..n {
            let key = format!("key-{}", rng.random_range(0..64u32));
            let amount: i64 = rng.random_range(-50..=1000);
            let value = serde_json::json!({ "id": id, "key": key, "amount": amount }).to_string();
            records.push(InputRecord {
                partition: (id % PARTITIONS as u64) as i32,
                key: key.clone(),
                value: value.into_bytes(),
            });
            expected.insert(id, (key, amount));
            if id % every == every / 2 && (bad_markers.len() as u64) < bad {
                let i = bad_markers.len();
                let marker = format!("bad#{i}#");
                let value: Vec<u8> = match i % 4 {
                    0 => format!("{marker} this is not json").into_bytes(),
                    1 => format!(r#"{{"id": "{marker}", "key": "k", "amount": 1}}"#).into_bytes(),
                    2 => format!(r#"{{"key": "{marker}", "amount": 1}}"#).into_bytes(),
                    _ => {
                        let mut v = vec![0xff, 0xfe, 0x00];
                        v.extend_from_slice(marker.as_bytes());
                        v
                    }
                };
                records.push(InputRecord {
                    partition: (i as i32) % PARTITIONS,
                    key: marker.clone(),
                    value,
                });
                bad_markers.push(marker);
            }
        }
        Dataset {
            records,
            expected,
            bad_markers,
        }
    }
}

impl Dataset {
    /// The same expectations with only `records[range]` as input to produce (a part of the
    /// input produced at another moment).
    pub fn part(&self, range: std::ops::Range<usize>) -> Dataset {
        Dataset {
            records: self.records[range].to_vec(),
            ..self.clone()
        }
    }
}

/// Creates `topics` with 4 partitions each (already existing is fine).
pub fn create_topics(bootstrap: &str, topics: &[&str]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(120)));
    let results = futures::executor::block_on(admin.create_topics(&new, &opts))
        .expect("CreateTopics request");
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("create topic {t}: {e}"),
        }
    }
}

/// Produces `data` to `topic` in `chunks` chunks with `pause` between them, on a thread.
pub fn produce_paced(
    bootstrap: &str,
    topic: &str,
    data: &Dataset,
    chunks: usize,
    pause: Duration,
) -> JoinHandle<()> {
    let records = data
        .records
        .iter()
        .map(|r| (Some(r.partition), r.key.clone(), r.value.clone()))
        .collect();
    produce_records_paced(bootstrap, topic, records, chunks, pause)
}

/// One record to produce: its partition (`None`: librdkafka's partitioner over the key), key
/// and value.
pub type Produced = (Option<i32>, String, Vec<u8>);

/// Produces `records` to `topic` with an idempotent producer in `chunks` chunks with `pause`
/// between them, on a thread, so that input keeps arriving while a test acts.
pub fn produce_records_paced(
    bootstrap: &str,
    topic: &str,
    records: Vec<Produced>,
    chunks: usize,
    pause: Duration,
) -> JoinHandle<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "300000")
        .create()
        .expect("input producer");
    let topic = topic.to_string();
    std::thread::spawn(move || {
        let per = records.len().div_ceil(chunks.max(1)).max(1);
        for (i, chunk) in records.chunks(per).enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            for (partition, key, value) in chunk {
                let mut rec = BaseRecord::to(&topic)
                    .key(key.as_bytes())
                    .payload(&value[..]);
                if let Some(p) = partition {
                    rec = rec.partition(*p);
                }
                loop {
                    match producer.send(rec) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            producer.poll(Duration::from_millis(10));
                            rec = back;
                        }
                        Err((e, _)) => panic!("produce input: {e}"),
                    }
                }
            }
            producer.poll(Duration::ZERO);
        }
        producer
            .flush(Duration::from_secs(300))
            .expect("flush input");
    })
}

/// Produces all of `data` now and waits until it is acknowledged.
pub fn produce_all(bootstrap: &str, topic: &str, data: &Dataset) {
    produce_paced(bootstrap, topic, data, 1, Duration::ZERO)
        .join()
        .expect("input producer thread");
}

/// A consumed record.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Value bytes.
    pub value: Vec<u8>,
}

fn consumer(bootstrap: &str, read_committed: bool, eof: bool) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("eos-checker-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", if eof { "true" } else { "false" })
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("checker consumer")
}

fn partitions_of(c: &BaseConsumer, topic: &str) -> Vec<i32> {
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(120))
        .expect("metadata");
    md.topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect()
}

/// Reads `topic` from the beginning to its end (the LSO under read_committed).
pub fn read_topic(bootstrap: &str, topic: &str, read_committed: bool) -> Vec<Consumed> {
    let c = consumer(bootstrap, read_committed, true);
    let parts = partitions_of(&c, topic);
    if parts.is_empty() {
        return Vec::new();
    }
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut at_end: HashSet<i32> = HashSet::new();
    let mut out = Vec::new();
    // a bound on silence, not on the whole read: a big topic on a loaded machine takes long
    let mut progressed = Instant::now();
    while at_end.len() < parts.len() {
        assert!(
            progressed.elapsed() < Duration::from_secs(120),
            "reading {topic} got nothing for 120 s before the end of partitions {:?}",
            parts
                .iter()
                .filter(|p| !at_end.contains(p))
                .collect::<Vec<_>>()
        );
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                progressed = Instant::now();
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            Some(Ok(m)) => {
                progressed = Instant::now();
                at_end.remove(&m.partition());
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    value: m.payload().unwrap_or_default().to_vec(),
                });
            }
        }
    }
    out
}

/// Output record fields.
#[derive(Debug, Clone)]
pub struct OutRecord {
    /// `id`.
    pub id: u64,
    /// `key`.
    pub key: String,
    /// `amount`.
    pub amount: i64,
    /// `total`.
    pub total: i64,
}

/// Parses an output value `{"id","key","amount","total"}`.
pub fn parse_output(value: &[u8]) -> Option<OutRecord> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    Some(OutRecord {
        id: v.get("id")?.as_u64()?,
        key: v.get("key")?.as_str()?.to_string(),
        amount: v.get("amount")?.as_i64()?,
        total: v.get("total")?.as_i64()?,
    })
}

/// What the checker found, record by record.
#[derive(Debug, Default)]
pub struct Report {
    /// Output records read.
    pub output_records: usize,
    /// Output records that did not parse.
    pub unparsable: Vec<String>,
    /// Expected ids never seen.
    pub missing: Vec<u64>,
    /// Ids seen more than once, with their count.
    pub duplicated: Vec<(u64, usize)>,
    /// Ids in the output that were never input, or with a different key/amount.
    pub unexpected: Vec<String>,
    /// Keys whose last total differs from the sum of their inputs: (key, last, sum).
    pub wrong_totals: Vec<(String, i64, i64)>,
    /// Output records whose total is not the previous total of the key plus the amount.
    pub broken_chains: Vec<String>,
    /// Keys that appear on more than one output partition.
    pub split_keys: Vec<String>,
    /// DLQ records read.
    pub dlq_records: usize,
    /// Malformed markers not in the DLQ.
    pub dlq_missing: Vec<String>,
    /// Malformed markers in the DLQ more than once.
    pub dlq_duplicated: Vec<(String, usize)>,
    /// DLQ records that carry no marker of a malformed input.
    pub dlq_unexpected: usize,
}

impl Report {
    /// Every id exactly once, every total right, every malformed record in the DLQ once.
    pub fn is_exact(&self) -> bool {
        self.unparsable.is_empty()
            && self.missing.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.wrong_totals.is_empty()
            && self.broken_chains.is_empty()
            && self.split_keys.is_empty()
            && self.dlq_missing.is_empty()
            && self.dlq_duplicated.is_empty()
            && self.dlq_unexpected == 0
    }

    /// Nothing lost (at-least-once): every id and every malformed marker seen at least once.
    pub fn nothing_lost(&self) -> bool {
        self.missing.is_empty() && self.dlq_missing.is_empty()
    }
}

fn first<T: fmt::Debug>(v: &[T]) -> String {
    format!("{} {:?}", v.len(), &v[..v.len().min(8)])
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "output records {}, dlq records {}",
            self.output_records, self.dlq_records
        )?;
        writeln!(f, "  unparsable output: {}", first(&self.unparsable))?;
        writeln!(f, "  missing ids: {}", first(&self.missing))?;
        writeln!(
            f,
            "  duplicated ids (id, count): {}",
            first(&self.duplicated)
        )?;
        writeln!(f, "  unexpected records: {}", first(&self.unexpected))?;
        writeln!(
            f,
            "  wrong last totals (key, last, sum): {}",
            first(&self.wrong_totals)
        )?;
        writeln!(f, "  broken running totals: {}", first(&self.broken_chains))?;
        writeln!(
            f,
            "  keys on several partitions: {}",
            first(&self.split_keys)
        )?;
        writeln!(f, "  dlq missing: {}", first(&self.dlq_missing))?;
        writeln!(f, "  dlq duplicated: {}", first(&self.dlq_duplicated))?;
        write!(f, "  dlq records without a marker: {}", self.dlq_unexpected)
    }
}

/// Checks `output` and `dlq` (consumed in offset order per partition) against `data`.
pub fn check(data: &Dataset, output: &[Consumed], dlq: &[Consumed]) -> Report {
    let mut r = Report {
        output_records: output.len(),
        dlq_records: dlq.len(),
        ..Report::default()
    };
    let mut by_partition: BTreeMap<i32, Vec<&Consumed>> = BTreeMap::new();
    for c in output {
        by_partition.entry(c.partition).or_default().push(c);
    }
    let mut counts: HashMap<u64, usize> = HashMap::new();
    let mut last_total: HashMap<String, i64> = HashMap::new();
    let mut key_partition: HashMap<String, i32> = HashMap::new();
    let mut split: HashSet<String> = HashSet::new();
    for (partition, mut recs) in by_partition {
        recs.sort_by_key(|c| c.offset);
        for c in recs {
            let Some(o) = parse_output(&c.value) else {
                r.unparsable
                    .push(String::from_utf8_lossy(&c.value).into_owned());
                continue;
            };
            *counts.entry(o.id).or_default() += 1;
            match data.expected.get(&o.id) {
                Some((k, a)) if *k == o.key && *a == o.amount => {}
                _ => r.unexpected.push(format!(
                    "p{partition}@{}: {}",
                    c.offset,
                    String::from_utf8_lossy(&c.value)
                )),
            }
            if *key_partition.entry(o.key.clone()).or_insert(partition) != partition {
                split.insert(o.key.clone());
            }
            let prev = last_total.get(&o.key).copied().unwrap_or(0);
            if prev + o.amount != o.total && r.broken_chains.len() < 1000 {
                r.broken_chains.push(format!(
                    "p{partition}@{} id {} key {}: previous total {prev} + amount {} != total {}",
                    c.offset, o.id, o.key, o.amount, o.total
                ));
            }
            last_total.insert(o.key, o.total);
        }
    }
    let mut sums: HashMap<&str, i64> = HashMap::new();
    for (id, (key, amount)) in &data.expected {
        *sums.entry(key.as_str()).or_default() += amount;
        match counts.get(id) {
            None => r.missing.push(*id),
            Some(1) => {}
            Some(n) => r.duplicated.push((*id, *n)),
        }
    }
    r.missing.sort_unstable();
    r.duplicated.sort_unstable();
    for (key, sum) in sums {
        let last = last_total.get(key).copied().unwrap_or(0);
        if last != sum {
            r.wrong_totals.push((key.to_string(), last, sum));
        }
    }
    r.wrong_totals.sort();
    r.split_keys = split.into_iter().collect();
    r.split_keys.sort();

    let mut dlq_counts: HashMap<&str, usize> = HashMap::new();
    for c in dlq {
        let text = String::from_utf8_lossy(&c.value);
        match data.bad_markers.iter().find(|m| text.contains(m.as_str())) {
            Some(m) => *dlq_counts.entry(m.as_str()).or_default() += 1,
            None => r.dlq_unexpected += 1,
        }
    }
    for m in &data.bad_markers {
        match dlq_counts.get(m.as_str()) {
            None => r.dlq_missing.push(m.clone()),
            Some(1) => {}
            Some(n) => r.dlq_duplicated.push((m.clone(), *n)),
        }
    }
    r
}

/// Ids (and DLQ markers) visible in `output` / `dlq`, for waiting until a run is complete.
pub fn seen_ids(data: &Dataset, output: &[Consumed], dlq: &[Consumed]) -> (usize, usize) {
    let ids: HashSet<u64> = output
        .iter()
        .filter_map(|c| parse_output(&c.value).map(|o| o.id))
        .filter(|id| data.expected.contains_key(id))
        .collect();
    let markers: HashSet<&str> = dlq
        .iter()
        .filter_map(|c| {
            let text = String::from_utf8_lossy(&c.value);
            data.bad_markers
                .iter()
                .find(|m| text.contains(m.as_str()))
                .map(|m| m.as_str())
        })
        .collect();
    (ids.len(), markers.len())
}
