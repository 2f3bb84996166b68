//! The embedded default: without `--brokers` a job starts the bundled reference broker
//! in-process (in memory, 4 partitions per topic, size-based retention so memory stays
//! bounded) and creates its topics. Only with the
//! `embedded-broker` feature; a production build leaves the broker out.

use crate::kafka::{KafkaError, Result};

/// The embedded broker keeps its logs in memory: each partition keeps at most about this
/// much (retention.bytes), so a long demo run stays bounded.
#[cfg(feature = "embedded-broker")]
const EMBEDDED_RETENTION_BYTES: i64 = 16 * 1024 * 1024;
/// Small segments, so retention frees memory in small steps (only closed segments go).
#[cfg(feature = "embedded-broker")]
const EMBEDDED_SEGMENT_BYTES: u64 = 1024 * 1024;
/// How often the embedded broker's retention runs.
#[cfg(feature = "embedded-broker")]
const EMBEDDED_RETENTION_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// A broker running inside this process, shut down when the job ends.
pub(crate) struct Embedded {
    #[cfg(feature = "embedded-broker")]
    handle: onceflow_broker::BrokerHandle,
}

impl Embedded {
    /// Starts the broker on a free loopback port and creates `topics` on it.
    #[cfg(feature = "embedded-broker")]
    pub(crate) fn start(
        rt: &tokio::runtime::Runtime,
        topics: &[&str],
    ) -> Result<(Embedded, String)> {
        let cfg = onceflow_broker::BrokerConfig {
            default_partitions: 4,
            storage: onceflow_broker::storage::StorageConfig {
                segment_bytes: EMBEDDED_SEGMENT_BYTES,
                retention_bytes: Some(EMBEDDED_RETENTION_BYTES),
                retention_check_interval: Some(EMBEDDED_RETENTION_CHECK),
                ..Default::default()
            },
            ..Default::default()
        };
        let handle = rt
            .block_on(onceflow_broker::start(cfg))
            .map_err(|e| KafkaError::Protocol(format!("cannot start the embedded broker: {e}")))?;
        let brokers = handle.bootstrap_servers();
        rt.block_on(create_topics(&brokers, topics))?;
        Ok((Embedded { handle }, brokers))
    }

    /// Without the feature there is no broker to start: the job needs `--brokers`.
    #[cfg(not(feature = "embedded-broker"))]
    pub(crate) fn start(
        _rt: &tokio::runtime::Runtime,
        _topics: &[&str],
    ) -> Result<(Embedded, String)> {
        Err(KafkaError::Config(
            "no --brokers given, and this binary was built without the embedded broker (cargo feature `embedded-broker` of onceflow): pass --brokers HOST:PORT".into(),
        ))
    }

    /// Stops the broker.
    pub(crate) fn shutdown(self, _rt: &tokio::runtime::Runtime) {
        #[cfg(feature = "embedded-broker")]
        _rt.block_on(self.handle.shutdown());
    }
}

/// Creates `topics` with 4 partitions (an existing topic is fine), so the source and a demo
/// producer see the same partitions from the first record on.
#[cfg(feature = "embedded-broker")]
async fn create_topics(brokers: &str, topics: &[&str]) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| KafkaError::client("creating an admin client", e))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 4, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new())
        .await
        .map_err(|e| KafkaError::client("creating topics", e))?;
    for r in results {
        if let Err((topic, code)) = r {
            if code != RDKafkaErrorCode::TopicAlreadyExists {
                return Err(KafkaError::Protocol(format!(
                    "cannot create topic {topic}: {code}"
                )));
            }
        }
    }
    Ok(())
}
