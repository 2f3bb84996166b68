//! The rustls client configuration from librdkafka's `ssl.*` properties: trusted CAs
//! (`ssl.ca.location` file or directory, `ssl.ca.pem`, else the system's store), the client
//! certificate and key (`ssl.certificate.location`/`ssl.certificate.pem`,
//! `ssl.key.location`/`ssl.key.pem`), `enable.ssl.certificate.verification` and
//! `ssl.endpoint.identification.algorithm` (`https`, librdkafka's default, checks the host
//! name; `none` checks the chain only).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::kafka::{ClientProperties, KafkaError, Result};

fn config_error(msg: String) -> KafkaError {
    KafkaError::Config(msg)
}

fn certs_from_pem(bytes: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("{what}: not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(config_error(format!("{what}: no PEM certificate in it")));
    }
    Ok(certs)
}

fn read(path: &Path, key: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| config_error(format!("{key}={}: {e}", path.display())))
}

/// The trusted roots: `ssl.ca.pem`, `ssl.ca.location` (a PEM file or a directory of them),
/// or the operating system's store when neither is set (as librdkafka does).
fn roots(p: &ClientProperties) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let mut add = |certs: Vec<CertificateDer<'static>>, what: &str| -> Result<()> {
        for c in certs {
            roots
                .add(c)
                .map_err(|e| config_error(format!("{what}: unusable CA certificate: {e}")))?;
        }
        Ok(())
    };
    let mut any = false;
    if let Some(pem) = p.get("ssl.ca.pem") {
        add(certs_from_pem(pem.as_bytes(), "ssl.ca.pem")?, "ssl.ca.pem")?;
        any = true;
    }
    match p.get("ssl.ca.location") {
        Some(loc) if loc != "probe" => {
            let path = Path::new(loc);
            let what = format!("ssl.ca.location={loc}");
            if path.is_dir() {
                let entries =
                    std::fs::read_dir(path).map_err(|e| config_error(format!("{what}: {e}")))?;
                for entry in entries.flatten() {
                    let bytes = read(&entry.path(), "ssl.ca.location")?;
                    // a directory may hold other files (hash links to the same PEMs, CRLs)
                    if let Ok(certs) = certs_from_pem(&bytes, &what) {
                        add(certs, &what)?;
                    }
                }
            } else {
                add(
                    certs_from_pem(&read(path, "ssl.ca.location")?, &what)?,
                    &what,
                )?;
            }
            any = true;
        }
        _ => {}
    }
    if !any {
        let native = rustls_native_certs::load_native_certs();
        for c in native.certs {
            let _ = roots.add(c);
        }
    }
    if roots.is_empty() {
        return Err(config_error(
            "no trusted CA certificate: set ssl.ca.location to the PEM file of the cluster's CA"
                .into(),
        ));
    }
    Ok(roots)
}

/// The client certificate chain and key, when the properties give both.
fn client_auth(
    p: &ClientProperties,
) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>> {
    let chain = match (
        p.get("ssl.certificate.pem"),
        p.get("ssl.certificate.location"),
    ) {
        (Some(pem), _) => Some(certs_from_pem(pem.as_bytes(), "ssl.certificate.pem")?),
        (None, Some(loc)) => Some(certs_from_pem(
            &read(Path::new(loc), "ssl.certificate.location")?,
            &format!("ssl.certificate.location={loc}"),
        )?),
        (None, None) => None,
    };
    let key = match (p.get("ssl.key.pem"), p.get("ssl.key.location")) {
        (Some(pem), _) => Some(
            PrivateKeyDer::from_pem_slice(pem.as_bytes())
                .map_err(|e| config_error(format!("ssl.key.pem: not a PEM private key: {e}")))?,
        ),
        (None, Some(loc)) => Some(
            PrivateKeyDer::from_pem_slice(&read(Path::new(loc), "ssl.key.location")?).map_err(
                |e| {
                    config_error(format!(
                        "ssl.key.location={loc}: not an unencrypted PEM private key: {e}"
                    ))
                },
            )?,
        ),
        (None, None) => None,
    };
    match (chain, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(config_error(
            "ssl.certificate.location is set without ssl.key.location".into(),
        )),
        (None, Some(_)) => Err(config_error(
            "ssl.key.location is set without ssl.certificate.location".into(),
        )),
    }
}

fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "true" | "1" | "yes" | "on"
    )
}

/// The rustls configuration for `properties` (which use `ssl` or `sasl_ssl`).
pub fn client_config(p: &ClientProperties) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS: {e}")))?;
    let verify_chain = p
        .get("enable.ssl.certificate.verification")
        .is_none_or(is_true);
    let verify_name = p
        .get("ssl.endpoint.identification.algorithm")
        .is_none_or(|v| v.trim().eq_ignore_ascii_case("https"));
    let builder = if !verify_chain {
        tracing::warn!(
            "enable.ssl.certificate.verification=false: the broker's certificate is not verified"
        );
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(
                provider.signature_verification_algorithms,
            )))
    } else {
        let roots = Arc::new(roots(p)?);
        if verify_name {
            builder.with_root_certificates(roots)
        } else {
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| config_error(format!("TLS: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        }
    };
    match client_auth(p)? {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| config_error(format!("TLS client certificate and key: {e}"))),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The name to verify the broker's certificate against: the host of `HOST:PORT`.
pub fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| KafkaError::Protocol(format!("TLS server name {host:?}: {e}")))
}

/// `ssl.endpoint.identification.algorithm=none`: the chain must be trusted, the host name is
/// not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `enable.ssl.certificate.verification=false`: any certificate is accepted (the handshake
/// signatures are still checked).
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}
