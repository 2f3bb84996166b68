//! The record-by-record exactly-once checker of `exactly_once_etl`'s output: every id exactly
//! once, every running total right, every key on one partition, every malformed input in the
//! DLQ exactly once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use crate::clients::Consumed;
use crate::eos::Dataset;

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
