//! Exactly-once ETL, Kafka -> Kafka: reads JSON `{"id", "key", "amount"}` records, keeps a
//! running total per key (checkpointed keyed state) and writes `{"id", "key", "amount",
//! "total"}` keyed by key; records that do not parse go to `<output>.dlq` in the same
//! transactions.
//!
//! `cargo run --release --example exactly_once_etl` alone starts an embedded reference broker
//! and a demo input generator and prints live progress. With `--brokers HOST:PORT` it runs
//! against that cluster until stopped (SIGTERM or Ctrl-C: final checkpoint and commit, exit
//! 0). The start-up protocol, the flags and the stdout lines are the library's
//! ([`onceflow::job`], docs/JOBS.md); this file holds the business logic and the demo input.

/// Records are allocated and freed on different threads: mimalloc (`onceflow::JobAllocator`)
/// takes about a third less CPU per record than the system allocator here.
#[global_allocator]
static ALLOC: onceflow::JobAllocator = onceflow::JobAllocator;

use std::collections::HashSet;

use clap::Parser;
use onceflow::prelude::*;
use serde::{Deserialize, Serialize};

/// Command line: the standard Kafka job flags and the demo's rate.
#[derive(Parser, Debug)]
#[command(about = "Exactly-once Kafka -> Kafka ETL: running totals per key")]
struct Args {
    #[command(flatten)]
    kafka: KafkaJobArgs,
    /// Embedded mode: demo records generated per second.
    #[arg(long, default_value_t = 2000, env = "ONCEFLOW_DEMO_RATE")]
    demo_rate: u64,
}

/// An input record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Input {
    id: u64,
    key: String,
    amount: i64,
}

/// An output record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Output {
    id: u64,
    key: String,
    amount: i64,
    total: i64,
}

/// An output record as written (borrows the key instead of copying it).
#[derive(Serialize)]
struct OutputRef<'a> {
    id: u64,
    key: &'a str,
    amount: i64,
    total: i64,
}

/// A parsed input, or a dead letter.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Parsed {
    Good(Input),
    Bad { key: Option<Vec<u8>>, raw: Vec<u8> },
}

/// The key under which dead letters travel (one key: their order is kept).
const DLQ_KEY: &str = "\u{0}dead-letters";

mod demo_support;

fn main() {
    let args = Args::parse();
    let rate = args.demo_rate;
    KafkaJob::new("etl", args.kafka)
        .demo(move |at| demo_support::start_demo(at, rate, demo::record, demo::Ids::default()))
        .main(|input, out| {
            let dlq = out.dead_letter_topic();
            let parsed = input.map(parse);
            let records = out
                .key_by(&parsed, |r: &Parsed| match r {
                    Parsed::Good(i) => i.key.clone(),
                    Parsed::Bad { .. } => DLQ_KEY.to_string(),
                })
                .process(
                    "totals",
                    move |r: Parsed, ctx: &mut KeyedContext<'_, String, SinkRecord>| {
                        let record = match r {
                            Parsed::Good(i) => running_total(i, ctx)?,
                            Parsed::Bad { key, raw } => {
                                SinkRecord::new(key, raw).to_topic(dlq.clone())
                            }
                        };
                        ctx.emit(record);
                        Ok(())
                    },
                );
            out.sink("kafka-out", &records);
        })
}

/// Parses a message; what does not parse becomes a dead letter.
fn parse(m: KafkaMessage) -> Parsed {
    match m.payload.as_deref().map(serde_json::from_slice::<Input>) {
        Some(Ok(i)) => Parsed::Good(i),
        _ => Parsed::Bad {
            key: m.key,
            raw: m.payload.unwrap_or_default(),
        },
    }
}

/// Adds the record to its key's total (keyed state) and writes the output record.
fn running_total(
    i: Input,
    ctx: &mut KeyedContext<'_, String, SinkRecord>,
) -> onceflow::runtime::Result<SinkRecord> {
    let total = {
        let mut st = ctx.value::<i64>("total")?;
        let t = st.get().copied().unwrap_or(0).saturating_add(i.amount);
        st.set(t);
        t
    };
    let out = OutputRef {
        id: i.id,
        key: &i.key,
        amount: i.amount,
        total,
    };
    // sized for a typical record: no regrowing while writing
    let mut value = Vec::with_capacity(96 + i.key.len());
    serde_json::to_writer(&mut value, &out).map_err(Error::serialization)?;
    Ok(SinkRecord::new(Some(i.key.into_bytes()), value))
}

/// The embedded demo: the input records and a tally of the read_committed output.
mod demo {
    use super::*;
    use crate::demo_support::Tally;

    /// Demo record `id` (every 500th does not parse).
    pub fn record(id: u64) -> (String, String) {
        let key = format!("customer-{}", id % 8);
        let value = if id % 500 == 499 {
            format!("not json {id}")
        } else {
            format!(
                r#"{{"id":{id},"key":"{key}","amount":{}}}"#,
                (id % 100) as i64 - 20
            )
        };
        (key, value)
    }

    /// Records, distinct ids and duplicated ids of the output.
    #[derive(Default)]
    pub struct Ids {
        ids: HashSet<u64>,
        records: u64,
        dups: u64,
    }

    impl Tally for Ids {
        fn record(&mut self, payload: &[u8]) {
            self.records += 1;
            if let Ok(o) = serde_json::from_slice::<Output>(payload) {
                if !self.ids.insert(o.id) {
                    self.dups += 1;
                }
            }
        }
        fn summary(&self) -> String {
            format!(
                "{} records, {} distinct ids, {} duplicates",
                self.records,
                self.ids.len(),
                self.dups
            )
        }
    }
}
