//! A raw Kafka client over a blocking `TcpStream` using the kafka-protocol crate's encoders,
//! with typed helpers for the requests the conformance tests send byte-exactly and the ones a
//! two-phase-commit committer sends itself (FindCoordinator, EndTxn).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
pub use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, BrokerId, EndTxnRequest, FetchRequest, FetchResponse,
    FindCoordinatorRequest, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, ProducerId, RequestHeader, ResponseHeader,
    TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// Read/write timeout of raw client sockets.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// A minimal Kafka client over a blocking `TcpStream`, one request at a time.
pub struct RawClient {
    stream: TcpStream,
    next_correlation: i32,
    client_id: String,
}

impl RawClient {
    /// Connects to `addr` (a `SocketAddr` or `"HOST:PORT"`) with read/write timeouts of
    /// [`SOCKET_TIMEOUT`].
    pub fn connect<A: ToSocketAddrs + Display>(addr: A) -> Result<Self> {
        let resolved = addr
            .to_socket_addrs()
            .with_context(|| format!("resolve {addr}"))?
            .next()
            .ok_or_else(|| anyhow!("{addr} resolves to no address"))?;
        let stream = TcpStream::connect_timeout(&resolved, SOCKET_TIMEOUT)
            .with_context(|| format!("connect {addr}"))?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            next_correlation: 1,
            client_id: "onceflow-raw-test".into(),
        })
    }

    /// Sets the read timeout (e.g. short, to check that nothing is answered).
    pub fn set_read_timeout(&self, timeout: Duration) -> Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        Ok(())
    }

    /// Encodes `req` at `version` as a complete size-prefixed frame.
    pub fn encode_frame<R: Request>(&mut self, req: &R, version: i16) -> Result<(i32, BytesMut)> {
        let correlation_id = self.next_correlation;
        self.next_correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .map_err(|e| anyhow!("encode header: {e}"))?;
        req.encode(&mut body, version)
            .map_err(|e| anyhow!("encode request: {e}"))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.put_slice(&body);
        Ok((correlation_id, frame))
    }

    /// Sends `req` at `version` and decodes the response (checking the correlation id).
    pub fn request<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        let (correlation_id, frame) = self.encode_frame(req, version)?;
        self.send_bytes(&frame)?;
        let mut resp = self.read_frame().context("read response frame")?;
        let header = ResponseHeader::decode(&mut resp, R::Response::header_version(version))
            .map_err(|e| anyhow!("decode response header: {e}"))?;
        if header.correlation_id != correlation_id {
            bail!(
                "correlation id {} != {}",
                header.correlation_id,
                correlation_id
            );
        }
        let body = R::Response::decode(&mut resp, version)
            .map_err(|e| anyhow!("decode response v{version}: {e}"))?;
        if resp.has_remaining() {
            bail!(
                "{} trailing bytes after response v{version}",
                resp.remaining()
            );
        }
        Ok(body)
    }

    /// Writes raw bytes to the socket.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).context("write")?;
        self.stream.flush()?;
        Ok(())
    }

    /// Reads one size-prefixed frame (without the size).
    pub fn read_frame(&mut self) -> Result<Bytes> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .context("read frame length")?;
        let len = i32::from_be_bytes(len);
        if !(0..=64 << 20).contains(&len) {
            bail!("implausible response frame length {len}");
        }
        let mut buf = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut buf)
            .context("read frame body")?;
        Ok(Bytes::from(buf))
    }

    /// Waits up to `timeout` for the peer to close the connection, draining anything it sends.
    /// Returns true if it closed (EOF or reset), false if it was still open at the deadline.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self
                .stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))));
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}

/// Kafka error codes the tests check.
pub mod error_code {
    /// No error.
    pub const NONE: i16 = 0;
    /// OFFSET_OUT_OF_RANGE.
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    /// CORRUPT_MESSAGE.
    pub const CORRUPT_MESSAGE: i16 = 2;
    /// UNKNOWN_TOPIC_OR_PARTITION.
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    /// UNSUPPORTED_VERSION.
    pub const UNSUPPORTED_VERSION: i16 = 35;
    /// INVALID_REQUEST.
    pub const INVALID_REQUEST: i16 = 42;
    /// OUT_OF_ORDER_SEQUENCE_NUMBER.
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    /// DUPLICATE_SEQUENCE_NUMBER.
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
    /// INVALID_PRODUCER_EPOCH.
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    /// UNKNOWN_PRODUCER_ID.
    pub const UNKNOWN_PRODUCER_ID: i16 = 59;
    /// PRODUCER_FENCED.
    pub const PRODUCER_FENCED: i16 = 90;
}

