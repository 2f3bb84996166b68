//! TLS and SASL for onceflow's own Kafka client (the recovery committer and the start-up
//! permission check), configured from the same librdkafka properties the job passes to
//! librdkafka, and the start-up permission check itself.
//!
//! [`ClientSecurity::from_properties`] reads `security.protocol`, the `ssl.*` properties
//! (trusted CAs, client certificate and key, certificate and host name verification) and
//! `sasl.mechanism`/`sasl.username`/`sasl.password`. Combinations the client cannot speak
//! (GSSAPI, OAUTHBEARER, PKCS#12 keystores, encrypted keys, OpenSSL engines) are an
//! [`Unsupported`] answer that names the property, so two-phase commit can be refused at
//! start with the reason instead of failing at the first recovery.

pub mod acl;
pub mod check;
pub mod sasl;
pub use onceflow_scram as scram;
pub mod tls;

use std::sync::Arc;

use super::{ClientProperties, KafkaError, Result};
use scram::ScramHash;

/// A SASL mechanism onceflow's client can speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    /// PLAIN (RFC 4616): the password travels to the broker (use it over TLS).
    Plain,
    /// SCRAM-SHA-256 or SCRAM-SHA-512 (RFC 5802, RFC 7677).
    Scram(ScramHash),
}

impl SaslMechanism {
    /// The mechanism's name in SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(h) => h.mechanism(),
        }
    }
}

/// SASL credentials; `Debug` never shows the password.
#[derive(Clone)]
pub struct SaslCredentials {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// `sasl.username`.
    pub username: String,
    password: String,
}

impl std::fmt::Debug for SaslCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslCredentials")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .finish()
    }
}

/// How onceflow's own client connects: TLS (with its rustls configuration) and SASL, each
/// optional.
#[derive(Clone, Debug, Default)]
pub struct ClientSecurity {
    /// TLS configuration, for `ssl` and `sasl_ssl`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// SASL credentials, for `sasl_plaintext` and `sasl_ssl`.
    pub sasl: Option<SaslCredentials>,
}

/// Why onceflow's own client cannot connect with the given properties (librdkafka can).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// Properties whose use onceflow's client cannot follow, and why.
const UNSUPPORTED_PROPERTIES: &[(&str, &str)] = &[
    (
        "ssl.keystore.location",
        "PKCS#12 keystores are not read; give ssl.certificate.location and ssl.key.location (PEM) instead",
    ),
    (
        "ssl.key.password",
        "encrypted private keys are not read; give an unencrypted PEM key (ssl.key.location)",
    ),
    ("ssl.engine.location", "OpenSSL engines are not used"),
    ("ssl.providers", "OpenSSL providers are not used"),
    (
        "ssl.certificate.verify_cb",
        "custom verification callbacks are not used",
    ),
];

impl ClientSecurity {
    /// No TLS, no SASL.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// Why onceflow's own client cannot connect with `properties`, if it cannot (librdkafka
    /// may still).
    pub fn unsupported(properties: &ClientProperties) -> Option<Unsupported> {
        Self::parse(properties).err()
    }

    /// The client settings of `properties`; an unsupported combination or an unreadable
    /// certificate, key or CA file is a configuration error naming `purpose`.
    pub fn from_properties(properties: &ClientProperties, purpose: &str) -> Result<ClientSecurity> {
        let (use_tls, sasl) = Self::parse(properties).map_err(|Unsupported(why)| {
            KafkaError::Config(format!(
                "{purpose} uses onceflow's own Kafka client, which cannot connect with these properties: {why}"
            ))
        })?;
        let tls = if use_tls {
            Some(Arc::new(tls::client_config(properties)?))
        } else {
            None
        };
        Ok(ClientSecurity { tls, sasl })
    }

    /// Whether TLS is used, and the SASL credentials, or why the client cannot connect.
    fn parse(
        properties: &ClientProperties,
    ) -> std::result::Result<(bool, Option<SaslCredentials>), Unsupported> {
        let protocol = properties.security_protocol();
        let (use_tls, use_sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => {
                return Err(Unsupported(format!(
                "security.protocol={other} is not one of plaintext, ssl, sasl_plaintext, sasl_ssl"
            )))
            }
        };
        let mut sasl = None;
        if use_sasl {
            // librdkafka's name is sasl.mechanisms, with sasl.mechanism as an alias; its
            // default is GSSAPI
            let mech = properties
                .get("sasl.mechanism")
                .or_else(|| properties.get("sasl.mechanisms"))
                .unwrap_or("GSSAPI")
                .trim()
                .to_ascii_uppercase();
            let mechanism = match mech.as_str() {
                "PLAIN" => SaslMechanism::Plain,
                "SCRAM-SHA-256" => SaslMechanism::Scram(ScramHash::Sha256),
                "SCRAM-SHA-512" => SaslMechanism::Scram(ScramHash::Sha512),
                other => {
                    return Err(Unsupported(format!(
                        "sasl.mechanism={other} (onceflow's own Kafka client speaks PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512)"
                    )))
                }
            };
            let (Some(username), Some(password)) = (
                properties.get("sasl.username"),
                properties.get("sasl.password"),
            ) else {
                return Err(Unsupported(format!(
                    "sasl.mechanism={} needs sasl.username and sasl.password",
                    mechanism.name()
                )));
            };
            sasl = Some(SaslCredentials {
                mechanism,
                username: username.to_string(),
                password: password.to_string(),
            });
        }
        if use_tls {
            for (key, why) in UNSUPPORTED_PROPERTIES {
                if properties.get(key).is_some() {
                    return Err(Unsupported(format!("{key} is set: {why}")));
                }
            }
        }
        Ok((use_tls, sasl))
    }

