//! Raw wire-protocol behaviour a client library hides: KIP-511 ApiVersions fallback, closing
//! on unknown APIs/versions and oversized frames (while other connections keep working),
//! the advertised listener, acks=0, and Fetch long polling with empty record bytes.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchRequest, FetchResponse, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use onceflow_broker::{BrokerConfig, BrokerHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A minimal Kafka client speaking raw frames.
struct Raw {
    stream: TcpStream,
    correlation: i32,
}

impl Raw {
    async fn connect(broker: &BrokerHandle) -> Result<Self> {
        Ok(Self {
            stream: TcpStream::connect(broker.local_addr()).await?,
            correlation: 0,
        })
    }

    async fn send_frame(&mut self, payload: &[u8]) -> Result<()> {
        let mut frame = BytesMut::with_capacity(4 + payload.len());
        frame.put_i32(payload.len() as i32);
        frame.put_slice(payload);
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    async fn send<T: Encodable>(&mut self, key: ApiKey, version: i16, body: &T) -> Result<i32> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("raw-test")));
        let mut payload = BytesMut::new();
        header.encode(&mut payload, key.request_header_version(version))?;
        body.encode(&mut payload, version)?;
        self.send_frame(&payload).await?;
        Ok(self.correlation)
    }

    /// The next response frame, or None when the broker closed the connection.
    async fn recv(&mut self, within: Duration) -> Result<Option<Bytes>> {
        let read = async {
            let mut size = [0u8; 4];
            if self.stream.read_exact(&mut size).await.is_err() {
                return Ok::<_, anyhow::Error>(None);
            }
            let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
            self.stream.read_exact(&mut body).await?;
            Ok(Some(Bytes::from(body)))
        };
        tokio::time::timeout(within, read)
            .await
            .context("no response in time")?
    }

    async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> Result<Resp> {
        let correlation = self.send(key, version, body).await?;
        let mut frame = self
            .recv(Duration::from_secs(10))
            .await?
            .context("connection closed")?;
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))?;
        ensure!(
            header.correlation_id == correlation,
            "correlation {} != {correlation}",
            header.correlation_id
        );
        let resp = Resp::decode(&mut frame, version)?;
        ensure!(
            !frame.has_remaining(),
            "{} trailing bytes",
            frame.remaining()
        );
        Ok(resp)
    }

    async fn is_closed(&mut self) -> bool {
        matches!(self.recv(Duration::from_secs(10)).await, Ok(None))
    }
}

fn batch(values: &[&str]) -> Result<Bytes> {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch only while offset minus sequence stays
            // the same; a batch without a producer id carries base sequence -1.
            sequence: i as i32 - 1,
            timestamp: 1_000 + i as i64,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )?;
    Ok(buf.freeze())
}

fn produce_request(topic: &str, acks: i16, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])])
}

