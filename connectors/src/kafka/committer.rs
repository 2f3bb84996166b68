//! A small raw Kafka client on the kafka-protocol crate over tokio: FindCoordinator + EndTxn,
//! so recovery can finish a pre-committed transaction of a crashed producer with its
//! (transactional id, producer id, epoch), which librdkafka cannot do; InitProducerId, to
//! fence a transactional id without starting a librdkafka producer for it;
//! DescribeTransactions, to learn the producer id and epoch a librdkafka producer's
//! `init_transactions` got; and DescribeConfigs to read the broker's
//! `transaction.max.timeout.ms`. Connections use TLS and SASL as the job's client
//! properties say ([`ClientSecurity`]).

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{
    DescribeConfigsRequest, DescribeTransactionsRequest, EndTxnRequest, FindCoordinatorRequest,
    InitProducerIdRequest, ProducerId, RequestHeader, ResponseHeader, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::security::{sasl, tls, ClientSecurity};
use super::{KafkaError, Result};

const IO_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_FRAME: usize = 64 * 1024 * 1024;

/// Kafka error codes the committer distinguishes.
pub mod codes {
    /// No error.
    pub const NONE: i16 = 0;
    /// The coordinator is loading.
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// The coordinator is not available.
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// This broker is not the coordinator.
    pub const NOT_COORDINATOR: i16 = 16;
    /// The producer's epoch is not the current one.
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    /// The transaction is not in a state that allows the request.
    pub const INVALID_TXN_STATE: i16 = 48;
    /// The producer id does not belong to the transactional id.
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    /// Another transaction operation is in progress.
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    /// A newer producer with the same transactional id exists.
    pub const PRODUCER_FENCED: i16 = 90;
    /// The principal may not use the transactional id (Write, or Describe for
    /// FindCoordinator).
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    /// The principal may not perform the request on the cluster resource.
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
}

/// A byte stream to a broker: TCP, or TLS over TCP.
trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

/// One connection, one request at a time.
pub struct RawClient {
    stream: Box<dyn Connection>,
    correlation: i32,
    local_ip: Option<std::net::IpAddr>,
}

impl RawClient {
    /// Connects to `addr` (`HOST:PORT`), with TLS and SASL as `security` says.
    pub async fn connect(addr: &str, security: &ClientSecurity) -> Result<RawClient> {
        let tcp = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| KafkaError::Protocol(format!("connect to {addr} timed out")))?
            .map_err(|e| KafkaError::Protocol(format!("connect to {addr}: {e}")))?;
        let local_ip = tcp.local_addr().ok().map(|a| a.ip());
        let stream: Box<dyn Connection> = match &security.tls {
            None => Box::new(tcp),
            Some(config) => {
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let name = tls::server_name(addr)?;
                let s = tokio::time::timeout(IO_TIMEOUT, connector.connect(name, tcp))
                    .await
                    .map_err(|_| {
                        KafkaError::Protocol(format!("TLS handshake with {addr} timed out"))
                    })?
                    .map_err(|e| KafkaError::Protocol(format!("TLS handshake with {addr}: {e}")))?;
                Box::new(s)
            }
        };
        let mut client = RawClient {
            stream,
            correlation: 0,
            local_ip,
        };
        if let Some(creds) = &security.sasl {
            sasl::authenticate(&mut client, creds).await?;
        }
        Ok(client)
    }

    /// This end's IP address, as the broker sees it without NAT (ACLs may name hosts).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_ip
    }

    /// Sends `req` at `version` and decodes the answer.
    pub async fn request<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("onceflow-committer")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .map_err(|e| KafkaError::Protocol(format!("encode: {e}")))?;
        req.encode(&mut body, version)
            .map_err(|e| KafkaError::Protocol(format!("encode: {e}")))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.put_slice(&body);
        let io = |e: std::io::Error| KafkaError::Protocol(format!("i/o: {e}"));
        let exchange = async {
            self.stream.write_all(&frame).await.map_err(io)?;
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await.map_err(io)?;
            let n = i32::from_be_bytes(len);
            if n < 0 || n as usize > MAX_FRAME {
                return Err(KafkaError::Protocol(format!(
                    "bad response frame length {n}"
                )));
            }
            let mut buf = vec![0u8; n as usize];
            self.stream.read_exact(&mut buf).await.map_err(io)?;
            Ok(Bytes::from(buf))
        };
        let mut buf = tokio::time::timeout(IO_TIMEOUT, exchange)
            .await
            .map_err(|_| KafkaError::Protocol("request timed out".into()))??;
        let h = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .map_err(|e| KafkaError::Protocol(format!("decode: {e}")))?;
        if h.correlation_id != self.correlation {
            return Err(KafkaError::Protocol(format!(
                "correlation id {} does not match {}",
                h.correlation_id, self.correlation
            )));
        }
        let resp = R::Response::decode(&mut buf, version)
            .map_err(|e| KafkaError::Protocol(format!("decode: {e}")))?;
        if buf.has_remaining() {
            return Err(KafkaError::Protocol("trailing bytes in response".into()));
        }
        Ok(resp)
    }
}