    /// True if the connection speaks TLS (`ssl` or `sasl_ssl`).
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The principal the broker will see, when the properties name it: `User:<sasl.username>`.
    /// `None` for TLS client certificates (the broker maps the certificate's subject) and
    /// for PLAINTEXT (`User:ANONYMOUS`, but anonymous access is rarely what ACLs name).
    pub fn principal(&self) -> Option<String> {
        self.sasl.as_ref().map(|s| format!("User:{}", s.username))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> ClientProperties {
        let mut p = ClientProperties::new();
        for (k, v) in pairs {
            p.set(k, v).unwrap();
        }
        p
    }

    #[test]
    fn supported_and_unsupported_combinations() {
        let scram = props(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "scram-sha-512"),
            ("sasl.username", "alice"),
            ("sasl.password", "hunter2"),
        ]);
        let s = ClientSecurity::from_properties(&scram, "test").unwrap();
        assert!(s.tls.is_none());
        assert_eq!(
            s.sasl.as_ref().unwrap().mechanism,
            SaslMechanism::Scram(ScramHash::Sha512)
        );
        assert_eq!(s.principal().as_deref(), Some("User:alice"));
        assert_eq!(s.sasl.as_ref().unwrap().password, "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        // librdkafka's own name of the property
        let plain = props(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanisms", "PLAIN"),
            ("sasl.username", "a"),
            ("sasl.password", "b"),
        ]);
        assert!(ClientSecurity::unsupported(&plain).is_none());
        assert!(ClientSecurity::unsupported(&ClientProperties::new()).is_none());

        for (pairs, named) in [
            (vec![("security.protocol", "SASL_SSL")], "GSSAPI"),
            (
                vec![
                    ("security.protocol", "SASL_SSL"),
                    ("sasl.mechanism", "OAUTHBEARER"),
                ],
                "OAUTHBEARER",
            ),
            (
                vec![
                    ("security.protocol", "SASL_SSL"),
                    ("sasl.mechanism", "PLAIN"),
                ],
                "sasl.username",
            ),
            (
                vec![
                    ("security.protocol", "SSL"),
                    ("ssl.keystore.location", "/k.p12"),
                ],
                "ssl.keystore.location",
            ),
            (
                vec![("security.protocol", "SSL"), ("ssl.key.password", "x")],
                "ssl.key.password",
            ),
            (vec![("security.protocol", "quic")], "quic"),
        ] {
            let p = props(&pairs);
            let why = ClientSecurity::unsupported(&p).expect("unsupported").0;
            assert!(why.contains(named), "{why}");
            let e = ClientSecurity::from_properties(&p, "recovery")
                .unwrap_err()
                .to_string();
            assert!(e.contains("recovery") && e.contains(named), "{e}");
            assert!(!e.contains("hunter2"));
        }
    }

    /// The job's librdkafka clients need TLS and SCRAM (rdkafka's `ssl` feature).
    #[test]
    fn librdkafka_is_built_with_tls_and_scram() {
        let native = rdkafka::ClientConfig::new()
            .create_native_config()
            .expect("native config");
        let features = native.get("builtin.features").expect("builtin.features");
        for wanted in ["ssl", "sasl_plain", "sasl_scram"] {
            assert!(
                features.split(',').any(|f| f == wanted),
                "librdkafka lacks {wanted}: {features}"
            );
        }
    }

    #[test]
    fn tls_files_are_read_at_start() {
        let missing = props(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", "/nonexistent/ca.pem"),
        ]);
        let e = ClientSecurity::from_properties(&missing, "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let bad = props(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", not_pem.to_str().unwrap()),
        ]);
        let e = ClientSecurity::from_properties(&bad, "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");

        // verification off needs no CA
        let off = props(&[
            ("security.protocol", "SSL"),
            ("enable.ssl.certificate.verification", "false"),
        ]);
        assert!(ClientSecurity::from_properties(&off, "test")
            .unwrap()
            .tls
            .is_some());
        // a certificate without its key
        let half = props(&[
            ("security.protocol", "SSL"),
            ("enable.ssl.certificate.verification", "false"),
            ("ssl.certificate.location", not_pem.to_str().unwrap()),
        ]);
        assert!(ClientSecurity::from_properties(&half, "test").is_err());
        assert!(tls::server_name("127.0.0.1:9093").is_ok());
        assert!(tls::server_name("kafka-1.example:9093").is_ok());
        assert!(tls::server_name("[::1]:9093").is_ok());
    }
}
