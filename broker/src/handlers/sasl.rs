//! SaslHandshake and SaslAuthenticate (and the bare-token exchange after a SaslHandshake
//! v0): the SASL exchange of a connection on a SASL listener.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{DispatchError, Handled, RequestContext};
use crate::security::{self, SaslStep, Session};
use crate::state::BrokerState;

/// SASL_AUTHENTICATION_FAILED.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// ILLEGAL_SASL_STATE.
const ILLEGAL_SASL_STATE: i16 = 34;
/// UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

/// Answers SaslHandshake: the mechanisms offered, and UNSUPPORTED_SASL_MECHANISM (the
/// connection then closes) or ILLEGAL_SASL_STATE (not a SASL listener, or the handshake
/// already happened).
pub fn handshake(
    _state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    let error_code = match ctx.session.handshake(req.mechanism.as_str(), ctx.version) {
        Ok(()) => 0,
        Err(code) => {
            if code == UNSUPPORTED_SASL_MECHANISM {
                // As Kafka: the answer lists the mechanisms, then the connection closes.
                ctx.session.close_after_response();
            }
            tracing::info!(
                peer = %ctx.session.peer,
                mechanism = req.mechanism.as_str(),
                code,
                "SaslHandshake refused"
            );
            code
        }
    };
    SaslHandshakeResponse::default()
        .with_error_code(error_code)
        .with_mechanisms(
            security::session::MECHANISMS
                .iter()
                .map(|m| StrBytes::from_static_str(m))
                .collect(),
        )
}

/// Answers SaslAuthenticate: the next challenge, success, or SASL_AUTHENTICATION_FAILED
/// (the connection closes after that response).
pub async fn authenticate(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let response = SaslAuthenticateResponse::default().with_session_lifetime_ms(0);
    match step(state, &ctx.session, req.auth_bytes).await {
        Ok(bytes) => response.with_auth_bytes(Bytes::from(bytes)),
        Err((code, message)) => {
            ctx.session.close_after_response();
            response
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)))
        }
    }
}

/// A bare SASL token after SaslHandshake v0: the reply is a bare size-prefixed token; a
/// failure closes the connection without a reply, as Kafka does.
pub async fn raw_token(
    state: &Arc<BrokerState>,
    session: &Arc<Session>,
    frame: Bytes,
) -> Result<Handled, DispatchError> {
    let reply = step(state, session, frame)
        .await
        .map_err(|_| DispatchError::SaslFailed)?;
    let mut out = BytesMut::with_capacity(4 + reply.len());
    out.put_i32(reply.len() as i32);
    out.put_slice(&reply);
    Ok(Handled {
        ctx: RequestContext {
            api_key: ApiKey::SaslAuthenticate,
            version: 0,
            correlation_id: 0,
            client_id: None,
            session: Arc::clone(session),
        },
        response: Some(out.freeze().into()),
    })
}

/// Runs one token through the session's exchange; logs and counts the outcome. The token
/// is handled on tokio's blocking pool: a PLAIN token runs PBKDF2 (up to 16384 iterations),
/// which must not hold up the async workers serving other connections.
async fn step(
    state: &Arc<BrokerState>,
    session: &Arc<Session>,
    token: Bytes,
) -> Result<Vec<u8>, (i16, String)> {
    let outcome = {
        let (state, session) = (Arc::clone(state), Arc::clone(session));
        tokio::task::spawn_blocking(move || session.authenticate(&state.security.users, &token))
            .await
    };
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(peer = %session.peer, error = %e, "SASL token handling failed");
            return Err((
                SASL_AUTHENTICATION_FAILED,
                "Authentication failed: internal error".into(),
            ));
        }
    };
    match outcome {
        SaslStep::Continue(bytes) => Ok(bytes),
        SaslStep::Success {
            response,
            principal,
            mechanism,
        } => {
            tracing::info!(peer = %session.peer, principal, mechanism, listener = %session.listener.name, "SASL authentication succeeded");
            security::record_authentication(mechanism, "success");
            Ok(response)
        }
        SaslStep::Failed {
            message,
            user,
            mechanism,
        } => {
            tracing::warn!(
                peer = %session.peer,
                user = %user.as_deref().unwrap_or("<none>"),
                mechanism,
                listener = %session.listener.name,
                reason = %message,
                "SASL authentication failed"
            );
            security::record_authentication(mechanism, "failure");
            Err((SASL_AUTHENTICATION_FAILED, message))
        }
        SaslStep::IllegalState => Err((
            ILLEGAL_SASL_STATE,
            "SaslAuthenticate without a preceding SaslHandshake".into(),
        )),
    }
}
