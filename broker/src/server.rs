//! The network side: [`start`] binds the listener and runs one task per connection; each
//! connection answers its requests strictly in order. The connection's task reads the
//! frames, runs the handlers and writes the answers itself: a request that waits for nothing
//! else costs one wake-up, not one per task it passes through.
//!
//! Requests of a connection are handled one after the other, except that a handler may call
//! [`release_request_order`] once everything that orders it before the next request is done
//! (Produce: its appends are written, only their fsync is outstanding); the next request then
//! starts while it finishes. Responses are still written in request order.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::codec::{self, ResponseFrame};
use crate::config::{parse_host_port, BrokerConfig};
use crate::connection_limits::{self, ConnectionCounter, ConnectionPermit};
use crate::error::{BrokerError, Result};
use crate::handlers::{self, api_name, DispatchError};
use crate::metrics;
use crate::producer_ids::ProducerIdAllocator;
use crate::security::{ListenerEndpoint, Security, Session};
use crate::state::BrokerState;
use crate::storage::{StorageConfig, Store};

/// How long a client may take to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for in-flight requests before dropping connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Bytes of request frames a connection holds while their requests are handled or answered
/// (a frame is read while fewer are held), so a pipelining client cannot make the broker
/// keep `MAX_IN_FLIGHT` maximum-size frames.
const READ_AHEAD_BYTES: usize = 8 * 1024 * 1024;

/// Requests of one connection in flight at once (handled or waiting to be written).
const MAX_IN_FLIGHT: usize = 16;

tokio::task_local! {
    /// The running request's order gate (see [`release_request_order`]).
    static ORDER_GATE: OrderGate;
}

/// Lets the connection start its next request. Fired at most once: by the handler through
/// [`release_request_order`], else when the request is done (`true` = go on reading,
/// `false` = the connection closes after this request).
struct OrderGate(Mutex<Option<oneshot::Sender<bool>>>);

impl OrderGate {
    fn fire(&self, go_on: bool) {
        let sender = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(go_on);
        }
    }
}

/// Called by a handler once the request is ordered before whatever the same connection sends
/// next (e.g. Produce after its appends are written, before their fsync): the connection
/// may start on its next request. Its response is still written in order. Outside a
/// connection's request (tests calling a handler directly) it does nothing.
pub fn release_request_order() {
    let _ = ORDER_GATE.try_with(|gate| gate.fire(true));
}

/// The running request's order gate, taken out of the request so that another thread (a
/// blocking task) can release it; see [`take_request_order`].
pub struct RequestOrder(oneshot::Sender<bool>);

impl RequestOrder {
    /// Lets the connection start its next request, as [`release_request_order`] does.
    pub fn release(self) {
        let _ = self.0.send(true);
    }
}

/// Takes the running request's order gate, to be released later from outside the request's
/// task ([`RequestOrder::release`]). If it is dropped unreleased, the connection closes after
/// this request. `None` outside a connection's request or once the gate has fired.
pub fn take_request_order() -> Option<RequestOrder> {
    ORDER_GATE
        .try_with(|gate| gate.0.lock().unwrap_or_else(|p| p.into_inner()).take())
        .ok()
        .flatten()
        .map(RequestOrder)
}

/// A running broker. Dropping it leaves the broker running until the runtime ends; call
/// [`BrokerHandle::shutdown`] to stop it and flush the log.
pub struct BrokerHandle {
    local_addr: SocketAddr,
    listeners: Vec<(Arc<ListenerEndpoint>, SocketAddr)>,
    metrics_addr: Option<SocketAddr>,
    shutdown_tx: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    state: Arc<BrokerState>,
}

