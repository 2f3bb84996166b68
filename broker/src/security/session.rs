//! One connection's security context: the listener it came in on, the peer, the
//! authenticated principal and the SASL exchange in progress.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::listener::SecurityProtocol;
use super::scram::{self, ScramHash, ScramServer};
use super::users::Users;

/// The principal of unauthenticated PLAINTEXT/SSL clients.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// SASL mechanisms the broker offers, in SaslHandshake order.
pub const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// A bound listener as a connection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerEndpoint {
    /// The listener's name.
    pub name: String,
    /// Its security protocol.
    pub protocol: SecurityProtocol,
    /// Host Metadata advertises on this listener.
    pub advertised_host: String,
    /// Port Metadata advertises on this listener.
    pub advertised_port: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(ScramHash),
}

impl Mechanism {
    fn parse(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case("PLAIN") {
            Some(Mechanism::Plain)
        } else {
            ScramHash::from_mechanism(name).map(Mechanism::Scram)
        }
    }
}

#[derive(Debug)]
enum Stage {
    /// Nothing to do: the listener needs no SASL, or authentication completed.
    Done,
    /// Waiting for SaslHandshake.
    Handshake,
    /// Mechanism chosen; waiting for the first token (`raw`: SaslHandshake v0, tokens come
    /// as bare size-prefixed frames instead of SaslAuthenticate requests).
    FirstToken { mechanism: Mechanism, raw: bool },
    /// SCRAM server-first sent; waiting for the client-final message.
    ScramFinal {
        server: Box<ScramServer>,
        user: String,
        raw: bool,
    },
    /// Authentication failed; the connection closes.
    Failed,
}

/// The outcome of one SASL token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslStep {
    /// More rounds: send these bytes back.
    Continue(Vec<u8>),
    /// Authenticated as `principal`; send these (possibly empty) bytes back.
    Success {
        /// The bytes for the client (SCRAM's server-final message).
        response: Vec<u8>,
        /// `User:<name>`.
        principal: String,
        /// The mechanism used.
        mechanism: &'static str,
    },
    /// Authentication failed (SASL_AUTHENTICATION_FAILED); the connection closes after the
    /// response.
    Failed {
        /// Error message for the client.
        message: String,
        /// The user name the client gave, if it got that far (for the log line).
        user: Option<String>,
        /// The mechanism tried.
        mechanism: &'static str,
    },
    /// A token arrived out of order (ILLEGAL_SASL_STATE).
    IllegalState,
}

/// Security context of one connection, shared by its requests.
#[derive(Debug)]
pub struct Session {
    /// The listener the connection came in on.
    pub listener: Arc<ListenerEndpoint>,
    /// The client's address.
    pub peer: SocketAddr,
    principal: OnceLock<Arc<str>>,
    stage: Mutex<Stage>,
    close: AtomicBool,
}

impl Session {
    /// A new connection; `tls_principal` is the client certificate's principal, if any.
    /// SASL listeners start unauthenticated; the others are authenticated at once (as the
    /// certificate's principal, else `User:ANONYMOUS`).
    pub fn new(
        listener: Arc<ListenerEndpoint>,
        peer: SocketAddr,
        tls_principal: Option<String>,
    ) -> Self {
        let principal = OnceLock::new();
        let stage = if listener.protocol.uses_sasl() {
            Stage::Handshake
        } else {
            let _ = principal.set(Arc::from(tls_principal.as_deref().unwrap_or(ANONYMOUS)));
            Stage::Done
        };
        Session {
            listener,
            peer,
            principal,
            stage: Mutex::new(stage),
            close: AtomicBool::new(false),
        }
    }

    /// The session of requests handled without a connection (fuzzing, tests): PLAINTEXT,
    /// `User:ANONYMOUS`, advertising `host:port`.
    pub fn internal(host: &str, port: i32) -> Self {
        let listener = Arc::new(ListenerEndpoint {
            name: "PLAINTEXT".into(),
            protocol: SecurityProtocol::Plaintext,
            advertised_host: host.to_string(),
            advertised_port: port,
        });
        Session::new(listener, SocketAddr::from(([127, 0, 0, 1], 0)), None)
    }

    /// The authenticated principal (`User:...`); `None` before SASL authentication.
    pub fn principal(&self) -> Option<&str> {
        self.principal.get().map(|p| &**p)
    }

    /// Whether requests other than ApiVersions and the SASL APIs may be served.
    pub fn is_authenticated(&self) -> bool {
        self.principal.get().is_some()
    }

    /// Asks the connection to close once the current response is written.
    pub fn close_after_response(&self) {
        self.close.store(true, Ordering::Release);
    }

    /// Whether [`Session::close_after_response`] was called.
    pub fn close_requested(&self) -> bool {
        self.close.load(Ordering::Acquire)
    }

    /// Whether the next frame is a bare SASL token (after a SaslHandshake v0).
    pub fn expects_raw_token(&self) -> bool {
        matches!(
            &*self.stage.lock(),
            Stage::FirstToken { raw: true, .. } | Stage::ScramFinal { raw: true, .. }
        )
    }