/// The versions a broker advertised, by API key.
#[derive(Clone, Debug)]
pub struct Versions(pub BTreeMap<i16, (i16, i16)>);

impl Versions {
    /// The highest version of `R` both the broker and this client support, capped at `cap`.
    pub fn pick<R: Request>(&self, cap: i16) -> Result<i16> {
        let (min, max) = *self
            .0
            .get(&R::KEY)
            .ok_or_else(|| anyhow!("API key {} not advertised", R::KEY))?;
        let v = max.min(cap).min(R::VERSIONS.max);
        if v < min || v < R::VERSIONS.min {
            bail!(
                "no common version for API key {}: broker {min}..={max}, client cap {cap}",
                R::KEY
            );
        }
        Ok(v)
    }
}

impl RawClient {
    /// ApiVersions v3 (falling back to v0 on UNSUPPORTED_VERSION, as librdkafka does).
    pub fn api_versions(&mut self) -> Result<Versions> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("onceflow-conformance"))
            .with_client_software_version(StrBytes::from_static_str("0.1.0"));
        let mut resp = self.request(&req, 3)?;
        if resp.error_code == error_code::UNSUPPORTED_VERSION {
            resp = self.request(&ApiVersionsRequest::default(), 0)?;
        }
        if resp.error_code != error_code::NONE {
            bail!("ApiVersions error {}", resp.error_code);
        }
        Ok(Versions(
            resp.api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect(),
        ))
    }

    /// Metadata for `topics` (auto-creating them if the broker does), at the given version.
    pub fn metadata(&mut self, version: i16, topics: &[&str]) -> Result<MetadataResponse> {
        let req = MetadataRequest::default()
            .with_topics(Some(
                topics
                    .iter()
                    .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                    .collect(),
            ))
            .with_allow_auto_topic_creation(true);
        self.request(&req, version)
    }

    /// InitProducerId without a transactional id; returns (producer id, epoch).
    pub fn init_producer_id(&mut self, version: i16) -> Result<(i64, i16)> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(-1);
        let resp = self.request(&req, version)?;
        if resp.error_code != error_code::NONE {
            bail!("InitProducerId error {}", resp.error_code);
        }
        Ok((resp.producer_id.0, resp.producer_epoch))
    }

    /// Produces `records` (RecordBatch bytes) to one partition with acks=all.
    pub fn produce(
        &mut self,
        version: i16,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> Result<PartitionProduceResponse> {
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(records))])]);
        let resp = self.request(&req, version)?;
        let topic_resp = resp
            .responses
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("Produce answer without topics"))?;
        topic_resp
            .partition_responses
            .into_iter()
            .find(|p| p.index == partition)
            .ok_or_else(|| anyhow!("Produce answer without partition {partition}"))
    }

    /// Fetches one partition from `offset`; returns (error code, high watermark, record bytes).
    pub fn fetch(
        &mut self,
        version: i16,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(i16, i64, Bytes)> {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(8 << 20)
                    .with_log_start_offset(-1)
                    .with_current_leader_epoch(-1)])]);
        let resp = self.request(&req, version)?;
        if resp.error_code != error_code::NONE {
            bail!("Fetch top-level error {}", resp.error_code);
        }
        let p = resp
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| anyhow!("Fetch answer without partition {partition}"))?;
        Ok((
            p.error_code,
            p.high_watermark,
            p.records.unwrap_or_default(),
        ))
    }
}

/// A topic name for kafka-protocol messages.
pub fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// One RecordBatch v2 with `values.len()` records of producer `pid`/`epoch`, first sequence
/// `base_sequence`, uncompressed. Keys are `k{seq}`.
pub fn idempotent_batch(
    pid: i64,
    epoch: i16,
    base_sequence: i32,
    values: &[&str],
) -> Result<Bytes> {
    record_batch(pid, epoch, base_sequence, values, false)
}

/// [`idempotent_batch`] inside a transaction (the batch's transactional flag set).
pub fn transactional_batch(
    pid: i64,
    epoch: i16,
    base_sequence: i32,
    values: &[&str],
) -> Result<Bytes> {
    record_batch(pid, epoch, base_sequence, values, true)
}

