//! The ceiling of the `none` mode: a raw rdkafka consume-and-produce copy loop, no framework.
//! The benchmark starts its own binary with `--copy-child` as the job process; one thread
//! per partition (the pipeline's parallelism) reads the input with the consumer settings of
//! the job's Kafka source (read_committed, no auto commit, 50 ms fetch wait, 10 ms fetch
//! queue back-off) and writes every record unchanged to the same partition of the output
//! with the producer settings of the `none` sink (`acks=1`, no idempotence, `linger.ms=5`,
//! only failed deliveries reported). Like the job's source and sink it works in batches:
//! up to [`BATCH`] records taken from the consumer without waiting, all sent, then one
//! `poll` of the producer per batch. It stops once `--copy-max-records` records were copied
//! and acknowledged. Stdout follows the job's contract as far as the benchmark reads it:
//! `job started`, then `copied N`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Records taken from the consumer before the producer is served: the runtime's default
/// batch size (`RuntimeConfig::batch_size`), the most a source hands the sink at once.
const BATCH: usize = 256;

/// How long a full local producer queue is retried before the copy gives up.
const QUEUE_FULL_LIMIT: Duration = Duration::from_secs(60);

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

fn consumer(s: &CopySpec, partition: i32) -> anyhow::Result<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("group.id", format!("copy-{}", s.input))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .context("creating the copy consumer")?;
    // what a user's consumer does first, and the job's source too: read the topic's
    // metadata. A partition assigned before librdkafka knows its leader has its start offset
    // asked only after a fixed 500 ms retry, which would count as the copy loop's start-up
    c.fetch_metadata(Some(&s.input), Duration::from_secs(30))
        .with_context(|| format!("metadata of {}", s.input))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&s.input, partition, Offset::Beginning)?;
    c.assign(&tpl)?;
    Ok(c)
}

fn producer(s: &CopySpec) -> anyhow::Result<BaseProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("acks", "1")
        .set("linger.ms", "5")
        .set("delivery.report.only.error", "true")
        .set("message.timeout.ms", "120000")
        .create()
        .context("creating the copy producer")
}

/// Sends `m` unchanged to `partition` of `topic`, serving the producer while its local
/// queue is full.
fn send(
    p: &BaseProducer,
    topic: &str,
    partition: i32,
    m: &BorrowedMessage<'_>,
) -> anyhow::Result<()> {
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(partition);
    if let Some(k) = m.key() {
        rec = rec.key(k);
    }
    if let Some(v) = m.payload() {
        rec = rec.payload(v);
    }
    if let Timestamp::CreateTime(t) = m.timestamp() {
        rec = rec.timestamp(t);
    }
    let mut deadline: Option<Instant> = None;
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now()
                    < *deadline.get_or_insert_with(|| Instant::now() + QUEUE_FULL_LIMIT) =>
            {
                p.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(1));
                rec = back;
            }
            Err((e, _)) => return Err(e).context("producing to the output"),
        }
    }
}

fn copy_partition(
    s: &CopySpec,
    partition: i32,
    copied: &AtomicU64,
    ready: &Barrier,
) -> anyhow::Result<()> {
    let made = consumer(s, partition).and_then(|c| Ok((c, producer(s)?)));
    ready.wait();
    let (c, p) = made?;
    while copied.load(Ordering::Relaxed) < s.max_records {
        // wait for the first record of a batch, then take what is already there
        let Some(first) = c.poll(Duration::from_millis(10)) else {
            p.poll(Duration::ZERO);
            continue;
        };
        send(
            &p,
            &s.output,
            partition,
            &first.context("consuming the input")?,
        )?;
        let mut n = 1;
        while n < BATCH {
            let Some(m) = c.poll(Duration::ZERO) else {
                break;
            };
            send(&p, &s.output, partition, &m.context("consuming the input")?)?;
            n += 1;
        }
        p.poll(Duration::ZERO);
        copied.fetch_add(n as u64, Ordering::Relaxed);
    }
    // every copied record acknowledged before the process reports it is done
    while p.in_flight_count() > 0 {
        p.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
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
