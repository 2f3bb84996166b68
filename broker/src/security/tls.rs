//! TLS for `SSL` and `SASL_SSL` listeners: the rustls server configuration from PEM files
//! and the client principal from a verified client certificate's subject.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{BrokerError, Result};

/// Whether TLS listeners ask clients for a certificate (Kafka's `ssl.client.auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for; clients without one are `User:ANONYMOUS`, an untrusted
    /// one fails the handshake.
    Requested,
    /// Clients must present a certificate signed by the client CA.
    Required,
}

impl std::str::FromStr for ClientAuth {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            other => Err(format!(
                "unknown client auth {other:?} (expected none, requested or required)"
            )),
        }
    }
}

/// Certificates of the TLS listeners (all TLS listeners share them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM file with the server certificate chain, leaf first.
    pub certificate_chain: PathBuf,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub private_key: PathBuf,
    /// PEM file with the CA certificates that client certificates must chain to; needed
    /// when `client_auth` is not `None`.
    pub client_ca: Option<PathBuf>,
    /// Whether a client certificate is asked for.
    pub client_auth: ClientAuth,
}

fn config_error(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Config(format!("{what} {}: {e}", path.display()))
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| config_error(what, path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| config_error(what, path, e))?;
    if certs.is_empty() {
        return Err(config_error(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// Builds the rustls server configuration; a missing or unreadable file, a key that does not
/// match or a client CA missing for client authentication is a configuration error.
pub fn server_config(config: &TlsConfig) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs(&config.certificate_chain, "ssl certificate")?;
    let key = PrivateKeyDer::from_pem_file(&config.private_key)
        .map_err(|e| config_error("ssl key", &config.private_key, e))?;
    let verifier = match (config.client_auth, &config.client_ca) {
        (ClientAuth::None, _) => WebPkiClientVerifier::no_client_auth(),
        (_, None) => {
            return Err(BrokerError::Config(
                "client authentication needs a client CA (--ssl-client-ca)".into(),
            ))
        }
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca, "ssl client CA")? {
                roots
                    .add(cert)
                    .map_err(|e| config_error("ssl client CA", ca, e))?;
            }
            let builder =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let builder = if auth == ClientAuth::Requested {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder
                .build()
                .map_err(|e| config_error("ssl client CA", ca, e))?
        }
    };
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BrokerError::Config(format!("tls: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            BrokerError::Config(format!(
                "ssl certificate {} and key {}: {e}",
                config.certificate_chain.display(),
                config.private_key.display()
            ))
        })?;
    Ok(Arc::new(server))
}

/// Kafka's default principal of a TLS client: `User:` and the certificate subject's
/// distinguished name in RFC 2253 form (most specific attribute first, e.g.
/// `User:CN=client,O=Example`). `None` when the certificate cannot be parsed.
pub fn principal_from_certificate(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let mut parts = Vec::new();
    let rdns: Vec<_> = cert.subject().iter().collect();
    for rdn in rdns.into_iter().rev() {
        let attrs: Vec<String> = rdn
            .iter()
            .map(|attr| {
                let key = x509_parser::objects::oid2abbrev(attr.attr_type(), registry)
                    .map(str::to_string)
                    .unwrap_or_else(|_| attr.attr_type().to_id_string());
                let value = attr
                    .as_str()
                    .map(escape_dn_value)
                    .unwrap_or_else(|_| "#".to_string());
                format!("{key}={value}")
            })
            .collect();
        parts.push(attrs.join("+"));
    }
    Some(format!("User:{}", parts.join(",")))
}

/// Escapes an RFC 2253 attribute value.
fn escape_dn_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == value.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