impl BrokerHandle {
    /// The address the listener is bound to (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `HOST:PORT` to give clients as `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.local_addr.to_string()
    }

    /// The bound address of the listener named `name` (e.g. `SASL_SSL`), port 0 resolved.
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(l, _)| l.name.eq_ignore_ascii_case(name))
            .map(|(_, addr)| *addr)
    }

    /// Every listener with its bound address, in configuration order.
    pub fn listeners(&self) -> impl Iterator<Item = (&ListenerEndpoint, SocketAddr)> {
        self.listeners.iter().map(|(l, addr)| (&**l, *addr))
    }

    /// The broker's shared state, for driving handlers without a socket (fuzzing, tests).
    #[doc(hidden)]
    pub fn state(&self) -> &Arc<BrokerState> {
        &self.state
    }

    /// The broker's log store (tests re-apply topic configs after a restart through it).
    pub fn store(&self) -> &crate::storage::Store {
        &self.state.store
    }

    /// The bound Prometheus endpoint, when `metrics_listen` was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting, lets in-flight requests finish (up to a few seconds), flushes the
    /// storage, and returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown_tx.send(true);
        self.state.groups.begin_shutdown();
        if let Err(e) = self.server.await {
            tracing::error!(error = %e, "server task failed");
        }
        self.state.groups.close();
        let store = self.state.store.clone();
        match tokio::task::spawn_blocking(move || store.flush_all()).await {
            Ok(Ok(())) => tracing::info!("storage flushed; broker stopped"),
            Ok(Err(e)) => tracing::error!(error = %e, "flushing storage at shutdown failed"),
            Err(e) => tracing::error!(error = %e, "flush task failed"),
        }
    }
}

