//! Security of the broker's listeners: TLS ([`tls`]), SASL authentication ([`session`],
//! [`scram`], [`users`]), the listener configuration ([`listener`]) and authorization by
//! ACLs ([`acl`], [`authorizer`]).
//!
//! Each connection gets a [`Session`] holding the listener it came in on and, once known,
//! its principal (`User:ANONYMOUS` on PLAINTEXT, the certificate subject on SSL with a client
//! certificate, `User:<name>` after SASL). On a SASL listener only ApiVersions, SaslHandshake
//! and SaslAuthenticate are served before authentication; anything else closes the
//! connection, as Kafka does.

pub mod acl;
pub mod acl_store;
pub mod authorizer;
pub mod listener;
pub use onceflow_scram as scram;
pub mod session;
pub mod tls;
pub mod users;

use std::sync::Arc;

pub use acl::{AclOperation, ResourceType};
pub use authorizer::Authorizer;
pub use listener::{ListenerConfig, SecurityProtocol};
pub use session::{ListenerEndpoint, SaslStep, Session, ANONYMOUS};
pub use tls::{ClientAuth, TlsConfig};
pub use users::Users;

use crate::config::BrokerConfig;
use crate::error::{BrokerError, Result};

/// The security material loaded at start-up and shared by all connections.
#[derive(Debug, Default)]
pub struct Security {
    /// SASL users (empty without `--sasl-users`).
    pub users: Users,
    /// The TLS server configuration, when a TLS listener is configured.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The ACL authorizer; `None`: everything is allowed.
    pub authorizer: Option<Authorizer>,
}

impl Security {
    /// Loads certificates and users for the configured listeners; a TLS listener without
    /// certificates or a SASL listener without a users file is a configuration error.
    pub fn open(config: &BrokerConfig) -> Result<Self> {
        let listeners = config.effective_listeners();
        let needs_tls = listeners.iter().any(|l| l.protocol.uses_tls());
        let needs_sasl = listeners.iter().any(|l| l.protocol.uses_sasl());
        let tls = match (&config.security.tls, needs_tls) {
            (Some(tls), true) => Some(tls::server_config(tls)?),
            (None, true) => {
                return Err(BrokerError::Config(
                    "an SSL or SASL_SSL listener needs --ssl-certificate and --ssl-key".into(),
                ))
            }
            (_, false) => None,
        };
        let users = match (&config.security.sasl_users_file, needs_sasl) {
            (Some(path), _) => Users::load(path)?,
            (None, true) => {
                return Err(BrokerError::Config(
                    "a SASL_PLAINTEXT or SASL_SSL listener needs --sasl-users FILE".into(),
                ))
            }
            (None, false) => Users::default(),
        };
        let authorizer = if config.security.authorizer_enabled() {
            Some(Authorizer::open(
                &config.security.super_users,
                config.security.acl_file.as_deref(),
                config.storage.data_dir.as_deref(),
            )?)
        } else {
            None
        };
        Ok(Security {
            users,
            tls,
            authorizer,
        })
    }
}

/// Counts one SASL authentication by mechanism and outcome (`success` / `failure`).
pub fn record_authentication(mechanism: &'static str, outcome: &'static str) {
    metrics::counter!(
        "onceflow_broker_authentications_total",
        "mechanism" => mechanism,
        "outcome" => outcome
    )
    .increment(1);
}

/// Counts one failed TLS handshake (untrusted or missing client certificate, bad client).
pub fn record_tls_handshake_failure(listener: &str) {
    metrics::counter!(
        "onceflow_broker_tls_handshake_failures_total",
        "listener" => listener.to_string()
    )
    .increment(1);
}

/// Counts one request (or resource of a request) refused by the authorizer.
pub fn record_denied(resource: ResourceType, operation: AclOperation) {
    metrics::counter!(
        "onceflow_broker_authorization_denied_total",
        "resource" => resource.name(),
        "operation" => operation.name()
    )
    .increment(1);
}
