//! A produced batch whose header counts more records than it holds (here 1000 with one
//! record inside, lastOffsetDelta matching the count) is refused as Kafka's log validator
//! refuses it, INVALID_RECORD from Produce v8 on, and nothing is appended: the partition's
//! end stays where it was, on a plain topic (uncompressed batch) and on a compacted one
//! (compressed batch).

use anyhow::{ensure, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::CreateTopicsRequest;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::{topic_name, RawClient};

const INVALID_RECORD: i16 = 87;

/// One record, its header rewritten to claim `claimed` records (lastOffsetDelta and count),
/// with a valid CRC: only the records present give the lie away.
fn lying_batch(compression: Compression, claimed: i32) -> Result<Bytes> {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        key: Some(Bytes::from_static(b"k")),
        value: Some(Bytes::from_static(b"v")),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, &[record], &options)?;
    buf[23..27].copy_from_slice(&(claimed - 1).to_be_bytes());
    buf[57..61].copy_from_slice(&claimed.to_be_bytes());
    let crc = onceflow_broker::crc32c(&buf[21..]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(buf.freeze())
}

fn create_topic(client: &mut RawClient, name: &str, compacted: bool) -> Result<()> {
    let configs = compacted
        .then(|| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("cleanup.policy"))
                .with_value(Some(StrBytes::from_static_str("compact")))
        })
        .into_iter()
        .collect();
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(configs)]);
    let code = client.request(&req, 5)?.topics[0].error_code;
    ensure!(code == 0, "CreateTopics {name}: {code}");
    Ok(())
}

#[test]
fn a_batch_counting_more_records_than_it_holds_is_refused_and_not_appended() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    let mut client = RawClient::connect(broker.addr())?;
    for (topic, compacted, compression) in [
        ("plain", false, Compression::None),
        ("compacted", true, Compression::Lz4),
    ] {
        create_topic(&mut client, topic, compacted)?;
        let answer = client.produce(9, topic, 0, lying_batch(compression, 1000)?)?;
        ensure!(
            answer.error_code == INVALID_RECORD,
            "{topic}: Produce v9 answered {} ({:?})",
            answer.error_code,
            answer.error_message
        );
        let (code, high_watermark, records) = client.fetch(11, topic, 0, 0)?;
        ensure!(
            code == 0 && high_watermark == 0 && records.is_empty(),
            "{topic}: something was appended (error {code}, high watermark {high_watermark})"
        );
        // An honest batch still goes in, at offset 0.
        let answer = client.produce(9, topic, 0, lying_batch(compression, 1)?)?;
        ensure!(
            answer.error_code == 0 && answer.base_offset == 0,
            "{topic}: honest batch: {answer:?}"
        );
    }
    Ok(())
}
