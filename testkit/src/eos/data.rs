//! Input data of the exactly-once scenarios: unique ids over 4 partitions plus malformed
//! records, and producing it (paced, so that input keeps arriving while a test acts).

use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clients::produce_records_paced;

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
        Self::generate_keys(n, 64, seed)
    }

    /// [`Dataset::generate`] over `keys` keys (`key-0` to `key-{keys-1}`).
    pub fn generate_keys(n: u64, keys: u32, seed: u64) -> Dataset {
        let mut rng = StdRng::seed_from_u64(seed);
        let bad = n / 10_000 + 8;
        let mut records = Vec::with_capacity((n + bad) as usize);
        let mut expected = HashMap::with_capacity(n as usize);
        let mut bad_markers = Vec::new();
        let every = (n / bad).max(1);
        for id in 0..n {
            let key = format!("key-{}", rng.random_range(0..keys.max(1)));
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
    /// The same records, each on the partition Kafka's default partitioner gives its key
    /// (murmur2 of the key bytes): input partitioned by the key, as a scaled-out job without
    /// a repartition topic needs it.
    pub fn partitioned_by_key(&self) -> Dataset {
        let mut d = self.clone();
        for r in &mut d.records {
            r.partition =
                onceflow_connectors::kafka::scale::task_of(r.key.as_bytes(), PARTITIONS as u32)
                    as i32;
        }
        d
    }

    /// The same records spread round-robin over `partitions` partitions (record `i` of the
    /// input on partition `i % partitions`), for a topic with another partition count.
    pub fn spread_over(&self, partitions: i32) -> Dataset {
        let mut d = self.clone();
        for (i, r) in d.records.iter_mut().enumerate() {
            r.partition = (i as i32) % partitions;
        }
        d
    }

    /// The same expectations with only `records[range]` as input to produce (a part of the
    /// input produced at another moment).
    pub fn part(&self, range: std::ops::Range<usize>) -> Dataset {
        Dataset {
            records: self.records[range].to_vec(),
            ..self.clone()
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

/// Produces all of `data` now and waits until it is acknowledged.
pub fn produce_all(bootstrap: &str, topic: &str, data: &Dataset) {
    produce_paced(bootstrap, topic, data, 1, Duration::ZERO)
        .join()
        .expect("input producer thread");
}
