//! Configuration of the Kafka sink and the start-up safety checks (transaction timeout
//! against checkpoint interval, recovery allowance and the broker's maximum).

use std::time::Duration;

use super::security::{ClientSecurity, Unsupported};
use super::{ClientProperties, KafkaError, Result};

/// Delivery guarantee of a [`super::KafkaSink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Exactly-once by checkpoint-aligned two-phase commit: one transaction per sink subtask
    /// per checkpoint, committed when the checkpoint is complete, finished on recovery.
    TwoPhaseCommit,
    /// Exactly-once by transactional offsets (Kafka -> Kafka): one transactional producer per
    /// job instance; source offsets are committed inside the output transaction.
    TransactionalOffsets,
    /// Idempotent producer, flushed at every checkpoint: duplicates after a restore.
    AtLeastOnce,
    /// Plain producer, no flush at checkpoints: records can be lost or duplicated.
    None,
}

impl std::str::FromStr for DeliveryMode {
    type Err = KafkaError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "two-phase-commit" => Ok(DeliveryMode::TwoPhaseCommit),
            "transactional-offsets" => Ok(DeliveryMode::TransactionalOffsets),
            "at-least-once" => Ok(DeliveryMode::AtLeastOnce),
            "none" => Ok(DeliveryMode::None),
            other => Err(KafkaError::Config(format!(
                "unknown mode `{other}`: use two-phase-commit, transactional-offsets, at-least-once or none"
            ))),
        }
    }
}

impl DeliveryMode {
    /// Whether the mode writes in transactions.
    pub fn is_transactional(self) -> bool {
        matches!(
            self,
            DeliveryMode::TwoPhaseCommit | DeliveryMode::TransactionalOffsets
        )
    }
}

/// Settings of a Kafka sink.
#[derive(Clone, Debug)]
pub struct KafkaSinkConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topic of records that name none.
    pub default_topic: String,
    /// Delivery guarantee.
    pub mode: DeliveryMode,
    /// Prefix of the transactional ids (`{prefix}-{subtask}-{slot}` in two-phase-commit mode,
    /// `{prefix}-offsets` in transactional-offsets mode). Unique per job.
    pub transactional_id_prefix: String,
    /// `transaction.timeout.ms`: must exceed checkpoint interval + recovery allowance.
    pub transaction_timeout: Duration,
    /// The job's checkpoint interval (for the timeout check).
    pub checkpoint_interval: Duration,
    /// Time a restart may take between a crash and the recovery commit (for the timeout check).
    pub recovery_allowance: Duration,
    /// Transactional ids per sink subtask in two-phase-commit mode (at least 3; see KAFKA.md).
    pub ring_slots: usize,
    /// Extra librdkafka producer properties.
    pub producer_properties: Vec<(String, String)>,
    /// librdkafka properties of every client the sink makes (security, timeouts, ...).
    pub client_properties: ClientProperties,
}

impl KafkaSinkConfig {
    /// A configuration with defaults: two-phase commit, timeout 60 s, interval 1 s,
    /// recovery allowance 30 s, ring of 3 slots.
    pub fn new(brokers: impl Into<String>, default_topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            brokers: brokers.into(),
            default_topic: default_topic.into(),
            mode: DeliveryMode::TwoPhaseCommit,
            transactional_id_prefix: "onceflow".into(),
            transaction_timeout: Duration::from_secs(60),
            checkpoint_interval: Duration::from_secs(1),
            recovery_allowance: Duration::from_secs(30),
            ring_slots: 3,
            producer_properties: Vec::new(),
            client_properties: ClientProperties::new(),
        }
    }

    /// Sets the delivery mode.
    pub fn mode(mut self, mode: DeliveryMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the transactional id prefix.
    pub fn transactional_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.transactional_id_prefix = prefix.into();
        self
    }

    /// Sets `transaction.timeout.ms`.
    pub fn transaction_timeout(mut self, t: Duration) -> Self {
        self.transaction_timeout = t;
        self
    }

    /// Tells the sink the job's checkpoint interval.
    pub fn checkpoint_interval(mut self, t: Duration) -> Self {
        self.checkpoint_interval = t;
        self
    }

    /// Sets the recovery allowance.
    pub fn recovery_allowance(mut self, t: Duration) -> Self {
        self.recovery_allowance = t;
        self
    }

    /// Adds a librdkafka producer property.
    pub fn producer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_properties.push((key.into(), value.into()));
        self
    }

    /// Sets the properties of every client the sink makes (TLS, SASL, timeouts).
    pub fn client_properties(mut self, properties: ClientProperties) -> Self {
        self.client_properties = properties;
        self
    }

    /// Local checks (no network): the timeout rule, a non-empty prefix, a ring of 3 or more.
    pub fn validate(&self) -> Result<()> {
        if self.brokers.trim().is_empty() {
            return Err(KafkaError::Config("brokers must not be empty".into()));
        }
        if self.mode.is_transactional() {
            if self.transactional_id_prefix.is_empty() {
                return Err(KafkaError::Config(
                    "transactional id prefix must not be empty".into(),
                ));
            }
            validate_transaction_timeout(
                self.transaction_timeout,
                self.checkpoint_interval,
                self.recovery_allowance,
                None,
            )?;
        }
        check_mode_security(self.mode, &self.client_properties)?;
        if self.mode == DeliveryMode::TwoPhaseCommit && self.ring_slots < 3 {
            return Err(KafkaError::Config(format!(
                "ring_slots is {}, needs at least 3 (one open, one pre-committed, one committed but still named by the latest complete checkpoint)",
                self.ring_slots
            )));
        }
        Ok(())
    }
}

