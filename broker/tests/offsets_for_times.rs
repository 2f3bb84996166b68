//! ListOffsets by timestamp is record exact, as in Kafka: rdkafka's `offsets_for_times` over
//! batches of several records with distinct (also non-monotonic) timestamps answers the first
//! record whose timestamp is >= the target, for an uncompressed and an lz4/zstd topic; a raw
//! ListOffsets v7 also checks the answered timestamp is that record's. A zstd batch that
//! inflates to gigabytes (a "zip bomb") gets an error without the broker's memory following it.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::RawClient;
use onceflow_testkit::records::client_config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const T0: i64 = 1_700_000_000_000;

/// Record timestamps (relative to T0), one inner slice per batch, in offset order.
const BATCHES: [&[i64]; 3] = [
    &[0, 10, 20, 30, 40],
    &[100, 110, 120, 130, 140],
    // Non-monotonic: the answer is the first record in offset order that reaches the target.
    &[230, 200, 240, 210, 220],
];

/// Produces BATCHES to `topic` (one flush per batch, so each becomes one RecordBatch).
fn produce(bootstrap: &str, topic: &str, compression: &str) -> Result<()> {
    let producer: BaseProducer = client_config(bootstrap)
        .set("compression.type", compression)
        .set("linger.ms", "1000")
        .set("batch.num.messages", "1000")
        .set("acks", "all")
        .create()?;
    for (b, stamps) in BATCHES.iter().enumerate() {
        for (i, ts) in stamps.iter().enumerate() {
            let value = format!("batch {b} record {i} {}", "x".repeat(200));
            producer
                .send(
                    BaseRecord::<(), _>::to(topic)
                        .payload(&value)
                        .partition(0)
                        .timestamp(T0 + ts),
                )
                .map_err(|(e, _)| e)?;
        }
        producer.flush(Duration::from_secs(20))?;
    }
    Ok(())
}

/// Expected answer by Kafka's rule: first offset whose timestamp is >= target.
fn expected(target: i64) -> Option<(i64, i64)> {
    BATCHES
        .iter()
        .flat_map(|b| b.iter())
        .enumerate()
        .find(|(_, &ts)| T0 + ts >= target)
        .map(|(offset, &ts)| (offset as i64, T0 + ts))
}

fn targets() -> Vec<i64> {
    [
        -5, 0, 1, 10, 25, 40, 41, 99, 100, 115, 140, 141, 199, 200, 205, 215, 230, 235, 240, 241,
    ]
    .iter()
    .map(|d| T0 + d)
    .collect()
}

fn check_topic(broker: &InProcessBroker, topic: &str, compression: &str) -> Result<()> {
    produce(&broker.bootstrap(), topic, compression)?;

    // The log really holds three batches of five records each (else the test proves nothing).
    let mut raw = RawClient::connect(broker.addr())?;
    let (code, hw, mut bytes) = raw.fetch(12, topic, 0, 0)?;
    ensure!(
        code == 0 && hw == 15,
        "fetch: code {code}, high watermark {hw}"
    );
    let batches = RecordBatchDecoder::decode_batch_info(&mut bytes)?;
    let counts: Vec<i32> = batches.iter().map(|b| b.record_count).collect();
    ensure!(
        counts == [5, 5, 5],
        "{topic}: batch record counts {counts:?}"
    );
    if compression != "none" {
        ensure!(
            batches
                .iter()
                .all(|b| b.compression != kafka_protocol::records::Compression::None),
            "{topic}: batches not compressed: {batches:?}"
        );
    }

    // rdkafka offsets_for_times.
    let consumer: BaseConsumer = client_config(&broker.bootstrap())
        .set("group.id", "unused")
        .create()?;
    for target in targets() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Offset(target))?;
        let answer = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
        let got = answer
            .find_partition(topic, 0)
            .context("partition missing in the answer")?;
        ensure!(got.error().is_ok(), "{topic} @{target}: {:?}", got.error());
        let want = match expected(target) {
            Some((offset, _)) => Offset::Offset(offset),
            None => Offset::End,
        };
        ensure!(
            got.offset() == want,
            "{topic} @T0+{}: offsets_for_times answered {:?}, want {want:?}",
            target - T0,
            got.offset()
        );
    }

    // Raw ListOffsets v7: the timestamp is the record's, not the batch max.
    for target in targets() {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(target)])]);
        let resp = raw.request(&req, 7)?;
        let p = &resp.topics[0].partitions[0];
        let want = expected(target).unwrap_or((-1, -1));
        ensure!(
            p.error_code == 0 && (p.offset, p.timestamp) == want,
            "{topic} @T0+{}: ListOffsets v7 answered ({}, {}) code {}, want {want:?}",
            target - T0,
            p.offset,
            p.timestamp,
            p.error_code
        );
    }
    Ok(())
}

