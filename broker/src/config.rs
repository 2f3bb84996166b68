//! Broker configuration: what the library's [`crate::start`] and the CLI take.

use std::net::SocketAddr;
use std::path::PathBuf;

pub use crate::connection_limits::ConnectionLimits;
use crate::security::{ListenerConfig, SecurityProtocol, TlsConfig};
use crate::storage::StorageConfig;

/// Default limit on one request frame: 100 MiB, like Kafka's `socket.request.max.bytes`.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 100 * 1024 * 1024;

/// Default cap on the records of one Fetch answer: 55 MiB, Kafka's `fetch.max.bytes`.
pub const DEFAULT_FETCH_MAX_BYTES: usize = 57_671_680;

/// Smallest `fetch.max.bytes` Kafka accepts.
pub const MIN_FETCH_MAX_BYTES: usize = 1024;

/// Everything needed to start a broker.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Address of the PLAINTEXT listener used when `listeners` is empty; port 0 picks a
    /// free port. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// `HOST:PORT` returned by Metadata on the `listen` listener (so a proxy can sit in
    /// front); default: the bound address.
    pub advertised_listener: Option<String>,
    /// Listeners with their security protocols; when empty the broker binds one PLAINTEXT
    /// listener on `listen`. The first listener is [`crate::BrokerHandle::local_addr`].
    pub listeners: Vec<ListenerConfig>,
    /// TLS certificates, SASL users and ACLs.
    pub security: SecurityConfig,
    /// Storage settings; `data_dir: None` keeps the logs in memory.
    pub storage: StorageConfig,
    /// Create unknown topics when Metadata names them and asks for it (as Kafka, Produce
    /// never creates a topic). Default true.
    pub auto_create_topics: bool,
    /// Partition count of auto-created topics and of CreateTopics with `num_partitions = -1`.
    pub default_partitions: i32,
    /// Frames above this many bytes are refused and the connection closed. Default 100 MiB.
    pub max_request_bytes: usize,
    /// Record bytes one Fetch answer carries at most, whatever `max_bytes` the client asks
    /// for (Kafka's `fetch.max.bytes`; the first batch is still sent whole, KIP-74). Default
    /// 55 MiB; at least 1024.
    pub fetch_max_bytes: usize,
    /// Connection counts, idle timeout and the frame limit before SASL authentication.
    pub connections: ConnectionLimits,
    /// Serve Prometheus text metrics over HTTP on this address.
    pub metrics_listen: Option<SocketAddr>,
    /// Transaction coordinator limits
    /// (`--max-transaction-timeout-ms`, `--transactional-id-expiration-ms`).
    pub transactions: crate::txn::CoordinatorConfig,
    /// Test failpoint: pause (ms) between PrepareCommit/PrepareAbort and the
    /// markers. 0 in production.
    pub txn_marker_delay_ms: u64,
    /// Start even if a durable file holds damage followed by valid data: drop the damaged
    /// bytes, keep what follows when the framing allows it, and report what was dropped
    /// (error-level log lines and the `onceflow_broker_corrupt_*_dropped_total` metrics).
    /// Default false: such a file makes the broker refuse to start, naming the file.
    pub repair_corrupt_logs: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertised_listener: None,
            listeners: Vec::new(),
            security: SecurityConfig::default(),
            storage: StorageConfig::default(),
            auto_create_topics: true,
            default_partitions: 1,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            fetch_max_bytes: DEFAULT_FETCH_MAX_BYTES,
            connections: ConnectionLimits::default(),
            metrics_listen: None,
            transactions: crate::txn::CoordinatorConfig::default(),
            txn_marker_delay_ms: 0,
            repair_corrupt_logs: false,
        }
    }
}

/// TLS, SASL and authorization settings.
#[derive(Debug, Clone, Default)]
pub struct SecurityConfig {
    /// Certificates of the SSL and SASL_SSL listeners.
    pub tls: Option<TlsConfig>,
    /// The SASL users file (format: [`crate::security::users`]); needed by SASL listeners.
    pub sasl_users_file: Option<PathBuf>,
    /// Check every request against ACLs. Off: everything is allowed to everyone.
    pub authorizer: bool,
    /// ACL bindings loaded at start-up (format: [`crate::security::acl`]); implies
    /// `authorizer`.
    pub acl_file: Option<PathBuf>,
    /// Principals (`User:admin`) allowed everything regardless of ACLs; implies `authorizer`.
    pub super_users: Vec<String>,
}

impl SecurityConfig {
    /// Whether requests are checked against ACLs.
    pub fn authorizer_enabled(&self) -> bool {
        self.authorizer || self.acl_file.is_some() || !self.super_users.is_empty()
    }
}

impl BrokerConfig {
    /// Checks the limits are usable (a broker that could accept nothing is a mistake).
    pub fn validate_limits(&self) -> Result<(), String> {
        if self.fetch_max_bytes < MIN_FETCH_MAX_BYTES {
            return Err(format!(
                "fetch.max.bytes must be at least {MIN_FETCH_MAX_BYTES}, got {}",
                self.fetch_max_bytes
            ));
        }
        let c = &self.connections;
        if c.max_connections == 0 || c.max_connections_per_ip == 0 {
            return Err("max.connections and max.connections.per.ip must be at least 1".into());
        }
        if c.sasl_max_receive_bytes < crate::codec::MIN_REQUEST_BYTES {
            return Err(format!(
                "sasl.server.max.receive.size must be at least {} bytes",
                crate::codec::MIN_REQUEST_BYTES
            ));
        }
        if c.max_idle.is_some_and(|d| d.is_zero()) {
            return Err("connections.max.idle.ms must be positive (or off)".into());
        }
        Ok(())
    }

    /// The listeners to bind: `listeners`, or one PLAINTEXT listener on `listen`
    /// (advertising `advertised_listener`) when that is empty.
    pub fn effective_listeners(&self) -> Vec<ListenerConfig> {
        if self.listeners.is_empty() {
            let mut plain = ListenerConfig::new(SecurityProtocol::Plaintext, self.listen);
            plain.advertised = self.advertised_listener.clone();
            vec![plain]
        } else {
            self.listeners.clone()
        }
    }
}

/// Parses `HOST:PORT` into its parts; the port must be a valid u16.
pub fn parse_host_port(value: &str) -> Option<(String, u16)> {
    let (host, port) = value.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::parse_host_port;

    #[test]
    fn host_port_parsing() {
        assert_eq!(
            parse_host_port("localhost:9092"),
            Some(("localhost".into(), 9092))
        );
        assert_eq!(parse_host_port("[::1]:19092"), Some(("::1".into(), 19092)));
        assert_eq!(parse_host_port("localhost"), None);
        assert_eq!(parse_host_port(":9092"), None);
        assert_eq!(parse_host_port("h:99999"), None);
    }
}
