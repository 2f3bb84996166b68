//! Windowed counts, Kafka -> Kafka, exactly once: reads JSON click events `{"user", "ts",
//! "amount"}` and writes, per user, the count and sum of every 1-minute tumbling window and
//! of every session (gap 30 s) in event time (`ts`, ms), as JSON `{"kind", "user", "start",
//! "end", "count", "sum"}` keyed by user. Watermarks are tracked per Kafka partition (bounded
//! out-of-orderness, `--out-of-orderness-ms`), a partition quiet for `--idle-timeout-ms` does
//! not hold them back, and events later than `--allowed-lateness-ms` go to `<output>.late`.
//! Window contents and timers are part of every checkpoint; the sink commits Kafka
//! transactions with the checkpoints (two-phase commit).
//!
//! `cargo run --release --example windowed_counts` alone starts an embedded reference broker
//! and a demo generator (event time runs 20x faster than the wall clock, so windows close
//! every few seconds), runs for `--run-seconds` (default 20) and prints what a read_committed
//! consumer sees. With `--brokers HOST:PORT` it runs against that cluster until stopped
//! (SIGTERM or Ctrl-C: final checkpoint and commit, exit 0). The job runs on the library's
//! Kafka job builder ([`onceflow::job`]): the standard flags, start-up checks, takeover of a
//! running instance and restore are the library's; this file holds the windows and the demo.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use onceflow::operators::window::{AggregateFunction, WindowAssigner, WindowResult};
use onceflow::prelude::*;
use onceflow::runtime::WatermarkStrategy;
use serde::{Deserialize, Serialize};

/// Command line: the standard Kafka job flags, the event-time settings and the demo's.
#[derive(Parser, Debug)]
#[command(about = "Exactly-once windowed counts per user: 1-minute windows and 30 s sessions")]
struct Args {
    #[command(flatten)]
    kafka: KafkaJobArgs,
    /// How far events may be out of order within a partition.
    #[arg(long, default_value_t = 5000)]
    out_of_orderness_ms: u64,
    /// A partition without records for this long stops holding the watermark back.
    #[arg(long, default_value_t = 2000)]
    idle_timeout_ms: u64,
    /// Late events within this time re-fire their window with an updated result.
    #[arg(long, default_value_t = 0)]
    allowed_lateness_ms: u64,
    /// Stop (final checkpoint + commit) after this many seconds (embedded default: 20).
    #[arg(long)]
    run_seconds: Option<u64>,
    /// Embedded mode: demo events generated per second.
    #[arg(long, default_value_t = 1000)]
    demo_rate: u64,
}

/// An input event.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Click {
    user: String,
    ts: i64,
    amount: i64,
}

/// A consumed record: the event (or `None` if it does not parse) and its partition.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Input {
    partition: i32,
    ts: i64,
    click: Option<Click>,
}

/// An output record.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Count {
    kind: String,
    user: String,
    start: i64,
    end: i64,
    count: u64,
    sum: i64,
}

struct CountSum;

impl AggregateFunction<Click> for CountSum {
    type Acc = (u64, i64);
    type Out = (u64, i64);
    fn create(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), c: Click) {
        acc.0 += 1;
        acc.1 = acc.1.saturating_add(c.amount);
    }
    fn merge(&self, a: (u64, i64), b: (u64, i64)) -> (u64, i64) {
        (a.0 + b.0, a.1.saturating_add(b.1))
    }
    fn result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
}