#[test]
fn offsets_for_times_is_record_exact_uncompressed() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    check_topic(&broker, "times-none", "none")
}

#[test]
fn offsets_for_times_is_record_exact_lz4_and_zstd() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    check_topic(&broker, "times-lz4", "lz4")?;
    check_topic(&broker, "times-zstd", "zstd")
}

/// Peak resident set size of this process (the in-process broker included), in bytes.
fn peak_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/self/status")?;
    Ok(kib * 1024)
}

/// One zstd RecordBatch v2 of one record whose records section inflates to `frames` times
/// 64 MiB of zeros (the same small frame repeated: zstd decoders read concatenated frames).
fn zstd_bomb_batch(frames: usize, timestamp: i64) -> Result<bytes::Bytes> {
    let frame = zstd::bulk::compress(&vec![0u8; 64 << 20], 19)?;
    let records: Vec<u8> = frame.repeat(frames);
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset
    b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes()); // batch length
    b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // crc, below
    b.extend_from_slice(&4i16.to_be_bytes()); // attributes: zstd
    b.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    b.extend_from_slice(&timestamp.to_be_bytes()); // base timestamp
    b.extend_from_slice(&timestamp.to_be_bytes()); // max timestamp
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&1i32.to_be_bytes()); // record count
    b.extend_from_slice(&records);
    let crc = onceflow_broker::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(bytes::Bytes::from(b))
}

#[test]
fn a_zstd_bomb_gets_an_error_not_the_brokers_memory() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    let topic = "times-bomb";
    let mut raw = RawClient::connect(broker.addr())?;
    // Produce never creates a topic: Metadata does.
    raw.metadata(9, &[topic])?;
    // 64 frames of 64 MiB: 4 GiB once inflated, a few hundred KiB as sent.
    let bomb = zstd_bomb_batch(64, T0)?;
    ensure!(bomb.len() < 1 << 20, "bomb is {} bytes", bomb.len());
    let before_produce = peak_rss()?;
    let produced = raw.produce(9, topic, 0, bomb)?;
    // the batch's records are counted within the topic's inflation cap at Produce: the bomb
    // is refused there (INVALID_RECORD) without inflating it, and nothing is appended
    if produced.error_code == kafka_protocol::error::ResponseError::InvalidRecord.code() {
        let grew = peak_rss()?.saturating_sub(before_produce);
        ensure!(
            grew < 256 << 20,
            "refusing the bomb grew the peak RSS by {grew} bytes"
        );
        return Ok(());
    }
    ensure!(
        produced.error_code == 0,
        "produce: code {}",
        produced.error_code
    );

    let before = peak_rss()?;
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(T0)])]);
    let resp = raw.request(&req, 7)?;
    let p = &resp.topics[0].partitions[0];
    let grew = peak_rss()?.saturating_sub(before);
    ensure!(
        p.error_code == kafka_protocol::error::ResponseError::UnknownServerError.code(),
        "ListOffsets over the bomb answered code {} offset {}",
        p.error_code,
        p.offset
    );
    // The cap is 64 x max.message.bytes (64 MiB by default); inflating would take 4 GiB.
    ensure!(
        grew < 512 << 20,
        "peak resident memory grew by {} MiB while answering",
        grew >> 20
    );
    // The broker still answers, and the log is intact.
    let (code, hw, _) = raw.fetch(12, topic, 0, 0)?;
    ensure!(code == 0 && hw == 1, "fetch after: code {code}, hw {hw}");
    Ok(())
}
