//! A TCP proxy on 127.0.0.1 between the clients and the broker that can drop the network:
//! `cut` closes every open connection (as a reset link would), `partition` also refuses new
//! connections for a while, `pause` holds every byte in flight (both directions, every
//! connection) until `resume`, as a stalled link would; `refuse_api` closes a connection on
//! the first request of an API key, as a broker that does not know it does (Kafka before the
//! API's version; plaintext connections only). The broker advertises the proxy's
//! address (`--advertised-listener`), so every client connection goes through it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    refusing: AtomicBool,
    /// Set while paused; the pumps wait on `resumed` before forwarding what they read.
    paused: Mutex<bool>,
    resumed: Condvar,
    /// Both sides of every open connection (clones, for shutdown).
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// API keys whose requests close their connection.
    refused_apis: Mutex<Vec<i16>>,
}

/// The proxy; stops on drop.
pub struct Proxy {
    addr: SocketAddr,
    listener: Option<TcpListener>,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Binds a port (so the broker can advertise it before it starts).
    pub fn bind() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        Proxy {
            addr,
            listener: Some(listener),
            shared: Arc::default(),
            accept: None,
        }
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Starts forwarding to `upstream` (`HOST:PORT`).
    pub fn start(&mut self, upstream: &str) {
        let upstream: SocketAddr = upstream.parse().expect("upstream address");
        let listener = self.listener.take().expect("proxy started twice");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let shared = self.shared.clone();
        self.accept = Some(std::thread::spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if shared.refusing.load(Ordering::Relaxed) {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        }
                        let _ = client.set_nonblocking(false);
                        let Ok(server) =
                            TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                        else {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        if let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
                            client.try_clone(),
                            server.try_clone(),
                            client.try_clone(),
                            server.try_clone(),
                        ) {
                            shared.conns.lock().unwrap().push((c3, s3));
                            let (up, down) = (shared.clone(), shared.clone());
                            std::thread::spawn(move || pump(client, s2, &up, true));
                            std::thread::spawn(move || pump(server, c2, &down, false));
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    /// Closes every open connection; returns how many there were.
    pub fn cut(&self) -> usize {
        let conns: Vec<_> = std::mem::take(&mut *self.shared.conns.lock().unwrap());
        for (c, s) in &conns {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
        conns.len()
    }

    /// Cuts every connection and refuses new ones for `d`.
    pub fn partition(&self, d: Duration) -> usize {
        self.shared.refusing.store(true, Ordering::Relaxed);
        let n = self.cut();
        std::thread::sleep(d);
        self.shared.refusing.store(false, Ordering::Relaxed);
        n
    }

    /// Stops forwarding: bytes read from either side wait in the proxy until [`Proxy::resume`]
    /// (connections stay open). Returns once set; a byte already written stays written.
    pub fn pause(&self) {
        *self.shared.paused.lock().unwrap() = true;
    }

    /// From now on, closes a connection (both sides) when a request with API key `key`
    /// arrives on it, before the broker sees it: what an older Kafka does with an API it does
    /// not know. Reads the Kafka framing of plaintext connections.
    pub fn refuse_api(&self, key: i16) {
        self.shared.refused_apis.lock().unwrap().push(key);
    }

    /// Forwards again, everything held first.
    pub fn resume(&self) {
        *self.shared.paused.lock().unwrap() = false;
        self.shared.resumed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.resume();
        self.cut();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Where the requests of a client's byte stream start (Kafka framing: a 4-byte size, then
/// the request, whose first 2 bytes are its API key).
#[derive(Default)]
struct Requests {
    /// Bytes of the current request still to pass.
    left: usize,
    /// The size and API key of the next request, as far as read.
    head: Vec<u8>,
}

impl Requests {
    /// Whether `bytes`, the stream's next ones, start a request with an API key in `refused`.
    fn start_refused(&mut self, mut bytes: &[u8], refused: &[i16]) -> bool {
        while !bytes.is_empty() {
            if self.left > 0 {
                let k = self.left.min(bytes.len());
                self.left -= k;
                bytes = &bytes[k..];
                continue;
            }
            let k = (6 - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
            if self.head.len() == 6 {
                let size =
                    i32::from_be_bytes([self.head[0], self.head[1], self.head[2], self.head[3]]);
                let key = i16::from_be_bytes([self.head[4], self.head[5]]);
                if refused.contains(&key) {
                    return true;
                }
                self.left = usize::try_from(size).unwrap_or(0).saturating_sub(2);
                self.head.clear();
            }
        }
        false
    }
}

/// Copies `from` to `to` until either side closes, then closes both; while the proxy is
/// paused, what it read waits. `requests`: `from` is the client, whose requests
/// [`Proxy::refuse_api`] may refuse.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, requests: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut framing = Requests::default();
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if requests {
                    let refused = shared.refused_apis.lock().unwrap();
                    if !refused.is_empty() && framing.start_refused(&buf[..n], &refused) {
                        break;
                    }
                }
                let mut paused = shared.paused.lock().unwrap();
                while *paused && !shared.stop.load(Ordering::Relaxed) {
                    paused = shared.resumed.wait(paused).unwrap();
                }
                drop(paused);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::Requests;

    fn request(key: i16, body: usize) -> Vec<u8> {
        let mut v = ((body + 2) as i32).to_be_bytes().to_vec();
        v.extend_from_slice(&key.to_be_bytes());
        v.extend(std::iter::repeat_n(7u8, body));
        v
    }

    #[test]
    fn a_refused_request_is_found_wherever_the_reads_split_the_stream() {
        let mut stream = request(3, 40);
        stream.extend(request(18, 0));
        stream.extend(request(65, 25));
        // where the refused request starts, and the last byte of its API key
        let at = (40 + 6) + 6;
        let key_end = at + 5;
        for chunk in [1, 2, 5, 7, 64] {
            let mut r = Requests::default();
            let mut passed = 0;
            let mut found = None;
            for piece in stream.chunks(chunk) {
                if r.start_refused(piece, &[65]) {
                    found = Some(passed);
                    break;
                }
                passed += piece.len();
            }
            let found = found.expect("the refused request is seen");
            assert!(
                found <= key_end && key_end < found + chunk,
                "chunk {chunk}: refused in the read from {found}"
            );
        }
        let mut r = Requests::default();
        assert!(!r.start_refused(&stream[..at], &[65]));
        assert!(!Requests::default().start_refused(&stream, &[1]));
    }
}
