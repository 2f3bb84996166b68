//! The start-up connection phase: before any Kafka client is made, every bootstrap address is
//! tried once, within `--connect-timeout-ms`, the way the job's clients will speak to it
//! (TLS and SASL as the client properties say), up to an ApiVersions answer. One address
//! that answers is enough, as for any Kafka client. When none does, the job stops with one
//! line that names every address and why it failed (name not resolved, connection refused,
//! timed out, TLS handshake failed, SASL authentication failed, not a Kafka listener), and
//! exit code 6 ([`super::exit_code::UNREACHABLE`]), before librdkafka prints anything.

use std::time::{Duration, Instant};

use kafka_protocol::messages::ApiVersionsRequest;
use kafka_protocol::protocol::StrBytes;

use crate::kafka::committer::RawClient;
use crate::kafka::security::ClientSecurity;
use crate::kafka::{ClientProperties, KafkaError, Result};

/// Checks that `--brokers` is `HOST:PORT[,HOST:PORT...]`: a host and a port in 1..=65535 per
/// entry. The error names the entry.
pub(crate) fn parse_brokers(s: &str) -> std::result::Result<String, String> {
    let entries: Vec<&str> = s.split(',').map(str::trim).collect();
    if entries.iter().all(|e| e.is_empty()) {
        return Err("--brokers needs at least one HOST:PORT".into());
    }
    for e in &entries {
        let Some((host, port)) = e.rsplit_once(':') else {
            return Err(format!("`{e}` is not HOST:PORT (no port)"));
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(format!("`{e}` is not HOST:PORT (no host)"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("`{e}` is not HOST:PORT (`{port}` is not a port)")),
        }
    }
    Ok(entries
        .into_iter()
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join(","))
}

/// Why one address did not answer.
fn classify(addr: &str, stage: &str, e: &KafkaError) -> String {
    let text = e.to_string();
    let lower = text.to_lowercase();
    let cause = if stage == "resolve" {
        "name not resolved".to_string()
    } else if lower.contains("connection refused") {
        "connection refused".to_string()
    } else if lower.contains("timed out") && stage == "connect" {
        "connect timed out".to_string()
    } else if lower.contains("tls handshake") {
        if lower.contains("corrupt message") || lower.contains("invalidcontenttype") {
            "TLS handshake failed: the port speaks plaintext".to_string()
        } else if lower.contains("eof") || lower.contains("reset by peer") {
            // a Kafka plaintext listener reads the TLS hello as an oversized frame and hangs up
            "TLS handshake failed: the server hung up on the TLS hello, so the port speaks plaintext (or is not Kafka)".to_string()
        } else {
            "TLS handshake failed".to_string()
        }
    } else if lower.contains("sasl") || lower.contains("authentication") {
        "SASL authentication failed".to_string()
    } else if stage == "api-versions" {
        "no Kafka answer to ApiVersions (a TLS or SASL listener spoken to in plaintext?)"
            .to_string()
    } else {
        "cannot connect".to_string()
    };
    format!("{addr}: {cause} ({text})")
}

/// Tries one address: resolve, connect (TLS, SASL), ApiVersions.
async fn try_one(addr: &str, security: &ClientSecurity) -> std::result::Result<(), String> {
    let resolved = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| classify(addr, "resolve", &KafkaError::Protocol(e.to_string())))?;
    if resolved.count() == 0 {
        return Err(format!("{addr}: name not resolved (no address)"));
    }
    let mut client = RawClient::connect(addr, security)
        .await
        .map_err(|e| classify(addr, "connect", &e))?;
    client
        .request(
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("onceflow"))
                .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION"))),
            3,
        )
        .await
        .map_err(|e| classify(addr, "api-versions", &e))?;
    Ok(())
}

/// Tries every address of `brokers` until one answers, for at most `timeout` in all
/// (addresses that fail fast are tried again until then). `Ok` without trying when the
/// properties ask for a mechanism onceflow's own client cannot speak (librdkafka's
/// connections then say what fails).
pub(crate) async fn check(
    brokers: &str,
    properties: &ClientProperties,
    timeout: Duration,
) -> Result<()> {
    if ClientSecurity::unsupported(properties).is_some() {
        tracing::info!("start-up connection check skipped: onceflow's own client cannot speak these client properties");
        return Ok(());
    }
    let security = ClientSecurity::from_properties(properties, "the start-up connection check")?;
    let started = Instant::now();
    let addrs: Vec<&str> = brokers.split(',').map(str::trim).collect();
    let mut pause = Duration::from_millis(100);
    loop {
        let mut failures = Vec::new();
        for addr in &addrs {
            let left = timeout.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, try_one(addr, &security)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(why)) => failures.push(why),
                Err(_) => failures.push(format!("{addr}: no answer within the connect timeout")),
            }
        }
        // authentication and TLS failures do not heal by waiting
        let settled = failures.iter().all(|f| {
            f.contains("TLS handshake") || f.contains("SASL") || f.contains("not resolved")
        });
        if settled || started.elapsed() + pause >= timeout {
            return Err(KafkaError::Unreachable(format!(
                "no bootstrap server answered within {} ms (--connect-timeout-ms): {}",
                timeout.as_millis(),
                failures.join("; ")
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_are_host_port_lists() {
        assert_eq!(parse_brokers("a:1").unwrap(), "a:1");
        assert_eq!(parse_brokers("a:1, b:9092").unwrap(), "a:1,b:9092");
        assert_eq!(parse_brokers("[::1]:9092").unwrap(), "[::1]:9092");
        for bad in [
            "notaport", "a:", ":9092", "a:0", "a:70000", "a:x", "", " , ",
        ] {
            let e = parse_brokers(bad).unwrap_err();
            assert!(
                e.contains(bad.trim()) || e.contains("at least one"),
                "{bad}: {e}"
            );
        }
    }
}
