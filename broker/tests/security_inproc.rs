//! Secured listeners started from the library (`BrokerConfig::listeners` and `security`), as
//! tests and embedded brokers do: a rustls client with the test CA (and a client
//! certificate) gets ApiVersions and Metadata over the SSL listener, Metadata advertises the
//! listener the request came in on, an untrusted client certificate is refused, and rdkafka
//! produces over SASL_PLAINTEXT with PLAIN.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use bytes::{Buf, BytesMut};
use kafka_protocol::messages::{
    ApiKey, MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use onceflow_broker::config::SecurityConfig;
use onceflow_broker::security::{ClientAuth, ListenerConfig, SecurityProtocol, TlsConfig};
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::RawClient;
use onceflow_testkit::records::client_config;
use onceflow_testkit::security::{plain_login, TestPki};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn any_port(protocol: SecurityProtocol) -> ListenerConfig {
    ListenerConfig::new(protocol, SocketAddr::from(([127, 0, 0, 1], 0)))
}

fn start(pki: &TestPki, users: &std::path::Path) -> Result<InProcessBroker> {
    InProcessBroker::start(BrokerConfig {
        listeners: vec![
            any_port(SecurityProtocol::Plaintext),
            any_port(SecurityProtocol::Ssl),
            any_port(SecurityProtocol::SaslPlaintext),
        ],
        security: SecurityConfig {
            tls: Some(TlsConfig {
                certificate_chain: pki.server_cert.clone(),
                private_key: pki.server_key.clone(),
                client_ca: Some(pki.ca.clone()),
                client_auth: ClientAuth::Required,
            }),
            sasl_users_file: Some(users.to_path_buf()),
            ..SecurityConfig::default()
        },
        ..BrokerConfig::default()
    })
}

/// A blocking TLS connection with the test CA and the given client certificate.
fn tls_connect(
    pki: &TestPki,
    addr: SocketAddr,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&pki.ca)? {
        roots.add(c?)?;
    }
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("127.0.0.1")?.to_owned(),
    )?;
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// Metadata v12 over any stream.
fn metadata_over(stream: &mut impl ReadWrite) -> Result<MetadataResponse> {
    let version = 12;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Metadata as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("tls-test")));
    let mut body = BytesMut::new();
    header.encode(&mut body, MetadataRequest::header_version(version))?;
    MetadataRequest::default()
        .with_topics(None)
        .encode(&mut body, version)?;
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame)?;
    stream.flush()?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let mut buf = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut buf)?;
    let mut buf = bytes::Bytes::from(buf);
    let header = ResponseHeader::decode(&mut buf, MetadataResponse::header_version(version))?;
    ensure!(header.correlation_id == 7);
    let resp = MetadataResponse::decode(&mut buf, version)?;
    ensure!(!buf.has_remaining(), "trailing bytes");
    Ok(resp)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[test]
fn library_started_tls_and_sasl_listeners() -> Result<()> {
    let pki = TestPki::generate()?;
    let users = pki.dir.path().join("users");
    std::fs::write(&users, "alice:plain:alice-pw\n")?;
    let broker = start(&pki, &users)?;
    let ssl = broker.listener_addr("SSL").context("no SSL listener")?;
    let sasl = broker
        .listener_addr("SASL_PLAINTEXT")
        .context("no SASL listener")?;

    // TLS with a trusted client certificate; Metadata advertises the SSL listener.
    let mut tls = tls_connect(&pki, ssl, &pki.client_cert, &pki.client_key)?;
    let meta = metadata_over(&mut tls)?;
    ensure!(
        meta.brokers[0].port == i32::from(ssl.port()),
        "SSL Metadata advertises {:?}",
        meta.brokers[0]
    );

    // An untrusted client certificate fails the handshake.
    let mut bad = tls_connect(&pki, ssl, &pki.untrusted_cert, &pki.untrusted_key)?;
    ensure!(
        metadata_over(&mut bad).is_err(),
        "untrusted client certificate accepted"
    );
    // The trusted connection keeps working.
    metadata_over(&mut tls)?;

    // SASL listener: raw login and rdkafka produce.
    let mut raw = RawClient::connect(sasl)?;
    ensure!(plain_login(&mut raw, "alice", "alice-pw")? == 0);
    let producer: BaseProducer = client_config(&sasl.to_string())
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "PLAIN")
        .set("sasl.username", "alice")
        .set("sasl.password", "alice-pw")
        .create()?;
    producer
        .send(BaseRecord::to("inproc-sasl").key("k").payload("v"))
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

#[test]
fn misconfigured_security_refuses_to_start() -> Result<()> {
    let no_tls = InProcessBroker::start(BrokerConfig {
        listeners: vec![any_port(SecurityProtocol::Ssl)],
        ..BrokerConfig::default()
    });
    ensure!(no_tls.is_err(), "SSL listener without certificates started");
    let no_users = InProcessBroker::start(BrokerConfig {
        listeners: vec![any_port(SecurityProtocol::SaslSsl)],
        ..BrokerConfig::default()
    });
    ensure!(no_users.is_err(), "SASL listener without users started");
    Ok(())
}
