//! TLS for `SSL` and `SASL_SSL` listeners: the rustls server configuration from PEM files
//! and the client principal from a verified client certificate's subject.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::asn1_rs::{Any, Tag};

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
/// `User:CN=client,O=Example`). `None` when the certificate cannot be parsed. A value that is
/// not a string is written as RFC 4514 does (and Java's `X500Principal`): `#` and the hex of
/// its DER encoding.
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
                format!("{key}={}", attribute_value(attr.attr_value()))
            })
            .collect();
        parts.push(attrs.join("+"));
    }
    Some(format!("User:{}", parts.join(",")))
}

/// An attribute value in RFC 4514 form: a directory string as escaped text (UTF8String,
/// PrintableString, IA5String, NumericString, TeletexString as Latin-1, BMPString,
/// UniversalString), anything else `#` followed by the hex of its DER encoding.
fn attribute_value(value: &Any<'_>) -> String {
    let text = match value.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(value.data).ok().map(str::to_string)
        }
        Tag::TeletexString => Some(value.data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString if value.data.len().is_multiple_of(2) => char::decode_utf16(
            value
                .data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]])),
        )
        .collect::<std::result::Result<String, _>>()
        .ok(),
        Tag::UniversalString if value.data.len().is_multiple_of(4) => value
            .data
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        _ => None,
    };
    match text {
        Some(text) => escape_dn_value(&text),
        None => {
            let hex: String = der_encoding(value)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("#{hex}")
        }
    }
}

/// The DER encoding of a parsed value: its identifier octets (as read, when known), the
/// definite length, the content.
fn der_encoding(value: &Any<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.data.len() + 6);
    match value.header.raw_tag() {
        Some(raw) => out.extend_from_slice(raw),
        None => {
            let first = ((value.class() as u8) << 6) | (u8::from(value.header.constructed()) << 5);
            let number = value.tag().0;
            if number < 31 {
                out.push(first | number as u8);
            } else {
                out.push(first | 0x1f);
                let mut groups = Vec::new();
                let mut n = number;
                loop {
                    groups.push((n & 0x7f) as u8);
                    n >>= 7;
                    if n == 0 {
                        break;
                    }
                }
                for (i, g) in groups.iter().rev().enumerate() {
                    out.push(if i + 1 < groups.len() { g | 0x80 } else { *g });
                }
            }
        }
    }
    let len = value.data.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value.data);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_is_the_subject_dn_most_specific_first() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        // ASN.1 order O, CN (the defaults hold a CN in first place).
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example, Inc");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "client");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            principal_from_certificate(cert.der()).as_deref(),
            Some("User:CN=client,O=Example\\, Inc")
        );
        assert_eq!(principal_from_certificate(b"not a certificate"), None);

        // A BMPString subject is text; a value that is no string is `#` + its DER in hex.
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            rcgen::DnValue::BmpString("J\u{f6}rg Smith".try_into().unwrap()),
        );
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            principal_from_certificate(cert.der()).as_deref(),
            Some("User:CN=J\u{f6}rg Smith")
        );
        let octets = Any::from_tag_and_data(Tag::OctetString, &[0xde, 0xad]);
        assert_eq!(attribute_value(&octets), "#0402dead");
        let long = vec![7u8; 200];
        let bits = Any::from_tag_and_data(Tag::BitString, &long);
        assert!(attribute_value(&bits).starts_with("#0381c80707"));
    }
}