fn record_batch(
    pid: i64,
    epoch: i16,
    base_sequence: i32,
    values: &[&str],
    transactional: bool,
) -> Result<Bytes> {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: base_sequence + i as i32,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(format!("k{}", base_sequence + i as i32))),
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
    )
    .map_err(|e| anyhow!("encode batch: {e}"))?;
    Ok(buf.freeze())
}

/// Decodes fetched record bytes into (offset, value) pairs.
pub fn decode_values(mut bytes: Bytes) -> Result<Vec<(i64, String)>> {
    let mut out = Vec::new();
    while bytes.has_remaining() {
        let set = RecordBatchDecoder::decode(&mut bytes)
            .map_err(|e| anyhow!("decode fetched batch: {e}"))?;
        for r in set.records {
            if r.control {
                continue;
            }
            let v = r
                .value
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default();
            out.push((r.offset, v));
        }
    }
    Ok(out)
}

/// Finds the transaction coordinator of `txn_id` through `bootstrap` and sends it
/// EndTxn(commit or abort) for (producer id, epoch). Returns EndTxn's error code; fails if
/// FindCoordinator does.
pub fn end_txn(
    bootstrap: &str,
    txn_id: &str,
    producer_id: i64,
    epoch: i16,
    commit: bool,
) -> Result<i16> {
    let mut coord = txn_coordinator(bootstrap, txn_id, Duration::ZERO)?;
    let resp = coord.request(
        &EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(txn_id.to_string())))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch)
            .with_committed(commit),
        1,
    )?;
    Ok(resp.error_code)
}

/// Raises the producer epoch of transactional id `txn_id` to at least `epoch` the way any
/// client does: InitProducerId for it, again and again, on one connection to its
/// coordinator. Each call bumps the epoch by one (Kafka's rule: once it is exhausted, near
/// `i16::MAX`, the coordinator moves the id to a new producer id at epoch 0); returns the
/// (producer id, epoch) of the last call. Retriable coordinator errors are retried.
pub fn raise_epoch(bootstrap: &str, txn_id: &str, epoch: i16) -> Result<(i64, i16)> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut coord = txn_coordinator(bootstrap, txn_id, Duration::from_secs(600))?;
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
            txn_id.to_string(),
        ))))
        .with_transaction_timeout_ms(60_000);
    loop {
        let r = coord.request(&req, 1)?;
        match r.error_code {
            error_code::NONE if r.producer_epoch >= epoch => {
                return Ok((r.producer_id.0, r.producer_epoch))
            }
            error_code::NONE => {}
            // coordinator loading, moved, or the previous transaction still completing
            14 | 15 | 16 | 51 if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            code => bail!("InitProducerId for {txn_id} failed: error {code}"),
        }
    }
}

/// The coordinator's (producer id, epoch, state) of transactional id `txn_id`
/// (DescribeTransactions v0).
pub fn describe_transaction(bootstrap: &str, txn_id: &str) -> Result<(i64, i16, String)> {
    use kafka_protocol::messages::DescribeTransactionsRequest;
    let mut coord = txn_coordinator(bootstrap, txn_id, Duration::ZERO)?;
    let r = coord.request(
        &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
            StrBytes::from_string(txn_id.to_string()),
        )]),
        0,
    )?;
    let s = r
        .transaction_states
        .first()
        .ok_or_else(|| anyhow!("DescribeTransactions for {txn_id}: no state"))?;
    if s.error_code != error_code::NONE {
        bail!(
            "DescribeTransactions for {txn_id} failed: error {}",
            s.error_code
        );
    }
    Ok((
        s.producer_id.0,
        s.producer_epoch,
        s.transaction_state.to_string(),
    ))
}

/// A connection to the transaction coordinator of `txn_id` (FindCoordinator at `bootstrap`),
/// waiting up to `patience` while the transaction log is created or loaded.
pub fn txn_coordinator(bootstrap: &str, txn_id: &str, patience: Duration) -> Result<RawClient> {
    let deadline = Instant::now() + patience;
    let mut c = RawClient::connect(bootstrap)?;
    loop {
        let fc = c.request(
            &FindCoordinatorRequest::default()
                .with_key(StrBytes::from_string(txn_id.to_string()))
                .with_key_type(1),
            1,
        )?;
        match fc.error_code {
            error_code::NONE => {
                return RawClient::connect(format!("{}:{}", fc.host.as_str(), fc.port))
            }
            // COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
            14 | 15 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            code => bail!("FindCoordinator for {txn_id} failed: error {code}"),
        }
    }
}
