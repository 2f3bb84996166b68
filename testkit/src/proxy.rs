//! A TCP proxy on 127.0.0.1 between the clients and the broker that can drop the network:
//! `cut` closes every open connection (as a reset link would), `partition` also refuses new
//! connections for a while, `pause` holds every byte in flight (both directions, every
//! connection) until `resume`, as a stalled link would. The broker advertises the proxy's
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
                            std::thread::spawn(move || pump(client, s2, &up));
                            std::thread::spawn(move || pump(server, c2, &down));
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

/// Copies `from` to `to` until either side closes, then closes both; while the proxy is
/// paused, what it read waits.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
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