    /// SaslHandshake: picks the mechanism. Errors are Kafka error codes:
    /// ILLEGAL_SASL_STATE (34) when no handshake is expected, UNSUPPORTED_SASL_MECHANISM (33).
    pub fn handshake(&self, mechanism: &str, version: i16) -> Result<(), i16> {
        let mut stage = self.stage.lock();
        if !matches!(*stage, Stage::Handshake) {
            return Err(34);
        }
        let Some(mechanism) = Mechanism::parse(mechanism) else {
            return Err(33);
        };
        *stage = Stage::FirstToken {
            mechanism,
            raw: version == 0,
        };
        Ok(())
    }

    /// One SASL token (SaslAuthenticate's `auth_bytes`, or a bare frame after handshake v0).
    pub fn authenticate(&self, users: &Users, token: &[u8]) -> SaslStep {
        let mut stage = self.stage.lock();
        let current = std::mem::replace(&mut *stage, Stage::Failed);
        let (step, next) = match current {
            Stage::FirstToken { mechanism, raw } => match mechanism {
                Mechanism::Plain => (plain(users, token), Stage::Done),
                Mechanism::Scram(hash) => scram_first(users, hash, token, raw),
            },
            Stage::ScramFinal { server, user, .. } => match server.finish(token) {
                Ok(response) => (
                    SaslStep::Success {
                        response,
                        principal: format!("User:{user}"),
                        mechanism: server_mechanism(&server),
                    },
                    Stage::Done,
                ),
                Err(e) => (
                    SaslStep::Failed {
                        message: e.0,
                        user: Some(user),
                        mechanism: server_mechanism(&server),
                    },
                    Stage::Failed,
                ),
            },
            other => {
                *stage = other;
                return SaslStep::IllegalState;
            }
        };
        *stage = match (&step, next) {
            (SaslStep::Failed { .. }, _) => Stage::Failed,
            (_, next) => next,
        };
        if let SaslStep::Success { principal, .. } = &step {
            let _ = self.principal.set(Arc::from(principal.as_str()));
        }
        step
    }
}

fn server_mechanism(server: &ScramServer) -> &'static str {
    server.hash().mechanism()
}

fn plain(users: &Users, token: &[u8]) -> SaslStep {
    let failed = |message: &str, user: Option<String>| SaslStep::Failed {
        message: message.to_string(),
        user,
        mechanism: "PLAIN",
    };
    let mut parts = token.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return failed("Invalid SASL/PLAIN request: expected 3 tokens", None);
    };
    let (Ok(authzid), Ok(user), Ok(password)) = (
        std::str::from_utf8(authzid),
        std::str::from_utf8(user),
        std::str::from_utf8(password),
    ) else {
        return failed("Invalid SASL/PLAIN request: not UTF-8", None);
    };
    if user.is_empty() {
        return failed("Authentication failed: username not specified", None);
    }
    if !authzid.is_empty() && authzid != user {
        return failed(
            "Authentication failed: Client requested an authorization id that is different from username",
            Some(user.to_string()),
        );
    }
    if users.check_plain(user, password) {
        SaslStep::Success {
            response: Vec::new(),
            principal: format!("User:{user}"),
            mechanism: "PLAIN",
        }
    } else {
        failed(
            "Authentication failed: Invalid username or password",
            Some(user.to_string()),
        )
    }
}

fn scram_first(users: &Users, hash: ScramHash, token: &[u8], raw: bool) -> (SaslStep, Stage) {
    let failed = |message: String, user: Option<String>| {
        (
            SaslStep::Failed {
                message,
                user,
                mechanism: hash.mechanism(),
            },
            Stage::Failed,
        )
    };
    let first = match scram::parse_client_first(token) {
        Ok(first) => first,
        Err(e) => return failed(e.0, None),
    };
    let Some(credential) = users.scram(&first.username, hash) else {
        return failed(
            "Authentication failed: Invalid user credentials".into(),
            Some(first.username),
        );
    };
    let user = first.username.clone();
    let server = ScramServer::new(credential.clone(), first);
    let reply = server.server_first().to_vec();
    (
        SaslStep::Continue(reply),
        Stage::ScramFinal {
            server: Box::new(server),
            user,
            raw,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sasl_session() -> Session {
        let listener = Arc::new(ListenerEndpoint {
            name: "SASL_PLAINTEXT".into(),
            protocol: SecurityProtocol::SaslPlaintext,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
        });
        Session::new(listener, SocketAddr::from(([127, 0, 0, 1], 1)), None)
    }

    #[test]
    fn plain_exchange() {
        let users = Users::parse("alice:plain:pw").unwrap();
        let s = sasl_session();
        assert!(!s.is_authenticated());
        assert_eq!(
            s.authenticate(&users, b"\0alice\0pw"),
            SaslStep::IllegalState
        );
        assert_eq!(s.handshake("GSSAPI", 1), Err(33));
        s.handshake("PLAIN", 1).unwrap();
        assert_eq!(s.handshake("PLAIN", 1), Err(34));
        assert!(matches!(
            s.authenticate(&users, b"\0alice\0pw"),
            SaslStep::Success { .. }
        ));
        assert_eq!(s.principal(), Some("User:alice"));

        let s = sasl_session();
        s.handshake("PLAIN", 0).unwrap();
        assert!(s.expects_raw_token());
        match s.authenticate(&users, b"\0alice\0wrong") {
            SaslStep::Failed { user, .. } => assert_eq!(user.as_deref(), Some("alice")),
            other => panic!("{other:?}"),
        }
        assert!(!s.is_authenticated());
        assert!(matches!(
            s.authenticate(&users, b"\0alice\0pw"),
            SaslStep::IllegalState
        ));
    }
}