/// Opens the storage, binds the listener (and the metrics endpoint) and starts serving.
/// Returns once the listener is bound.
pub async fn start(config: BrokerConfig) -> Result<BrokerHandle> {
    if config.default_partitions < 1 {
        return Err(BrokerError::Config(format!(
            "default partitions must be at least 1, got {}",
            config.default_partitions
        )));
    }
    config.validate_limits().map_err(BrokerError::Config)?;
    let security = Arc::new(Security::open(&config)?);
    let mut bound = Vec::new();
    for listener_config in config.effective_listeners() {
        if bound
            .iter()
            .any(|(l, _, _): &(Arc<ListenerEndpoint>, _, _)| l.name == listener_config.name)
        {
            return Err(BrokerError::Config(format!(
                "listener name {} is used twice",
                listener_config.name
            )));
        }
        let addr = listener_config.addr;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| BrokerError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| BrokerError::Bind { addr, source })?;
        let (host, port) = match &listener_config.advertised {
            Some(advertised) => parse_host_port(advertised).ok_or_else(|| {
                BrokerError::Config(format!(
                    "advertised listener {advertised:?} is not HOST:PORT"
                ))
            })?,
            None => (local_addr.ip().to_string(), local_addr.port()),
        };
        let endpoint = Arc::new(ListenerEndpoint {
            name: listener_config.name.clone(),
            protocol: listener_config.protocol,
            advertised_host: host,
            advertised_port: i32::from(port),
        });
        bound.push((endpoint, local_addr, listener));
    }
    let local_addr = bound[0].1;
    let advertised_host = bound[0].0.advertised_host.clone();
    let advertised_port = bound[0].0.advertised_port;

    let storage_config = StorageConfig {
        repair_corrupt_logs: config.storage.repair_corrupt_logs || config.repair_corrupt_logs,
        ..config.storage.clone()
    };
    let data_dir = storage_config.data_dir.clone();
    let fsync = storage_config.fsync;
    let repair = config.repair_corrupt_logs;
    let (store, producer_ids, groups) = tokio::task::spawn_blocking(move || -> Result<_> {
        if let Some(dir) = &data_dir {
            std::fs::create_dir_all(dir).map_err(|source| BrokerError::Io {
                context: format!("creating data dir {}", dir.display()),
                source,
            })?;
        }
        let store = Store::open(storage_config)?;
        let producer_ids = ProducerIdAllocator::open(data_dir.as_deref())?;
        let groups = crate::group::GroupCoordinator::open(
            data_dir.as_deref(),
            matches!(fsync, crate::storage::FsyncPolicy::EveryBatch),
            crate::group::GroupConfig {
                repair_corrupt_logs: repair,
                ..crate::group::GroupConfig::default()
            },
        )
        .map_err(|e| BrokerError::Io {
            context: "opening the group offsets store".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok((store, producer_ids, groups))
    })
    .await
    .map_err(|e| BrokerError::Io {
        context: "opening storage".into(),
        source: std::io::Error::other(e.to_string()),
    })??;

    // open the transaction layer (replays the transaction
    // log and completes prepared transactions) before serving.
    let producer_ids = Arc::new(producer_ids);
    let txn = {
        let txn_config = crate::txn::TxnConfig {
            data_dir: config.storage.data_dir.clone(),
            coordinator: config.transactions,
            marker_delay: Duration::from_millis(config.txn_marker_delay_ms),
            repair_corrupt_logs: config.repair_corrupt_logs,
        };
        let store = store.clone();
        let pids: Arc<dyn crate::txn::ProducerIdSource> = producer_ids.clone();
        tokio::task::spawn_blocking(move || crate::txn::TxnManager::open(store, txn_config, pids))
            .await
            .map_err(|e| BrokerError::Io {
                context: "opening transaction state".into(),
                source: std::io::Error::other(e.to_string()),
            })?
            .map_err(|e| BrokerError::Io {
                context: "opening transaction state".into(),
                source: std::io::Error::other(e.to_string()),
            })?
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let metrics_addr = match config.metrics_listen {
        Some(addr) => Some(metrics::serve(addr, shutdown_rx.clone()).await?),
        None => None,
    };
    for (topic, partitions) in store.topics() {
        for index in 0..partitions {
            if let Some(p) = store.partition(&topic, index) {
                metrics::log_end_offset(&topic, index, p.high_watermark());
            }
        }
    }
    let state = Arc::new(BrokerState {
        config,
        store,
        advertised_host,
        advertised_port,
        security,
        appended: Notify::new(),
        producer_ids,
        txn,
        groups: Arc::new(groups),
        shutdown: shutdown_rx.clone(),
    });
    // markers wake long-polling fetches and apply group
    // offsets; timeouts/expiry.
    {
        state
            .txn
            .set_offsets_sink(Arc::new(state.groups.offsets().clone()));
        let txn = Arc::clone(&state.txn);
        if let Err(e) = tokio::task::spawn_blocking(move || txn.complete_pending()).await {
            tracing::error!(error = %e, "completing prepared transactions failed");
        }
        let weak = Arc::downgrade(&state);
        state
            .txn
            .set_append_notifier(Arc::new(move |_topic: &str, _partition: i32| {
                if let Some(s) = weak.upgrade() {
                    s.appended.notify_waiters();
                }
            }));
        let task = state.txn.spawn_background(Duration::from_millis(100));
        let mut rx = shutdown_rx.clone();
        tokio::spawn(async move {
            crate::state::shutdown_signalled(&mut rx).await;
            task.abort();
        });
    }
    state.groups.spawn_timer();
    // With `FsyncPolicy::Interval` the store runs its own flusher thread.
    let mut accept_loops = JoinSet::new();
    let mut listeners = Vec::new();
    let counter = Arc::new(ConnectionCounter::new(state.config.connections));
    for (endpoint, addr, listener) in bound {
        tracing::info!(
            listener = %endpoint.name,
            protocol = %endpoint.protocol,
            local_addr = %addr,
            advertised = %format!("{}:{}", endpoint.advertised_host, endpoint.advertised_port),
            "broker listening"
        );
        accept_loops.spawn(accept_loop(
            listener,
            Arc::clone(&endpoint),
            Arc::clone(&state),
            Arc::clone(&counter),
            shutdown_rx.clone(),
        ));
        listeners.push((endpoint, addr));
    }
    let server = tokio::spawn(async move { while accept_loops.join_next().await.is_some() {} });
    Ok(BrokerHandle {
        local_addr,
        listeners,
        metrics_addr,
        shutdown_tx,
        server,
        state,
    })
}

async fn accept_loop(
    listener: TcpListener,
    endpoint: Arc<ListenerEndpoint>,
    state: Arc<BrokerState>,
    counter: Arc<ConnectionCounter>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = crate::state::shutdown_signalled(&mut shutdown) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let permit = match counter.admit(peer.ip()) {
                        Ok(permit) => permit,
                        Err(why) => {
                            // Closed before anything is read, as Kafka's acceptor does.
                            tracing::debug!(%peer, listener = %endpoint.name, limit = why.reason(), "connection refused");
                            connection_limits::record_refused(why);
                            drop(stream);
                            continue;
                        }
                    };
                    let state = Arc::clone(&state);
                    let shutdown = shutdown.clone();
                    let endpoint = Arc::clone(&endpoint);
                    connections.spawn(
                        open_connection(state, endpoint, stream, peer, shutdown, permit)
                            .instrument(tracing::info_span!("connection", %peer)),
                    );
                }
                Err(e) => {
                    // Typically EMFILE; back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        tracing::warn!("connections still busy after the shutdown grace period; dropping them");
        connections.shutdown().await;
    }
}

/// Runs the TLS handshake on TLS listeners (a failed one is logged and the connection
/// dropped), then serves the connection's requests.
async fn open_connection(
    state: Arc<BrokerState>,
    endpoint: Arc<ListenerEndpoint>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    // Held for the connection's life: its place in the connection counts.
    _permit: ConnectionPermit,
) {
    let _ = stream.set_nodelay(true);
    if !endpoint.protocol.uses_tls() {
        let session = Arc::new(Session::new(endpoint, peer, None));
        let (reader, writer) = stream.into_split();
        serve_connection(state, session, reader, writer, shutdown).await;
        return;
    }
    let Some(tls) = state.security.tls.clone() else {
        tracing::error!(listener = %endpoint.name, "TLS listener without a TLS configuration");
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::warn!(%peer, listener = %endpoint.name, error = %e, "TLS handshake failed; connection refused");
            crate::security::record_tls_handshake_failure(&endpoint.name);
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, listener = %endpoint.name, "TLS handshake timed out; connection refused");
            crate::security::record_tls_handshake_failure(&endpoint.name);
            return;
        }
    };
    let tls_principal = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| crate::security::tls::principal_from_certificate(cert));
    if let Some(principal) = &tls_principal {
        tracing::debug!(%peer, principal, "TLS client authenticated");
    }
    let principal = (!endpoint.protocol.uses_sasl())
        .then_some(tls_principal)
        .flatten();
    let session = Arc::new(Session::new(endpoint, peer, principal));
    let (reader, writer) = tokio::io::split(stream);
    serve_connection(state, session, reader, writer, shutdown).await;
}