/// Connects to the first reachable server of the comma-separated `bootstrap` list, in
/// order, as Kafka clients do: one dead broker of several must not stop a recovery commit.
/// The error names every server tried.
pub async fn connect_any(bootstrap: &str, security: &ClientSecurity) -> Result<RawClient> {
    let mut failures = Vec::new();
    for addr in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match RawClient::connect(addr, security).await {
            Ok(c) => {
                if !failures.is_empty() {
                    tracing::warn!(server = addr, skipped = ?failures, "bootstrap servers unreachable; using the next one");
                }
                return Ok(c);
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(KafkaError::Protocol(if failures.is_empty() {
        format!("no bootstrap server in {bootstrap:?}")
    } else {
        format!("no bootstrap server reachable: {}", failures.join("; "))
    }))
}

/// Finds the transaction coordinator of `txn_id`: `HOST:PORT`, or the error code.
pub async fn find_txn_coordinator(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
) -> Result<std::result::Result<String, i16>> {
    let mut c = connect_any(bootstrap, security).await?;
    let fc = c
        .request(
            &FindCoordinatorRequest::default()
                .with_key(StrBytes::from_string(txn_id.to_string()))
                .with_key_type(1),
            1,
        )
        .await?;
    if fc.error_code != codes::NONE {
        return Ok(Err(fc.error_code));
    }
    Ok(Ok(format!("{}:{}", fc.host.as_str(), fc.port)))
}

/// A connection to the transaction coordinator of `txn_id`, or FindCoordinator's error code.
async fn connect_txn_coordinator(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
) -> Result<std::result::Result<RawClient, i16>> {
    match find_txn_coordinator(bootstrap, security, txn_id).await? {
        Ok(addr) => Ok(Ok(RawClient::connect(&addr, security).await?)),
        Err(code) => Ok(Err(code)),
    }
}

/// Sends EndTxn once (after FindCoordinator) and returns the error code.
pub async fn end_txn_once(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
    producer_id: i64,
    epoch: i16,
    commit: bool,
) -> Result<i16> {
    let mut coord = match connect_txn_coordinator(bootstrap, security, txn_id).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let r = coord
        .request(
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(txn_id.to_string())))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(epoch)
                .with_committed(commit),
            1,
        )
        .await?;
    Ok(r.error_code)
}

/// How a recovery commit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The broker committed it now, or reports it committed before.
    Committed,
    /// The transaction was aborted, its epoch bumped (timeout or fencing) or its id expired:
    /// the error code says which.
    Lost(i16),
}

