//! Operating a job's transactions from outside it: list the transactional ids of a prefix
//! with their state and age (KIP-664 ListTransactions and DescribeTransactions), tell whether
//! a live instance holds the prefix (its registry group), and end the transactions a lost
//! instance left open (InitProducerId on each id, which fences it and aborts its open
//! transaction, as a new instance would). The `onceflow transactions` command uses these.

use std::time::Duration;

use kafka_protocol::messages::{
    DescribeTransactionsRequest, ListTransactionsRequest, MetadataRequest, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::committer::{self, codes, connect_any, RawClient};
use super::registry::registry_group;
use super::security::ClientSecurity;
use super::{ClientProperties, KafkaError, Result};

/// One transactional id as its coordinator describes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransactionInfo {
    /// The transactional id.
    pub transactional_id: String,
    /// `Empty`, `Ongoing`, `PrepareCommit`, `PrepareAbort`, `CompleteCommit`,
    /// `CompleteAbort`, `Dead` or `PrepareEpochFence`.
    pub state: String,
    /// The producer id and epoch the coordinator holds.
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
    /// The transaction timeout the id's producer set, ms.
    pub timeout_ms: i32,
    /// How long the open transaction has been open, ms (`None`: none is open).
    pub open_for_ms: Option<i64>,
    /// The partitions in the open transaction, as `topic-partition`.
    pub partitions: Vec<String>,
}

impl TransactionInfo {
    /// Whether the id belongs to a two-phase-commit ring of `prefix`: its open transaction
    /// may be pre-committed, its records part of a complete checkpoint that the job's restart
    /// commits; aborting it loses them.
    pub fn is_two_phase_commit(&self, prefix: &str) -> bool {
        super::sink::is_ring_id(prefix, &self.transactional_id)
    }

    /// Whether a transaction is open (its partitions' last stable offset waits for it).
    pub fn is_open(&self) -> bool {
        matches!(
            self.state.as_str(),
            "Ongoing" | "PrepareCommit" | "PrepareAbort" | "PrepareEpochFence"
        )
    }
}

/// The transactional ids starting with `prefix` on the cluster, each as its coordinator
/// describes it, in name order. ListTransactions goes to every broker (each lists the ids it
/// coordinates); the principal needs Describe on the ids.
pub async fn list_transactions(
    bootstrap: &str,
    security: &ClientSecurity,
    prefix: &str,
) -> Result<Vec<TransactionInfo>> {
    let mut ids = Vec::new();
    for broker in brokers(bootstrap, security).await? {
        let mut c = RawClient::connect(&broker, security).await?;
        let r = c.request(&ListTransactionsRequest::default(), 0).await?;
        if r.error_code != codes::NONE {
            return Err(KafkaError::Protocol(format!(
                "ListTransactions at {broker} failed with Kafka error code {} ({})",
                r.error_code,
                error_name(r.error_code)
            )));
        }
        ids.extend(
            r.transaction_states
                .into_iter()
                .map(|t| t.transactional_id.0.to_string())
                .filter(|id| id.starts_with(prefix)),
        );
    }
    ids.sort();
    ids.dedup();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(describe(bootstrap, security, &id, now_ms).await?);
    }
    Ok(out)
}