/// What a request's handler yields: `None` closes the connection, `Some(None)` is a request
/// without a response.
type Answer = Option<Option<ResponseFrame>>;

/// A request handler, polled by its connection's own task.
type HandlerFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// One request of a connection, from its frame being read until its answer is written.
struct InFlight {
    /// The request's API, for the turnaround histogram.
    api: &'static str,
    /// When its frame was read off the socket.
    received: Instant,
    /// Size of its frame, counted against [`READ_AHEAD_BYTES`].
    bytes: usize,
    handler: Handler,
}

enum Handler {
    Running(HandlerFuture),
    Done(Answer),
}

impl InFlight {
    fn is_done(&self) -> bool {
        matches!(self.handler, Handler::Done(_))
    }
}

/// Polls every running handler of the connection once (so requests released by their order
/// gate progress side by side); a handler that panics closes the connection after the
/// answers before it, as a failed request does.
fn poll_handlers(in_flight: &mut VecDeque<InFlight>, cx: &mut Context<'_>) {
    for request in in_flight.iter_mut() {
        let Handler::Running(handler) = &mut request.handler else {
            continue;
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(answer)) => request.handler = Handler::Done(answer),
            Err(_) => {
                tracing::error!(
                    api = request.api,
                    "request handler panicked; closing connection"
                );
                request.handler = Handler::Done(None);
            }
        }
    }
}

/// The oldest request once its handler is done (its answer is written next).
fn poll_oldest(in_flight: &mut VecDeque<InFlight>, cx: &mut Context<'_>) -> Poll<InFlight> {
    poll_handlers(in_flight, cx);
    if in_flight.front().is_some_and(InFlight::is_done) {
        Poll::Ready(in_flight.pop_front().expect("checked non-empty"))
    } else {
        Poll::Pending
    }
}