fn to_record(kind: &'static str) -> impl Fn(WindowResult<String, (u64, i64)>) -> SinkRecord {
    move |r| {
        let c = Count {
            kind: kind.to_string(),
            user: r.key.clone(),
            start: r.window.start,
            end: r.window.end,
            count: r.value.0,
            sum: r.value.1,
        };
        let value = serde_json::to_vec(&c).unwrap_or_default();
        SinkRecord::new(Some(r.key.into_bytes()), value)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

mod demo_support;
use demo_support::say;

fn main() {
    let args = Args::parse();
    let rate = args.demo_rate;
    let run_for = args
        .run_seconds
        .or(args.kafka.brokers.is_none().then_some(20));
    // event time from the payload's `ts` (the Kafka timestamp if it does not parse),
    // watermarks per partition, idle partitions left out of the minimum
    let watermarks = WatermarkStrategy::bounded_out_of_orderness(
        Duration::from_millis(args.out_of_orderness_ms),
        |i: &Input| i.ts,
    )
    .with_splits(|i: &Input| i.partition.max(0) as u32)
    .with_idleness(Duration::from_millis(args.idle_timeout_ms));
    let lateness = Duration::from_millis(args.allowed_lateness_ms);
    KafkaJob::new("windowed-counts", args.kafka)
        .decoder(Decoder::new(decode))
        .watermarks(watermarks)
        .demo(move |at| demo_support::start_demo(at, rate, demo::event(), demo::Windows::default()))
        .main(move |input, out| {
            // keyed through the library: a scaled-out instance keeps the windows' state in
            // Kafka by the user's task
            let by_user = out.key_by(&input.flat_map(|i: Input| i.click), |c: &Click| {
                c.user.clone()
            });
            let minutes = by_user
                .window(WindowAssigner::tumbling(Duration::from_secs(60)), |c| c.ts)
                .allowed_lateness(lateness)
                .aggregate("per-minute", CountSum);
            let sessions = by_user
                .window(WindowAssigner::session(Duration::from_secs(30)), |c| c.ts)
                .allowed_lateness(lateness)
                .aggregate("sessions", CountSum);
            let late_topic = format!("{}.late", out.output_topic());
            let late = minutes.late_records().map(move |c: Click| {
                let value = serde_json::to_vec(&c).unwrap_or_default();
                SinkRecord::new(Some(c.user.into_bytes()), value).to_topic(late_topic.clone())
            });
            let results = minutes.results().map(to_record("minute"));
            out.sink(
                "kafka-out",
                &results
                    .union(&sessions.results().map(to_record("session")))
                    .union(&late),
            );
            if let Some(d) = run_for.map(Duration::from_secs) {
                let stop = out.stop_handle();
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    say(format!(
                        "{} s elapsed: stopping with a final checkpoint",
                        d.as_secs()
                    ));
                    stop.stop();
                });
            }
        })
}

/// A consumed message as the job's input record.
fn decode(m: &KafkaMessage) -> Input {
    let click = m
        .payload
        .as_deref()
        .and_then(|p| serde_json::from_slice::<Click>(p).ok());
    Input {
        partition: m.partition,
        ts: click.as_ref().map(|c| c.ts).or(m.timestamp_ms).unwrap_or(0),
        click,
    }
}

/// The embedded demo: the input events and a tally of the read_committed output.
mod demo {
    use super::*;
    use crate::demo_support::Tally;

    /// Event `i`: 40 users, each active in bursts (so sessions close), event time 20 ms apart
    /// per event (20x the wall clock at 1000/s) and up to 2 s out of order.
    pub fn event() -> impl FnMut(u64) -> (String, String) + Send + 'static {
        let base = now_ms();
        move |i| {
            let id = i as i64;
            let user = format!("user-{}", (id / 200 + id % 4) % 40);
            let ts = base + id * 20 - (id * 7919 % 100) * 20;
            let value = format!(
                r#"{{"user":"{user}","ts":{ts},"amount":{}}}"#,
                id % 100 - 20
            );
            (user, value)
        }
    }

    /// Minute windows, sessions and windows seen twice in the output.
    #[derive(Default)]
    pub struct Windows {
        seen: HashSet<(String, String, i64)>,
        minutes: u64,
        sessions: u64,
        repeats: u64,
        events: u64,
    }

    impl Tally for Windows {
        fn record(&mut self, payload: &[u8]) {
            let Ok(c) = serde_json::from_slice::<Count>(payload) else {
                return;
            };
            match c.kind.as_str() {
                "minute" => {
                    self.minutes += 1;
                    self.events += c.count;
                }
                _ => self.sessions += 1,
            }
            if !self.seen.insert((c.kind, c.user, c.start)) {
                self.repeats += 1;
            }
        }
        fn summary(&self) -> String {
            format!(
                "{} minute windows ({} events), {} sessions, {} repeated windows",
                self.minutes, self.events, self.sessions, self.repeats
            )
        }
    }
}
