//! Shared pieces of the txn_size benchmark: clocks, percentiles, topics, payloads and the
//! read_committed visibility watcher.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Offset, TopicPartitionList};

/// Microseconds since the Unix epoch (the clock both sides of a latency share).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Nearest-rank percentile of an ascending slice (NaN when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// p50 and p99 of unsorted samples.
pub fn p50_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

/// Deletes `topics` (every point uses fresh names; deleting them keeps the in-memory broker's
/// footprint to one point's data). Failures are logged, not fatal.
pub fn delete_topics(rt: &tokio::runtime::Runtime, brokers: &str, topics: &[&str]) {
    let admin: AdminClient<DefaultClientContext> = match ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
    {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "creating the admin client to delete topics");
            return;
        }
    };
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    if let Err(e) = rt.block_on(admin.delete_topics(topics, &opts)) {
        tracing::warn!(error = %e, ?topics, "deleting a point's topics");
    }
}

/// Clock ticks per second of /proc/<pid>/stat's times (`getconf CLK_TCK`, else 100).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// CPU seconds (user + system) process `pid` used so far, from /proc/<pid>/stat (also
/// readable while the process is a zombie, before it is reaped).
pub fn process_cpu_seconds(pid: u32, ticks: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command name (which may hold spaces) start at the last ')'
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
}

/// Creates `topics` with `partitions` partitions (an existing topic is an error: every point
/// uses fresh names).
pub fn create_topics(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    topics: &[&str],
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("creating the admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = rt
        .block_on(admin.create_topics(new.iter(), &opts))
        .context("CreateTopics")?;
    for r in results {
        if let Err((t, e)) = r {
            anyhow::bail!("creating topic {t}: {e}");
        }
    }
    Ok(())
}

/// A read_committed consumer assigned to every partition of a topic from the beginning.
pub fn committed_reader(
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("txn-size-watch-{topic}"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.error.backoff.ms", "5")
        // librdkafka's default (1 s) stalls a consumer whose local queue reached 100k records
        // for the rest of that second: the watcher then saw the output at ~120k records/s
        // whatever the job did
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .context("creating the read_committed watcher")?;
    // learn the partitions' leader before assigning: librdkafka asks a partition's start
    // offset (ListOffsets for `Beginning`) only once it knows the leader, and a partition
    // assigned before that waits out a fixed 500 ms retry, which a job that starts beside
    // the watcher then appeared to spend in its start-up
    c.fetch_metadata(Some(topic), Duration::from_secs(30))
        .with_context(|| format!("metadata of {topic} for the read_committed watcher"))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

/// Polls `c` until `on` returns true or `deadline`; calls `on` with each message (None after
/// an empty poll) and the microsecond clock at which it became visible. Returns false on
/// deadline.
pub fn watch(
    c: &BaseConsumer,
    deadline: Instant,
    mut on: impl FnMut(Option<&BorrowedMessage<'_>>, u64) -> bool,
) -> anyhow::Result<bool> {
    while Instant::now() < deadline {
        let done = match c.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => on(Some(&m), now_us()),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "watcher poll");
                on(None, now_us())
            }
            None => on(None, now_us()),
        };
        if done {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A pipeline input value: the example's JSON padded with a `pad` field to `size` bytes
/// (the example ignores unknown fields).
pub fn input_json(id: u64, size: usize) -> Vec<u8> {
    let key = format!("customer-{}", id % 64);
    let head = format!(
        r#"{{"id":{id},"key":"{key}","amount":{},"pad":""#,
        (id % 100) as i64 - 20
    );
    let tail = "\"}";
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut v = Vec::with_capacity(size.max(head.len() + tail.len()));
    v.extend_from_slice(head.as_bytes());
    v.resize(v.len() + pad, b'x');
    v.extend_from_slice(tail.as_bytes());
    v
}

/// The key the pipeline input uses for record `id`.
pub fn input_key(id: u64) -> String {
    format!("customer-{}", id % 64)
}

/// One measured point of the grid.
#[derive(Clone, Debug)]
pub struct Point {
    /// "memory", "durable" or "external".
    pub storage: String,
    /// Value bytes per record.
    pub record_bytes: usize,
    /// raw-txn, raw-copy, none, at-least-once, transactional-offsets or two-phase-commit.
    pub mode: String,
    /// Checkpoint interval (pipeline) in ms; None for the raw producer.
    pub interval_ms: Option<u64>,
    /// Records per transaction per producer (raw: configured; pipeline: records/s x interval /
    /// parallelism; raw-copy: NaN).
    pub records_per_txn: f64,
    /// End-to-end records per second.
    pub records_per_s: f64,
    /// Commit latency p50 / p99 in ms (NaN when the mode commits nothing).
    pub commit_ms: (f64, f64),
    /// End-to-end latency p50 / p99 in ms.
    pub e2e_ms: (f64, f64),
    /// Records measured (throughput phase).
    pub records: u64,
    /// Seconds from the job process' start to its first output visible to a read_committed
    /// consumer (NaN for the in-process raw producer).
    pub startup_s: f64,
    /// Seconds from the job process' start to its whole backlog visible.
    pub run_s: f64,
    /// Seconds of the throughput phase (start-up excluded).
    pub steady_s: f64,
    /// CPU seconds (user + system) of the job process per million records, over the steady
    /// part (NaN for the in-process raw producer).
    pub cpu_s_per_m: f64,
    /// Repetition index of this row (0-based).
    pub rep: usize,
}

impl Point {
    /// One tab-separated line (NaN as `NaN`), read back by [`Point::from_tsv`].
    pub fn to_tsv(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.storage,
            self.record_bytes,
            self.mode,
            self.interval_ms.map_or(-1, |i| i as i64),
            self.records_per_txn,
            self.records_per_s,
            self.commit_ms.0,
            self.commit_ms.1,
            self.e2e_ms.0,
            self.e2e_ms.1,
            self.records,
            self.startup_s,
            self.run_s,
            self.steady_s,
            self.cpu_s_per_m,
            self.rep
        )
    }

    /// Parses a line of [`Point::to_tsv`].
    pub fn from_tsv(line: &str) -> anyhow::Result<Point> {
        let f: Vec<&str> = line.split('\t').collect();
        anyhow::ensure!(f.len() == 16, "expected 16 tab-separated fields: {line}");
        let n = |i: usize| -> anyhow::Result<f64> {
            f[i].parse::<f64>()
                .with_context(|| format!("field {i} of {line}"))
        };
        let interval = f[3].parse::<i64>()?;
        Ok(Point {
            storage: f[0].to_string(),
            record_bytes: f[1].parse()?,
            mode: f[2].to_string(),
            interval_ms: u64::try_from(interval).ok(),
            records_per_txn: n(4)?,
            records_per_s: n(5)?,
            commit_ms: (n(6)?, n(7)?),
            e2e_ms: (n(8)?, n(9)?),
            records: f[10].parse()?,
            startup_s: n(11)?,
            run_s: n(12)?,
            steady_s: n(13)?,
            cpu_s_per_m: n(14)?,
            rep: f[15].parse()?,
        })
    }
}