/// Serves one connection in a single task: it reads a frame, runs the request's handler and
/// writes its answer itself, so a request that needs no other task (an in-memory produce, a
/// metadata request) is read, handled and answered in one wake-up of the connection. Handlers
/// of requests released by their order gate run on side by side (polled by the same task);
/// answers are written in request order.
async fn serve_connection<R, W>(
    state: Arc<BrokerState>,
    session: Arc<Session>,
    reader: R,
    writer: W,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let peer = session.peer;
    tracing::debug!(listener = %session.listener.name, "connection opened");
    metrics::connections(1.0);
    let max_request_bytes = state.config.max_request_bytes;
    let limits = state.config.connections;
    // Kafka's `sasl.server.max.receive.size`: until a SASL client has authenticated, its
    // frames (ApiVersions, SaslHandshake, SaslAuthenticate, bare tokens) stay small.
    let pre_auth_bytes = limits.sasl_max_receive_bytes.min(max_request_bytes);
    let mut reader = codec::FrameReader::new(reader, max_request_bytes);
    // Last time a request frame was read or an answer written.
    let mut last_active = tokio::time::Instant::now();
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    // Requests being handled or waiting for their turn to be written, in request order.
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    // Request bytes of `in_flight`.
    let mut in_flight_bytes = 0usize;
    // The newest request's gate: no new request starts until it fires.
    let mut gate: Option<oneshot::Receiver<bool>> = None;
    let mut reading = true;
    let span = tracing::Span::current();
    loop {
        if !reading && in_flight.is_empty() {
            break;
        }
        // The next frame is read only when its request may start, so a client cannot make
        // the connection hold more than READ_AHEAD_BYTES of requests (plus one frame).
        let may_start = reading
            && gate.is_none()
            && in_flight.len() < MAX_IN_FLIGHT
            && in_flight_bytes < READ_AHEAD_BYTES;
        // Frames are read only once the requests before them are done, so a SASL exchange
        // that authenticated the session is complete when the next frame's limit is chosen.
        reader.set_max(if session.is_authenticated() {
            max_request_bytes
        } else {
            pre_auth_bytes
        });
        // Idle: nothing in flight and no whole request for `connections.max.idle.ms`.
        let idle_at = limits
            .max_idle
            .filter(|_| reading && in_flight.is_empty())
            .map(|idle| last_active + idle);
        tokio::select! {
            biased;
            done = std::future::poll_fn(|cx| poll_oldest(&mut in_flight, cx)),
                if !in_flight.is_empty() => {
                in_flight_bytes -= done.bytes;
                let Handler::Done(Some(response)) = done.handler else {
                    // A bad request (or a failed handler): close after the earlier answers.
                    break;
                };
                last_active = tokio::time::Instant::now();
                if let Some(frame) = response {
                    metrics::bytes_out(frame.len());
                    if let Err(e) = write_frame(&mut writer, &frame).await {
                        tracing::debug!(error = %e, "write failed");
                        break;
                    }
                }
                if session.close_requested() {
                    // e.g. a failed SASL authentication: the answer is out, then close.
                    break;
                }
                // Answers that are ready go out in one write; otherwise this one goes out
                // now. (Waiting for queued requests to be handled first held each answer back
                // by the handling of the requests pipelined behind it: a producer with five
                // requests in flight saw its answers in bursts, and a long-polling fetch queued
                // behind a request held that request's answer for the whole poll.)
                std::future::poll_fn(|cx| {
                    poll_handlers(&mut in_flight, cx);
                    Poll::Ready(())
                })
                .await;
                let next_ready = in_flight.front().is_some_and(InFlight::is_done);
                if !next_ready {
                    if let Err(e) = writer.flush().await {
                        tracing::debug!(error = %e, "flush failed");
                        break;
                    }
                }
                metrics::request_turnaround(done.api, done.received.elapsed().as_secs_f64());
            }
            go_on = async { gate.as_mut().expect("checked some").await }, if gate.is_some() => {
                gate = None;
                if !matches!(go_on, Ok(true)) {
                    reading = false;
                }
            }
            _ = crate::state::shutdown_signalled(&mut shutdown), if reading => {
                reading = false;
            }
            _ = tokio::time::sleep_until(idle_at.unwrap_or(last_active)), if idle_at.is_some() => {
                tracing::debug!(idle_ms = limits.max_idle.map_or(0, |d| d.as_millis() as u64), "closing idle connection");
                metrics::idle_connection_closed();
                reading = false;
            }
            frame = reader.next_frame(), if may_start => match frame {
                Ok(Some(frame)) => {
                    let received = Instant::now();
                    last_active = tokio::time::Instant::now();
                    metrics::bytes_in(frame.len() + 4);
                    let api = codec::peek_prefix(&frame)
                        .ok()
                        .and_then(|p| kafka_protocol::messages::ApiKey::try_from(p.api_key).ok())
                        .map_or("unknown", api_name);
                    let bytes = frame.len();
                    let (tx, rx) = oneshot::channel();
                    gate = Some(rx);
                    let state = Arc::clone(&state);
                    let session = Arc::clone(&session);
                    let order = OrderGate(Mutex::new(Some(tx)));
                    let handler = ORDER_GATE
                        .scope(order, async move {
                            let response = handle_frame(&state, &session, frame).await;
                            let go_on = response.is_some() && !session.close_requested();
                            let _ = ORDER_GATE.try_with(|g| g.fire(go_on));
                            response
                        })
                        .instrument(span.clone());
                    in_flight_bytes += bytes;
                    in_flight.push_back(InFlight {
                        api,
                        received,
                        bytes,
                        handler: Handler::Running(Box::pin(handler)),
                    });
                }
                Ok(None) => reading = false,
                Err(e) => {
                    tracing::warn!(error = %e, "closing connection");
                    reading = false;
                }
            },
        }
    }
    let _ = writer.flush().await;
    metrics::connections(-1.0);
    tracing::debug!(%peer, "connection closed");
}

