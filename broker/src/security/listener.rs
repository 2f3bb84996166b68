//! Listener configuration: `[NAME=]PROTOCOL://HOST:PORT` endpoints with their security
//! protocol, as Kafka's `listeners` + `listener.security.protocol.map`.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use crate::config::parse_host_port;

/// How a listener's connections are secured (Kafka's `security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    /// Plain TCP, no authentication: every client is `User:ANONYMOUS`.
    Plaintext,
    /// TLS; the principal is the client certificate's subject (`User:CN=...`) when the
    /// client presents one, else `User:ANONYMOUS`.
    Ssl,
    /// SASL authentication over plain TCP.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name of the protocol (`SASL_SSL`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether clients must authenticate with SASL before any other request.
    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SecurityProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            other => Err(format!(
                "unknown security protocol {other:?} (expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"
            )),
        }
    }
}

/// One listener: a name (the protocol's name unless given), its protocol, the address to
/// bind and the `HOST:PORT` Metadata advertises to clients that connected through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Listener name, e.g. `SASL_SSL` or `INTERNAL`; unique per broker.
    pub name: String,
    /// The security protocol of its connections.
    pub protocol: SecurityProtocol,
    /// Address to bind; port 0 picks a free port.
    pub addr: SocketAddr,
    /// `HOST:PORT` returned by Metadata on this listener; default: the bound address.
    pub advertised: Option<String>,
}

impl ListenerConfig {
    /// A listener named after its protocol.
    pub fn new(protocol: SecurityProtocol, addr: SocketAddr) -> Self {
        ListenerConfig {
            name: protocol.name().to_string(),
            protocol,
            addr,
            advertised: None,
        }
    }

    /// Sets the name (builder style).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl FromStr for ListenerConfig {
    type Err = String;

    /// Parses `PROTOCOL://HOST:PORT` or `NAME=PROTOCOL://HOST:PORT` (a name maps a custom
    /// listener name to its protocol, like `listener.security.protocol.map`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, rest) = match s.split_once('=') {
            Some((name, rest)) if !name.contains("://") => (Some(name), rest),
            _ => (None, s),
        };
        let (protocol, host_port) = rest
            .split_once("://")
            .ok_or_else(|| format!("listener {s:?} is not [NAME=]PROTOCOL://HOST:PORT"))?;
        let protocol: SecurityProtocol = protocol.parse()?;
        let (host, port) = parse_host_port(host_port)
            .ok_or_else(|| format!("listener {s:?}: {host_port:?} is not HOST:PORT"))?;
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("listener {s:?}: cannot resolve {host:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("listener {s:?}: {host:?} resolves to no address"))?;
        let name = match name {
            Some(n) if n.is_empty() => return Err(format!("listener {s:?} has an empty name")),
            Some(n) => n.to_ascii_uppercase(),
            None => protocol.name().to_string(),
        };
        Ok(ListenerConfig {
            name,
            protocol,
            addr,
            advertised: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_parsing() {
        let l: ListenerConfig = "SASL_SSL://127.0.0.1:9094".parse().unwrap();
        assert_eq!(l.name, "SASL_SSL");
        assert_eq!(l.protocol, SecurityProtocol::SaslSsl);
        assert_eq!(l.addr, "127.0.0.1:9094".parse().unwrap());
        let l: ListenerConfig = "internal=plaintext://127.0.0.1:0".parse().unwrap();
        assert_eq!(l.name, "INTERNAL");
        assert_eq!(l.protocol, SecurityProtocol::Plaintext);
        assert!("TLS://127.0.0.1:1".parse::<ListenerConfig>().is_err());
        assert!("SSL://127.0.0.1".parse::<ListenerConfig>().is_err());
        assert!("127.0.0.1:9092".parse::<ListenerConfig>().is_err());
        assert!("=SSL://127.0.0.1:1".parse::<ListenerConfig>().is_err());
    }
}