/// Runs `attempt` (one coordinator call, answering a Kafka error code) until its answer is
/// not a retriable one: coordinator loading, moved or unavailable, another transaction
/// operation in progress, or a connection failure. Sleeps between attempts from
/// `first_backoff` doubling up to 500 ms, for at most `patience`; `what` names the call in
/// the error when patience runs out.
async fn until_settled<F, Fut>(
    what: &str,
    patience: Duration,
    first_backoff: Duration,
    mut attempt: F,
) -> Result<i16>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<i16>>,
{
    let deadline = Instant::now() + patience;
    let mut backoff = first_backoff;
    loop {
        let retry_reason = match attempt().await {
            Ok(
                c @ (codes::COORDINATOR_LOAD_IN_PROGRESS
                | codes::COORDINATOR_NOT_AVAILABLE
                | codes::NOT_COORDINATOR
                | codes::CONCURRENT_TRANSACTIONS),
            ) => format!("error code {c}"),
            Ok(settled) => return Ok(settled),
            Err(e) => e.to_string(),
        };
        if Instant::now() + backoff > deadline {
            return Err(KafkaError::Protocol(format!(
                "{what} did not succeed within {patience:?}: {retry_reason}"
            )));
        }
        tracing::debug!(call = what, reason = %retry_reason, "coordinator call retry");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Commits the prepared transaction (transactional id, producer id, epoch), retrying
/// coordinator and concurrency errors (and connection failures) until `patience` runs out.
pub async fn commit_prepared(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
    producer_id: i64,
    epoch: i16,
    patience: Duration,
) -> Result<CommitOutcome> {
    let what = format!("EndTxn(commit) for {txn_id} (producer id {producer_id}, epoch {epoch})");
    let code = until_settled(&what, patience, Duration::from_millis(20), || {
        end_txn_once(bootstrap, security, txn_id, producer_id, epoch, true)
    })
    .await?;
    match code {
        codes::NONE => Ok(CommitOutcome::Committed),
        // not a lost transaction: it stays prepared until its timeout, and a restart with
        // the permission commits it
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED => Err(KafkaError::Config(format!(
            "EndTxn(commit) for {txn_id} was refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the principal needs Write on TransactionalId {txn_id} (a prefixed ACL on the job's --transactional-id-prefix); the transaction stays prepared until its timeout"
        ))),
        c => Ok(CommitOutcome::Lost(c)),
    }
}

/// Sends InitProducerId for `txn_id` once (after FindCoordinator) and returns the error code.
async fn init_producer_id_once(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
    transaction_timeout_ms: i32,
) -> Result<i16> {
    let mut coord = match connect_txn_coordinator(bootstrap, security, txn_id).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let r = coord
        .request(
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                    txn_id.to_string(),
                ))))
                .with_transaction_timeout_ms(transaction_timeout_ms),
            1,
        )
        .await?;
    Ok(r.error_code)
}

/// Fences `txn_id`: InitProducerId at its transaction coordinator, which bumps the id's epoch
/// (every producer holding an older one can no longer write, commit or abort) and aborts the
/// transaction it left open, exactly what a librdkafka producer's `init_transactions` does to
/// its predecessors. Retries coordinator and concurrency errors (CONCURRENT_TRANSACTIONS
/// while the open transaction's abort completes) and connection failures until `patience`
/// runs out.
///
/// A librdkafka producer per id costs a client start and its timers (100-600 ms here, most
/// of a job's start-up when a ring of ids is fenced); this is two round trips per id.
pub async fn fence(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
    transaction_timeout: Duration,
    patience: Duration,
) -> Result<()> {
    let timeout_ms = i32::try_from(transaction_timeout.as_millis()).unwrap_or(i32::MAX);
    let what = format!("fencing {txn_id}: InitProducerId");
    let code = until_settled(&what, patience, Duration::from_millis(10), || {
        init_producer_id_once(bootstrap, security, txn_id, timeout_ms)
    })
    .await?;
    match code {
        codes::NONE => Ok(()),
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED => Err(KafkaError::Config(format!(
            "InitProducerId for {txn_id} was refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the principal needs Write on TransactionalId {txn_id} (a prefixed ACL on the job's --transactional-id-prefix)"
        ))),
        c => Err(KafkaError::Protocol(format!(
            "fencing {txn_id}: InitProducerId failed with Kafka error code {c}"
        ))),
    }
}