/// Writes a response's pieces in order. The writer buffers small pieces and passes large ones
/// (records served from the log) straight to the socket.
async fn write_frame<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &ResponseFrame,
) -> std::io::Result<()> {
    for part in frame.parts() {
        writer.write_all(part).await?;
    }
    Ok(())
}

/// Handles one frame inside a request span. `None` closes the connection; `Some(None)` is a
/// request without a response.
async fn handle_frame(
    state: &Arc<BrokerState>,
    session: &Arc<Session>,
    frame: Bytes,
) -> Option<Option<ResponseFrame>> {
    let started = Instant::now();
    let prefix = codec::peek_prefix(&frame).ok();
    let span = tracing::debug_span!(
        "request",
        api = prefix
            .and_then(|p| kafka_protocol::messages::ApiKey::try_from(p.api_key).ok())
            .map_or("unknown", api_name),
        version = prefix.map_or(-1, |p| p.api_version),
        correlation_id = tracing::field::Empty,
        client_id = tracing::field::Empty,
        latency_us = tracing::field::Empty,
    );
    let result = handlers::dispatch_in_session(state, session, frame)
        .instrument(span.clone())
        .await;
    let elapsed = started.elapsed();
    span.record("latency_us", elapsed.as_micros() as u64);
    match result {
        Ok(handled) => {
            let _entered = span.enter();
            tracing::debug!(api = api_name(handled.ctx.api_key), "request done");
            metrics::request_done(api_name(handled.ctx.api_key), "ok", elapsed.as_secs_f64());
            Some(handled.response)
        }
        Err(e) => {
            let _entered = span.enter();
            let api = match &e {
                DispatchError::Unsupported { api, .. } => api_name(*api),
                DispatchError::Unauthenticated { api } => api_name(*api),
                DispatchError::SaslFailed => "SaslAuthenticate",
                DispatchError::Codec(_) => "invalid",
            };
            tracing::warn!(error = %e, "bad request; closing connection");
            metrics::request_done(api, "closed", elapsed.as_secs_f64());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(handler: impl Future<Output = Answer> + Send + 'static) -> InFlight {
        InFlight {
            api: "Produce",
            received: Instant::now(),
            bytes: 1,
            handler: Handler::Running(Box::pin(handler)),
        }
    }

    #[tokio::test]
    async fn answers_leave_in_request_order_and_a_panicking_handler_closes() {
        let (first_tx, first_rx) = oneshot::channel::<()>();
        let mut in_flight = VecDeque::new();
        in_flight.push_back(request(async move {
            let _ = first_rx.await;
            Some(None)
        }));
        in_flight.push_back(request(async { Some(None) }));
        in_flight.push_back(request(async { panic!("handler bug") }));

        // The second and third are done, but the first is not: nothing leaves yet.
        let polled = std::future::poll_fn(|cx| Poll::Ready(poll_oldest(&mut in_flight, cx))).await;
        assert!(polled.is_pending());
        assert!(!in_flight[0].is_done() && in_flight[1].is_done() && in_flight[2].is_done());

        first_tx.send(()).expect("first handler waits");
        for expected_open in [true, true, false] {
            let done = std::future::poll_fn(|cx| poll_oldest(&mut in_flight, cx)).await;
            let Handler::Done(answer) = done.handler else {
                panic!("popped a running handler");
            };
            assert_eq!(answer.is_some(), expected_open);
        }
        assert!(in_flight.is_empty());
    }
}