fn fetch_request(topic: &str, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.into())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_negotiation_follows_kip_511() -> Result<()> {
    let broker = onceflow_broker::start(BrokerConfig::default()).await?;
    let mut c = Raw::connect(&broker).await?;

    // A version above the supported range: UNSUPPORTED_VERSION and the ranges, v0 body.
    // (a future client: header v2 naming version 127, then a body this test can encode)
    let correlation = 41;
    let mut payload = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(ApiKey::ApiVersions as i16)
        .with_request_api_version(127)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("future-client")))
        .encode(&mut payload, 2)?;
    ApiVersionsRequest::default().encode(&mut payload, 3)?;
    c.send_frame(&payload).await?;
    let mut frame = c.recv(Duration::from_secs(10)).await?.context("closed")?;
    let header = ResponseHeader::decode(&mut frame, 0)?;
    ensure!(header.correlation_id == correlation);
    let v0 = ApiVersionsResponse::decode(&mut frame, 0)?;
    ensure!(v0.error_code == 35, "error code {}", v0.error_code);
    let range = |r: &ApiVersionsResponse, key: ApiKey| {
        r.api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| (k.min_version, k.max_version))
    };
    ensure!(range(&v0, ApiKey::ApiVersions) == Some((0, 3)));

    // The same connection then negotiates v3 normally.
    let v3: ApiVersionsResponse = c
        .call(
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("raw-test"))
                .with_client_software_version(StrBytes::from_static_str("1")),
        )
        .await?;
    ensure!(v3.error_code == 0);
    ensure!(range(&v3, ApiKey::Produce) == Some((3, 9)));
    ensure!(range(&v3, ApiKey::Fetch) == Some((4, 12)));
    ensure!(
        range(&v3, ApiKey::DeleteGroups).is_none(),
        "advertises an unimplemented API"
    );
    broker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_close_only_their_connection() -> Result<()> {
    let config = BrokerConfig {
        max_request_bytes: 4096,
        ..BrokerConfig::default()
    };
    let broker = onceflow_broker::start(config).await?;

    // Unknown API key.
    let mut c = Raw::connect(&broker).await?;
    c.send_frame(&[0x03, 0xe7, 0, 0, 0, 0, 0, 1, 0xff, 0xff])
        .await?;
    ensure!(c.is_closed().await, "unknown api key did not close");

    // A known API at a version outside the advertised range.
    let mut c = Raw::connect(&broker).await?;
    c.send(ApiKey::Fetch, 13, &fetch_request("t", 0, 0)).await?;
    ensure!(
        c.is_closed().await,
        "unsupported Fetch version did not close"
    );

    // A frame over max_request_bytes.
    let mut c = Raw::connect(&broker).await?;
    c.stream.write_all(&8192i32.to_be_bytes()).await?;
    ensure!(c.is_closed().await, "oversized frame did not close");

    // A garbled body of a supported request.
    let mut c = Raw::connect(&broker).await?;
    let mut payload = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(ApiKey::Metadata as i16)
        .with_request_api_version(1)
        .with_correlation_id(7)
        .encode(&mut payload, 1)?;
    payload.put_i32(i32::MAX); // claims two billion topics, sends none
    c.send_frame(&payload).await?;
    ensure!(c.is_closed().await, "garbled body did not close");

    // Other connections are still served.
    let mut ok = Raw::connect(&broker).await?;
    let r: ApiVersionsResponse = ok
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await?;
    ensure!(r.error_code == 0);
    broker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_returns_the_advertised_listener() -> Result<()> {
    let config = BrokerConfig {
        advertised_listener: Some("kafka.example:19092".into()),
        ..BrokerConfig::default()
    };
    let broker = onceflow_broker::start(config).await?;
    let mut c = Raw::connect(&broker).await?;
    for version in [0, 1, 9, 12] {
        let r: MetadataResponse = c
            .call(
                ApiKey::Metadata,
                version,
                &MetadataRequest::default().with_topics(Some(vec![])),
            )
            .await?;
        ensure!(r.brokers.len() == 1, "v{version}");
        ensure!(
            r.brokers[0].host.as_str() == "kafka.example" && r.brokers[0].port == 19092,
            "v{version}"
        );
    }
    broker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_gets_no_response_and_fetch_long_polls() -> Result<()> {
    let broker = onceflow_broker::start(BrokerConfig::default()).await?;
    let mut producer = Raw::connect(&broker).await?;
    let mut consumer = Raw::connect(&broker).await?;
    // Produce never creates a topic.
    broker.store().create_topic("lp", 1)?;

    let r: ProduceResponse = producer
        .call(
            ApiKey::Produce,
            9,
            &produce_request("lp", 1, batch(&["a"])?),
        )
        .await?;
    let p = &r.responses[0].partition_responses[0];
    ensure!(p.error_code == 0 && p.base_offset == 0, "{p:?}");

    // acks=0: no response; the next response on the connection is the next request's.
    producer
        .send(
            ApiKey::Produce,
            9,
            &produce_request("lp", 0, batch(&["b", "c"])?),
        )
        .await?;
    let r: ApiVersionsResponse = producer
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await?;
    ensure!(r.error_code == 0);

    // At the end of the log a short long poll times out with empty (not null) record bytes.
    let f: FetchResponse = consumer
        .call(ApiKey::Fetch, 12, &fetch_request("lp", 3, 200))
        .await?;
    let part = &f.responses[0].partitions[0];
    ensure!(part.error_code == 0 && part.high_watermark == 3, "{part:?}");
    ensure!(
        part.records.as_ref().is_some_and(|r| r.is_empty()),
        "records {:?}",
        part.records
    );

    // A long poll with a long wait is woken by an append from another connection.
    let poll = tokio::spawn(async move {
        let f: Result<FetchResponse> = consumer
            .call(ApiKey::Fetch, 12, &fetch_request("lp", 3, 60_000))
            .await;
        f
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r: ProduceResponse = producer
        .call(
            ApiKey::Produce,
            9,
            &produce_request("lp", -1, batch(&["d"])?),
        )
        .await?;
    ensure!(r.responses[0].partition_responses[0].base_offset == 3);
    let f = poll.await??;
    let part = &f.responses[0].partitions[0];
    ensure!(part.high_watermark == 4, "{part:?}");
    let mut records = part.records.clone().context("null records")?;
    let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records)?;
    let values: Vec<_> = sets
        .iter()
        .flat_map(|s| s.records.iter())
        .map(|r| (r.offset, r.value.clone()))
        .collect();
    ensure!(
        values == vec![(3, Some(Bytes::from_static(b"d")))],
        "{values:?}"
    );

    // Fetch beyond the high watermark: OFFSET_OUT_OF_RANGE.
    let mut c = Raw::connect(&broker).await?;
    let f: FetchResponse = c
        .call(ApiKey::Fetch, 4, &fetch_request("lp", 99, 0))
        .await?;
    if f.responses[0].partitions[0].error_code != 1 {
        bail!(
            "expected OFFSET_OUT_OF_RANGE, got {:?}",
            f.responses[0].partitions[0]
        );
    }
    broker.shutdown().await;
    Ok(())
}

/// Record offsets in a fetched partition's record bytes.
fn offsets_in(records: &Option<Bytes>) -> Result<Vec<i64>> {
    let mut bytes = records.clone().context("null records")?;
    let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut bytes)?;
    Ok(sets
        .iter()
        .flat_map(|s| s.records.iter().map(|r| r.offset))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_respects_partition_and_response_byte_limits() -> Result<()> {
    let config = BrokerConfig {
        default_partitions: 2,
        ..BrokerConfig::default()
    };
    let broker = onceflow_broker::start(config).await?;
    broker.store().create_topic("limits", 2)?;
    let mut c = Raw::connect(&broker).await?;
    let big = "x".repeat(1000);
    for partition in 0..2 {
        for _ in 0..6 {
            // One record per request: one batch per offset.
            let mut req = produce_request("limits", 1, batch(&[&big])?);
            req.topic_data[0].partition_data[0].index = partition;
            let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await?;
            ensure!(r.responses[0].partition_responses[0].error_code == 0);
        }
    }
    let two_partitions = |partition_max: i32, max_bytes: i32| {
        let partition = |p| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(partition_max)
        };
        FetchRequest::default()
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("limits")))
                .with_partitions(vec![partition(0), partition(1)])])
    };
    // Everything fits.
    let f: FetchResponse = c
        .call(ApiKey::Fetch, 11, &two_partitions(1 << 20, 1 << 20))
        .await?;
    for p in &f.responses[0].partitions {
        let got = offsets_in(&p.records)?;
        ensure!(
            got == [0, 1, 2, 3, 4, 5],
            "partition {}: {got:?}",
            p.partition_index
        );
    }
    // A partition limit below one batch still returns the first whole batch (KIP-74).
    let f: FetchResponse = c
        .call(ApiKey::Fetch, 11, &two_partitions(1, 1 << 20))
        .await?;
    for p in &f.responses[0].partitions {
        let got = offsets_in(&p.records)?;
        ensure!(got == [0], "partition {}: {got:?}", p.partition_index);
    }
    // A response limit below one batch: the first partition gets one batch, the second none
    // (but empty bytes, and its high watermark).
    let f: FetchResponse = c
        .call(ApiKey::Fetch, 11, &two_partitions(1 << 20, 1))
        .await?;
    let parts = &f.responses[0].partitions;
    ensure!(offsets_in(&parts[0].records)? == [0]);
    ensure!(
        parts[1].records.as_ref().is_some_and(|r| r.is_empty()),
        "{:?}",
        parts[1]
    );
    ensure!(parts[1].high_watermark == 6);
    broker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_v0_empty_list_means_all_topics() -> Result<()> {
    let broker = onceflow_broker::start(BrokerConfig::default()).await?;
    let mut c = Raw::connect(&broker).await?;
    let one = MetadataRequest::default().with_topics(Some(vec![
        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("made-by-v0")))),
    ]));
    let r: MetadataResponse = c.call(ApiKey::Metadata, 0, &one).await?;
    ensure!(
        r.topics.len() == 1 && r.topics[0].error_code == 0,
        "{:?}",
        r.topics
    );
    let all: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            0,
            &MetadataRequest::default().with_topics(Some(vec![])),
        )
        .await?;
    ensure!(all.topics.len() == 1, "v0 empty list: {:?}", all.topics);
    let none: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            1,
            &MetadataRequest::default().with_topics(Some(vec![])),
        )
        .await?;
    ensure!(none.topics.is_empty(), "v1 empty list: {:?}", none.topics);
    let null: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            1,
            &MetadataRequest::default().with_topics(None),
        )
        .await?;
    ensure!(null.topics.len() == 1, "v1 null list: {:?}", null.topics);
    broker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_earliest_latest_by_time_and_max_timestamp() -> Result<()> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
    let broker = onceflow_broker::start(BrokerConfig::default()).await?;
    broker.store().create_topic("lo", 1)?;
    let mut c = Raw::connect(&broker).await?;
    // Three batches; record timestamps are 1000 + index within each batch.
    for values in [&["a", "b"][..], &["c"][..], &["d", "e", "f"][..]] {
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_request("lo", 1, batch(values)?),
            )
            .await?;
        ensure!(r.responses[0].partition_responses[0].error_code == 0);
    }
    let query = |timestamp: i64| {
        ListOffsetsRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("lo")))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(timestamp)])])
    };
    let mut answers = Vec::new();
    for ts in [-2, -1, -3, 1_001, 1_003] {
        let r: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 7, &query(ts)).await?;
        let p = &r.topics[0].partitions[0];
        ensure!(p.error_code == 0, "{ts}: {p:?}");
        answers.push((p.offset, p.timestamp));
    }
    ensure!(answers[0] == (0, -1), "earliest {:?}", answers[0]);
    ensure!(answers[1] == (6, -1), "latest {:?}", answers[1]);
    // The largest timestamp (1002) is in the last batch.
    ensure!(
        answers[2].1 == 1_002 && (3..=5).contains(&answers[2].0),
        "max {:?}",
        answers[2]
    );
    // The first batch whose records reach 1001 starts at offset 1 ("b", its own batch).
    ensure!(
        answers[3].0 <= 1 && answers[3].1 >= 1_001,
        "by time {:?}",
        answers[3]
    );
    ensure!(
        answers[4] == (-1, -1),
        "after the last timestamp {:?}",
        answers[4]
    );
    // v1 (no leader epoch field) and an unknown partition.
    let r: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 1, &query(-1)).await?;
    ensure!(r.topics[0].partitions[0].offset == 6);
    let mut missing = query(-1);
    missing.topics[0].partitions[0].partition_index = 9;
    let r: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 7, &missing).await?;
    ensure!(
        r.topics[0].partitions[0].error_code == 3,
        "{:?}",
        r.topics[0].partitions[0]
    );
    broker.shutdown().await;
    Ok(())
}