async fn describe(
    bootstrap: &str,
    security: &ClientSecurity,
    id: &str,
    now_ms: i64,
) -> Result<TransactionInfo> {
    let addr = match committer::find_txn_coordinator(bootstrap, security, id).await? {
        Ok(a) => a,
        Err(code) => {
            return Err(KafkaError::Protocol(format!(
                "FindCoordinator for {id} failed with Kafka error code {code} ({})",
                error_name(code)
            )))
        }
    };
    let mut c = RawClient::connect(&addr, security).await?;
    let r = c
        .request(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
                StrBytes::from_string(id.to_string()),
            )]),
            0,
        )
        .await?;
    let Some(t) = r
        .transaction_states
        .into_iter()
        .find(|t| t.transactional_id.0.as_str() == id)
    else {
        return Err(KafkaError::Protocol(format!(
            "DescribeTransactions at {addr} did not describe {id}"
        )));
    };
    if t.error_code != codes::NONE {
        return Err(KafkaError::Protocol(format!(
            "DescribeTransactions for {id} failed with Kafka error code {} ({})",
            t.error_code,
            error_name(t.error_code)
        )));
    }
    let mut partitions: Vec<String> = t
        .topics
        .iter()
        .flat_map(|tp| {
            tp.partitions
                .iter()
                .map(move |p| format!("{}-{p}", tp.topic.0.as_str()))
        })
        .collect();
    partitions.sort();
    let info = TransactionInfo {
        transactional_id: id.to_string(),
        state: t.transaction_state.to_string(),
        producer_id: t.producer_id.0,
        producer_epoch: t.producer_epoch,
        timeout_ms: t.transaction_timeout_ms,
        open_for_ms: None,
        partitions,
    };
    let open_for_ms = (info.is_open() && t.transaction_start_time_ms >= 0)
        .then(|| now_ms.saturating_sub(t.transaction_start_time_ms).max(0));
    Ok(TransactionInfo {
        open_for_ms,
        ..info
    })
}

/// The `HOST:PORT` of every broker of the cluster (Metadata).
async fn brokers(bootstrap: &str, security: &ClientSecurity) -> Result<Vec<String>> {
    let mut c = connect_any(bootstrap, security).await?;
    let md = c
        .request(&MetadataRequest::default().with_topics(Some(Vec::new())), 4)
        .await?;
    let mut all: Vec<String> = md
        .brokers
        .iter()
        .map(|b| format!("{}:{}", b.host.as_str(), b.port))
        .collect();
    all.sort();
    Ok(all)
}

/// The client ids of the live instances holding `prefix` (members of its registry group).
/// Blocking (librdkafka).
pub fn live_instances(
    bootstrap: &str,
    properties: &ClientProperties,
    prefix: &str,
) -> Result<Vec<String>> {
    let group = registry_group(prefix);
    let consumer: BaseConsumer = properties
        .client_config(bootstrap)
        .create()
        .map_err(|e| KafkaError::client("creating an admin consumer", e))?;
    let _ = consumer.fetch_metadata(None, Duration::from_secs(15));
    let groups = super::retry::blocking(
        &format!("describing group {group}"),
        &format!("group coordinator of {group}"),
        super::retry::COORDINATOR_BUDGET,
        || consumer.fetch_group_list(Some(&group), Duration::from_secs(15)),
    )?;
    Ok(groups
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .flat_map(|g| g.members().iter().map(|m| m.client_id().to_string()))
        .collect())
}

/// Ends the open transaction of `id` (aborting it) and fences its producer: InitProducerId,
/// as a new instance of the job does at start. Waits until the coordinator finished the
/// abort, for at most `patience`.
pub async fn abort_transaction(
    bootstrap: &str,
    security: &ClientSecurity,
    info: &TransactionInfo,
    patience: Duration,
) -> Result<()> {
    let timeout = Duration::from_millis(u64::try_from(info.timeout_ms.max(1)).unwrap_or(60_000));
    committer::fence(
        bootstrap,
        security,
        &info.transactional_id,
        timeout,
        patience,
    )
    .await
}

/// Kafka's name of the error codes an operator meets here.
fn error_name(code: i16) -> &'static str {
    match code {
        codes::COORDINATOR_LOAD_IN_PROGRESS => "COORDINATOR_LOAD_IN_PROGRESS",
        codes::COORDINATOR_NOT_AVAILABLE => "COORDINATOR_NOT_AVAILABLE",
        codes::NOT_COORDINATOR => "NOT_COORDINATOR",
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        codes::CLUSTER_AUTHORIZATION_FAILED => "CLUSTER_AUTHORIZATION_FAILED",
        105 => "TRANSACTIONAL_ID_NOT_FOUND",
        _ => "see Kafka's protocol error codes",
    }
}