/// Two-phase-commit recovery commits the pre-committed transactions of a crashed run through
/// onceflow's own Kafka client ([`super::committer`]), which speaks TLS and SASL PLAIN and
/// SCRAM but not every combination librdkafka does (GSSAPI, OAUTHBEARER, PKCS#12 keystores,
/// encrypted keys): with those, that mode is refused at start, with the reason and the way
/// out. The certificate, key and CA files are read here too, so a wrong path fails at start.
pub fn check_mode_security(mode: DeliveryMode, properties: &ClientProperties) -> Result<()> {
    if mode == DeliveryMode::TwoPhaseCommit {
        if let Some(Unsupported(why)) = ClientSecurity::unsupported(properties) {
            return Err(KafkaError::Config(format!(
                "--mode two-phase-commit cannot run with these Kafka properties: its recovery \
                 commits the pre-committed transactions of a crashed run through onceflow's own \
                 Kafka client, which cannot connect with them: {why}; use --mode \
                 transactional-offsets with them instead"
            )));
        }
        ClientSecurity::from_properties(properties, "--mode two-phase-commit recovery")?;
    }
    Ok(())
}

/// The rule: `timeout > interval + allowance` and, when the broker's maximum is known,
/// `timeout <= broker max`. The error says what to change.
pub fn validate_transaction_timeout(
    timeout: Duration,
    interval: Duration,
    allowance: Duration,
    broker_max: Option<Duration>,
) -> Result<()> {
    let needed = interval + allowance;
    if timeout <= needed {
        return Err(KafkaError::Config(format!(
            "transaction timeout {} ms must exceed checkpoint interval {} ms + recovery allowance {} ms = {} ms: \
             raise --transaction-timeout-ms above {} (or lower the checkpoint interval / recovery allowance), \
             otherwise the broker aborts a pre-committed transaction before the job can commit it after a crash",
            timeout.as_millis(),
            interval.as_millis(),
            allowance.as_millis(),
            needed.as_millis(),
            needed.as_millis()
        )));
    }
    if let Some(max) = broker_max {
        if timeout > max {
            return Err(KafkaError::Config(format!(
                "transaction timeout {} ms exceeds the broker's transaction.max.timeout.ms {} ms: \
                 lower --transaction-timeout-ms to at most {} or raise the broker's limit",
                timeout.as_millis(),
                max.as_millis(),
                max.as_millis()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_rule() {
        let s = Duration::from_secs;
        assert!(validate_transaction_timeout(s(60), s(1), s(30), None).is_ok());
        let e = validate_transaction_timeout(s(5), s(10), s(30), None).unwrap_err();
        assert!(e
            .to_string()
            .contains("raise --transaction-timeout-ms above 40000"));
        let e = validate_transaction_timeout(s(100), s(1), s(30), Some(s(90))).unwrap_err();
        assert!(e.to_string().contains("at most 90000"));
        assert!("two-phase-commit".parse::<DeliveryMode>().is_ok());
        assert!("bogus".parse::<DeliveryMode>().is_err());
    }
}
