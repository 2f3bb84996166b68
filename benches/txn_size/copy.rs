//! The ceiling of the `none` mode: a raw rdkafka consume-and-produce copy loop, no framework.
//! The benchmark starts its own binary with `--copy-child` as the job process; one thread
//! per partition reads the input (read_committed, like the job's source) and writes every
//! record unchanged to the same partition of the output with an idempotent producer (like
//! the at-least-once sink), until `--copy-max-records` records were copied. Stdout follows
//! the job's contract as far as the benchmark reads it: `job started`, then `copied N`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// What the copy child does.
pub struct CopySpec {
    /// Bootstrap servers.
    pub brokers: String,
    /// Input topic.
    pub input: String,
    /// Output topic (same partition count).
    pub output: String,
    /// Threads = partitions.
    pub parallelism: usize,
    /// Stop after this many records.
    pub max_records: u64,
}

fn copy_partition(
    s: &CopySpec,
    partition: i32,
    copied: &AtomicU64,
    ready: &Barrier,
) -> anyhow::Result<()> {
    let made = (|| -> anyhow::Result<(BaseConsumer, BaseProducer)> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &s.brokers)
            .set("group.id", format!("copy-{}", s.input))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "50")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .context("creating the copy consumer")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&s.input, partition, Offset::Beginning)?;
        c.assign(&tpl)?;
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &s.brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("delivery.report.only.error", "true")
            .create()
            .context("creating the copy producer")?;
        Ok((c, p))
    })();
    ready.wait();
    let (c, p) = made?;
    while copied.load(Ordering::Relaxed) < s.max_records {
        let Some(m) = c.poll(Duration::from_millis(10)) else {
            p.poll(Duration::ZERO);
            continue;
        };
        let m = m.context("consuming the input")?;
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&s.output).partition(partition);
        if let Some(k) = m.key() {
            rec = rec.key(k);
        }
        if let Some(v) = m.payload() {
            rec = rec.payload(v);
        }
        if let Timestamp::CreateTime(t) = m.timestamp() {
            rec = rec.timestamp(t);
        }
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    p.poll(Duration::from_millis(1));
                    rec = r;
                }
                Err((e, _)) => return Err(e).context("producing to the output"),
            }
        }
        p.poll(Duration::ZERO);
        copied.fetch_add(1, Ordering::Relaxed);
    }
    while p.in_flight_count() > 0 {
        p.poll(Duration::from_millis(1));
    }
    Ok(())
}

/// Runs the copy loop until `max_records` records were copied; prints `job started` once
/// every thread's consumer and producer exist.
pub fn run_child(s: CopySpec) -> anyhow::Result<()> {
    let s = Arc::new(s);
    let copied = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(s.parallelism + 1));
    let threads: Vec<_> = (0..s.parallelism as i32)
        .map(|part| {
            let (s, copied, ready) = (s.clone(), copied.clone(), ready.clone());
            std::thread::spawn(move || copy_partition(&s, part, &copied, &ready))
        })
        .collect();
    ready.wait();
    println!("job started");
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a copy thread panicked"))??;
    }
    println!("copied {}", copied.load(Ordering::Relaxed));
    Ok(())
}
