//! Shared set-up of the security tests: test certificates made with rcgen (a CA, a server
//! certificate for 127.0.0.1/localhost, a client certificate, and a client certificate of
//! an untrusted CA) written as PEM files, a users file, and SASL/PLAIN login over the raw
//! client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use bytes::Bytes;
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::common::RawClient;

/// PEM files of one test PKI, in a temporary directory.
pub struct TestPki {
    /// Keeps the files.
    pub dir: tempfile::TempDir,
    /// The trusted CA certificate.
    pub ca: PathBuf,
    /// Server certificate (SANs 127.0.0.1 and localhost) signed by the CA.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// Client certificate `CN=client` signed by the CA.
    pub client_cert: PathBuf,
    /// The client's key.
    pub client_key: PathBuf,
    /// Client certificate `CN=intruder` signed by a CA the broker does not trust.
    pub untrusted_cert: PathBuf,
    /// Its key.
    pub untrusted_key: PathBuf,
}

fn ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    sans: &[&str],
) -> Result<(String, String)> {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl TestPki {
    /// Generates the certificates and writes them.
    pub fn generate() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let trusted = ca("onceflow test CA")?;
        let other = ca("untrusted test CA")?;
        let (server_cert, server_key) = leaf(&trusted, "broker", &["127.0.0.1", "localhost"])?;
        let (client_cert, client_key) = leaf(&trusted, "client", &[])?;
        let (untrusted_cert, untrusted_key) = leaf(&other, "intruder", &[])?;
        Ok(TestPki {
            ca: write("ca.pem", &trusted.pem())?,
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server.key", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client.key", &client_key)?,
            untrusted_cert: write("untrusted.pem", &untrusted_cert)?,
            untrusted_key: write("untrusted.key", &untrusted_key)?,
            dir,
        })
    }
}

/// Path as a `&str` argument.
pub fn arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// SaslHandshake v1 + SaslAuthenticate v2 with PLAIN; returns the authenticate error code.
pub fn plain_login(client: &mut RawClient, user: &str, password: &str) -> Result<i16> {
    let hs = client.request(
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        1,
    )?;
    ensure!(hs.error_code == 0, "handshake error {}", hs.error_code);
    let token = format!("\0{user}\0{password}");
    let auth = client.request(
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
        2,
    )?;
    Ok(auth.error_code)
}
