//! SASL authentication of onceflow's own client on a fresh connection: SaslHandshake v1
//! names the mechanism, then SaslAuthenticate v1 carries PLAIN's one message or SCRAM's two
//! round trips (KIP-152). The password never reaches a log line or an error message.

use bytes::Bytes;
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;

use super::scram::ScramClient;
use super::{SaslCredentials, SaslMechanism};
use crate::kafka::committer::RawClient;
use crate::kafka::{KafkaError, Result};

/// Kafka's SASL_AUTHENTICATION_FAILED.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// Kafka's UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

fn failed(creds: &SaslCredentials, why: String) -> KafkaError {
    KafkaError::Config(format!(
        "SASL {} authentication as {:?} failed: {why}",
        creds.mechanism.name(),
        creds.username
    ))
}

/// One SaslAuthenticate round trip: the server's bytes, or the failure.
async fn round_trip(
    client: &mut RawClient,
    creds: &SaslCredentials,
    bytes: Vec<u8>,
) -> Result<Vec<u8>> {
    let r = client
        .request(
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes)),
            1,
        )
        .await?;
    if r.error_code != 0 {
        let msg = r
            .error_message
            .as_ref()
            .map(|m| m.as_str().to_string())
            .unwrap_or_default();
        let what = if r.error_code == SASL_AUTHENTICATION_FAILED {
            "wrong user name or password".to_string()
        } else {
            format!("Kafka error code {}", r.error_code)
        };
        return Err(failed(creds, format!("{what} ({msg})")));
    }
    Ok(r.auth_bytes.to_vec())
}

/// Authenticates `client` with `creds`.
pub async fn authenticate(client: &mut RawClient, creds: &SaslCredentials) -> Result<()> {
    let password = creds.password.as_str();
    let hs = client
        .request(
            &SaslHandshakeRequest::default()
                .with_mechanism(StrBytes::from_static_str(creds.mechanism.name())),
            1,
        )
        .await?;
    if hs.error_code != 0 {
        let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
        let why = if hs.error_code == UNSUPPORTED_SASL_MECHANISM {
            format!("the broker does not enable it (it offers {offered:?})")
        } else {
            format!("SaslHandshake error code {}", hs.error_code)
        };
        return Err(failed(creds, why));
    }
    match creds.mechanism {
        SaslMechanism::Plain => {
            let mut msg = Vec::with_capacity(creds.username.len() + password.len() + 2);
            msg.push(0);
            msg.extend_from_slice(creds.username.as_bytes());
            msg.push(0);
            msg.extend_from_slice(password.as_bytes());
            round_trip(client, creds, msg).await?;
        }
        SaslMechanism::Scram(hash) => {
            let scram = ScramClient::new(hash, &creds.username, password);
            let server_first = round_trip(client, creds, scram.client_first().into_bytes()).await?;
            let server_first = String::from_utf8(server_first)
                .map_err(|_| failed(creds, "server-first message is not UTF-8".into()))?;
            let fin = scram
                .client_final(&server_first)
                .map_err(|e| failed(creds, e.to_string()))?;
            let server_final = round_trip(client, creds, fin.message.clone().into_bytes()).await?;
            let server_final = String::from_utf8(server_final)
                .map_err(|_| failed(creds, "server-final message is not UTF-8".into()))?;
            fin.verify_server_final(&server_final)
                .map_err(|e| failed(creds, e.to_string()))?;
        }
    }
    tracing::debug!(mechanism = creds.mechanism.name(), user = %creds.username, "SASL authenticated");
    Ok(())
}