/// Sends DescribeTransactions for `txn_id` once (after FindCoordinator): the error code, and
/// the coordinator's producer id and epoch of the id when there is none.
async fn describe_transaction_once(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
) -> Result<(i16, Option<(i64, i16)>)> {
    let mut coord = match connect_txn_coordinator(bootstrap, security, txn_id).await? {
        Ok(c) => c,
        Err(code) => return Ok((code, None)),
    };
    let r = coord
        .request(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
                StrBytes::from_string(txn_id.to_string()),
            )]),
            0,
        )
        .await?;
    let Some(st) = r
        .transaction_states
        .into_iter()
        .find(|t| t.transactional_id.0.as_str() == txn_id)
    else {
        return Err(KafkaError::Protocol(format!(
            "DescribeTransactions did not describe {txn_id}"
        )));
    };
    if st.error_code != codes::NONE {
        return Ok((st.error_code, None));
    }
    Ok((codes::NONE, Some((st.producer_id.0, st.producer_epoch))))
}

/// The producer id and epoch the transaction coordinator holds for `txn_id`
/// (DescribeTransactions, Kafka 3.0+, KIP-664; the principal needs Describe on the
/// TransactionalId, which Write implies). Right after a producer's `init_transactions` they
/// are that producer's, unless another `init_transactions` for the id came in between: then
/// the producer is fenced and none of its later writes or commits can succeed, so ids read
/// this way never end up in a successful pre-commit unless they are the producer's own.
/// Retries coordinator errors and connection failures until `patience` runs out; an error
/// means the cluster cannot answer (an older Kafka closes the connection on the request).
pub async fn describe_producer(
    bootstrap: &str,
    security: &ClientSecurity,
    txn_id: &str,
    patience: Duration,
) -> Result<(i64, i16)> {
    let what = format!("DescribeTransactions for {txn_id}");
    let ids = std::sync::Mutex::new(None);
    let code = until_settled(&what, patience, Duration::from_millis(10), || async {
        let (code, found) = describe_transaction_once(bootstrap, security, txn_id).await?;
        *ids.lock().unwrap_or_else(|e| e.into_inner()) = found;
        Ok(code)
    })
    .await?;
    match (code, ids.into_inner().unwrap_or_else(|e| e.into_inner())) {
        (codes::NONE, Some(ids)) => Ok(ids),
        (c, _) => Err(KafkaError::Protocol(format!(
            "DescribeTransactions for {txn_id} failed with Kafka error code {c}"
        ))),
    }
}

/// The broker's `transaction.max.timeout.ms` from DescribeConfigs, `None` if the broker does
/// not report it.
pub async fn broker_max_transaction_timeout(
    bootstrap: &str,
    security: &ClientSecurity,
) -> Result<Option<Duration>> {
    let mut c = connect_any(bootstrap, security).await?;
    let key = "transaction.max.timeout.ms";
    let mut resources = Vec::new();
    for node in ["0", "1"] {
        resources.push(
            DescribeConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(StrBytes::from_static_str(node))
                .with_configuration_keys(Some(vec![StrBytes::from_static_str(key)])),
        );
    }
    let r = c
        .request(
            &DescribeConfigsRequest::default().with_resources(resources),
            1,
        )
        .await?;
    let mut refused = None;
    for res in &r.results {
        if res.error_code != codes::NONE {
            refused.get_or_insert(res.error_code);
            continue;
        }
        for cfg in &res.configs {
            if cfg.name.as_str() == key {
                if let Some(v) = cfg
                    .value
                    .as_ref()
                    .and_then(|v| v.as_str().parse::<u64>().ok())
                {
                    return Ok(Some(Duration::from_millis(v)));
                }
            }
        }
    }
    if refused == Some(codes::CLUSTER_AUTHORIZATION_FAILED) {
        return Err(KafkaError::Config(
            "the job's principal may not describe the broker's configuration (DescribeConfigs on the Cluster)".into(),
        ));
    }
    Ok(None)
}
