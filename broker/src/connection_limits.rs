//! Limits on client connections, as Kafka's `SocketServer` applies them: how many a broker
//! holds in all (`max.connections`) and from one address (`max.connections.per.ip`), how
//! long one may stay idle (`connections.max.idle.ms`), and how large a frame a connection of
//! a SASL listener may send before it has authenticated (`sasl.server.max.receive.size`).
//!
//! A connection over a count limit is closed right after accept, before anything is read
//! from it; it is counted in `onceflow_broker_connections_refused_total{reason}` and logged at
//! DEBUG. The counts are broker-wide (all listeners) and an IPv4-mapped IPv6 peer counts as
//! its IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// Kafka's default `sasl.server.max.receive.size`: 512 KiB.
pub const DEFAULT_SASL_MAX_RECEIVE_BYTES: usize = 524_288;
/// Kafka's default `connections.max.idle.ms`: 10 minutes.
pub const DEFAULT_MAX_IDLE: Duration = Duration::from_millis(600_000);
/// Default `max.connections` (Kafka's is unbounded, `Integer.MAX_VALUE`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default `max.connections.per.ip` (Kafka's is unbounded, `Integer.MAX_VALUE`).
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1_000;

/// The connection limits of a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections held at once over all listeners (`max.connections`).
    pub max_connections: usize,
    /// Connections held at once from one IP address (`max.connections.per.ip`).
    pub max_connections_per_ip: usize,
    /// A connection with no request in flight and no request arriving for this long is
    /// closed (`connections.max.idle.ms`); `None` never closes one for idling.
    pub max_idle: Option<Duration>,
    /// Largest frame a connection of a SASL listener may send before it authenticated
    /// (`sasl.server.max.receive.size`); larger ones close it.
    pub sasl_max_receive_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_idle: Some(DEFAULT_MAX_IDLE),
            sasl_max_receive_bytes: DEFAULT_SASL_MAX_RECEIVE_BYTES,
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max.connections` connections are open.
    Total,
    /// `max.connections.per.ip` connections from this address are open.
    PerIp,
}

impl Refused {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Total => "max_connections",
            Refused::PerIp => "max_connections_per_ip",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// Counts open connections against [`ConnectionLimits`], shared by every listener.
#[derive(Debug)]
pub struct ConnectionCounter {
    limits: ConnectionLimits,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted connection; dropping it gives its place back.
#[derive(Debug)]
pub struct ConnectionPermit {
    ip: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl ConnectionCounter {
    /// A counter with nothing open.
    pub fn new(limits: ConnectionLimits) -> Self {
        ConnectionCounter {
            limits,
            counts: Arc::default(),
        }
    }

    /// Admits a connection from `ip`, or says which limit it would pass.
    pub fn admit(&self, ip: IpAddr) -> Result<ConnectionPermit, Refused> {
        let ip = ip.to_canonical();
        let mut counts = self.counts.lock();
        if counts.total >= self.limits.max_connections {
            return Err(Refused::Total);
        }
        let from_ip = counts.per_ip.entry(ip).or_insert(0);
        if *from_ip >= self.limits.max_connections_per_ip {
            return Err(Refused::PerIp);
        }
        *from_ip += 1;
        counts.total += 1;
        Ok(ConnectionPermit {
            ip,
            counts: Arc::clone(&self.counts),
        })
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

/// Counts one connection refused at accept.
pub fn record_refused(why: Refused) {
    metrics::counter!("onceflow_broker_connections_refused_total", "reason" => why.reason())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn total_and_per_ip_limits_and_places_given_back() {
        let counter = ConnectionCounter::new(ConnectionLimits {
            max_connections: 3,
            max_connections_per_ip: 2,
            ..ConnectionLimits::default()
        });
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mapped_a = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        let first = counter.admit(a).unwrap();
        let _second = counter.admit(mapped_a).unwrap();
        assert_eq!(counter.admit(a).unwrap_err(), Refused::PerIp);
        let _third = counter.admit(b).unwrap();
        let other = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert_eq!(counter.admit(other).unwrap_err(), Refused::Total);
        drop(first);
        let _again = counter.admit(a).unwrap();
        assert_eq!(counter.admit(other).unwrap_err(), Refused::Total);
    }
}
