//! librdkafka properties that a job passes to every Kafka client it makes (the consumers of
//! its source, the producers of its sinks, the admin and registry clients of its start-up),
//! under librdkafka's own names: TLS (`security.protocol=ssl`, `ssl.ca.location`, ...), SASL
//! (`sasl.mechanism`, `sasl.username`, `sasl.password`), timeouts, `client.rack` and so on.
//!
//! Settings the connectors own (group, transactional id, isolation level, idempotence, offset
//! commits) are refused, because a different value would silently break exactly-once. Values
//! of secret properties never reach logs, metrics or error messages: `Debug` and
//! [`ClientProperties::describe`] print them as `[redacted]`.

use std::collections::BTreeMap;
use std::path::Path;

use rdkafka::ClientConfig;

use super::{KafkaError, Result};

/// Properties the connectors set themselves; a user value would break exactly-once or the
/// job's start-up protocol.
const OWNED_BY_ONCEFLOW: &[(&str, &str)] = &[
    ("bootstrap.servers", "use --brokers"),
    ("metadata.broker.list", "use --brokers"),
    ("group.id", "use --group"),
    (
        "transactional.id",
        "the sink derives it from --transactional-id-prefix",
    ),
    ("transaction.timeout.ms", "use --transaction-timeout-ms"),
    ("isolation.level", "the source reads read_committed"),
    ("enable.idempotence", "the delivery mode decides"),
    (
        "enable.auto.commit",
        "offsets are committed with checkpoints",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed with checkpoints",
    ),
    ("group.protocol", "the source assigns partitions itself"),
];

/// Whether a property's value is a secret (passwords, keys, tokens, JAAS configs).
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "sasl.jaas.config",
        "ssl.key.pem",
        "token",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// An ordered set of librdkafka properties for every client of a job.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties {
    entries: BTreeMap<String, String>,
}

impl std::fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ClientProperties {
    /// No properties.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`; keys the connectors own are a configuration error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.trim();
        if key.is_empty() {
            return Err(KafkaError::Config("empty Kafka property name".into()));
        }
        if let Some((_, why)) = OWNED_BY_ONCEFLOW.iter().find(|(k, _)| *k == key) {
            return Err(KafkaError::Config(format!(
                "Kafka property {key} is set by onceflow and cannot be overridden: {why}"
            )));
        }
        self.entries.insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// Builder form of [`ClientProperties::set`].
    pub fn with(mut self, key: &str, value: &str) -> Result<Self> {
        self.set(key, value)?;
        Ok(self)
    }

    /// Parses and sets one `KEY=VALUE` assignment (the value may contain `=`).
    pub fn set_assignment(&mut self, assignment: &str) -> Result<()> {
        let (key, value) = assignment.split_once('=').ok_or_else(|| {
            KafkaError::Config(format!(
                "Kafka property {:?} is not KEY=VALUE",
                redact_assignment(assignment)
            ))
        })?;
        self.set(key, value)
    }

    /// Reads a properties file: one `KEY=VALUE` per line, `#` or `!` comment lines and blank
    /// lines ignored, whitespace around key and value trimmed (a subset of Java's format that
    /// Kafka's client `.properties` files use).
    pub fn load_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            KafkaError::Config(format!("reading Kafka properties {}: {e}", path.display()))
        })?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(KafkaError::Config(format!(
                    "{}:{}: expected KEY=VALUE",
                    path.display(),
                    i + 1
                )));
            };
            self.set(k.trim(), v.trim())
                .map_err(|e| KafkaError::Config(format!("{}:{}: {e}", path.display(), i + 1)))?;
        }
        Ok(())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// Whether no property is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `security.protocol`, lower case (`plaintext` when unset, as librdkafka's default).
    pub fn security_protocol(&self) -> String {
        self.get("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase()
    }

    /// Whether clients connect without TLS and without SASL.
    pub fn is_plaintext(&self) -> bool {
        self.security_protocol() == "plaintext"
    }

    /// Copies every property into `config`.
    pub fn apply(&self, config: &mut ClientConfig) {
        for (k, v) in &self.entries {
            config.set(k, v);
        }
    }

    /// A client configuration for `brokers` with these properties; callers add their own
    /// settings after it.
    pub fn client_config(&self, brokers: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", brokers);
        self.apply(&mut c);
        c
    }

    /// `key=value, ...` with secret values replaced by `[redacted]`, for logs.
    pub fn describe(&self) -> String {
        let shown: Vec<String> = self
            .entries
            .iter()
            .map(|(k, v)| {
                if is_secret(k) {
                    format!("{k}=[redacted]")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect();
        format!("{{{}}}", shown.join(", "))
    }
}

/// `KEY=VALUE` with the value hidden when the key is a secret (for error messages).
fn redact_assignment(assignment: &str) -> String {
    if is_secret(assignment) {
        "[redacted]".into()
    } else {
        assignment.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_files_and_owned_keys() {
        let mut p = ClientProperties::new();
        p.set_assignment("security.protocol=SASL_SSL").unwrap();
        p.set_assignment("sasl.password=a=b").unwrap();
        assert_eq!(p.get("sasl.password"), Some("a=b"));
        assert_eq!(p.security_protocol(), "sasl_ssl");
        assert!(!p.is_plaintext());
        assert!(ClientProperties::new().is_plaintext());
        for owned in [
            "group.id=g",
            "transactional.id=t",
            "isolation.level=read_uncommitted",
        ] {
            let e = p.set_assignment(owned).unwrap_err().to_string();
            assert!(e.contains("set by onceflow"), "{e}");
        }
        assert!(p.set_assignment("no-equals-sign").is_err());
        assert!(p.set_assignment("=value").is_err());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "# a comment\n\n! another\nssl.ca.location = /etc/ca.pem\nclient.rack=r1\n",
        )
        .unwrap();
        let mut q = ClientProperties::new();
        q.load_file(&file).unwrap();
        assert_eq!(q.get("ssl.ca.location"), Some("/etc/ca.pem"));
        assert_eq!(q.get("client.rack"), Some("r1"));
        std::fs::write(&file, "ok=1\ngroup.id=x\n").unwrap();
        let e = q.load_file(&file).unwrap_err().to_string();
        assert!(
            e.contains("client.properties:2") && e.contains("group.id"),
            "{e}"
        );
        assert!(q.load_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn secrets_never_print() {
        let mut p = ClientProperties::new();
        p.set("sasl.username", "alice").unwrap();
        p.set("sasl.password", "hunter2").unwrap();
        p.set("ssl.key.password", "k3y").unwrap();
        p.set("sasl.oauthbearer.client.secret", "s3cret").unwrap();
        let shown = format!("{p:?} {}", p.describe());
        for secret in ["hunter2", "k3y", "s3cret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("sasl.username=alice"), "{shown}");
        let e = ClientProperties::new()
            .set_assignment("sasl.password:hunter2")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn properties_reach_the_client_config() {
        let p = ClientProperties::new()
            .with("client.rack", "r1")
            .unwrap()
            .with("socket.timeout.ms", "5000")
            .unwrap();
        let c = p.client_config("h:1");
        assert_eq!(c.get("bootstrap.servers"), Some("h:1"));
        assert_eq!(c.get("client.rack"), Some("r1"));
        assert_eq!(c.get("socket.timeout.ms"), Some("5000"));
    }
}
