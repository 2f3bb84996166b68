//! A minimal HTTP/1.0 client for a job's `/metrics`, `/healthz` and `/readyz`, and a free
//! loopback port to serve them on.

use std::io::{Read, Write};
use std::time::Duration;

/// A loopback port nothing listens on now (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `GET path` on 127.0.0.1:`port`: the status code and the body, or the error (the
/// listener is not up, or the connection broke).
pub fn try_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP response: {out}"),
            )
        })?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// [`try_get`], panicking on a connection or protocol error.
pub fn get(port: u16, path: &str) -> (u16, String) {
    try_get(port, path).unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"))
}
