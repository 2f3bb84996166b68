//! The job's HTTP listener (`--metrics-listen`): `/metrics` (Prometheus text format),
//! `/healthz` (liveness), `/readyz` (readiness, see [`Health`]), `/status` (the job's figures
//! as JSON); every other path is 404.
//! One router, so further endpoints join the same listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;

use super::health::Health;
use crate::kafka::{KafkaError, Result};

/// Most connections the listener serves at once; it is for probes and a scraper, so a few
/// suffice, and further ones are closed at accept.
const MAX_CONNECTIONS: usize = 64;

/// What the routes answer from.
pub(crate) struct Endpoints {
    pub(crate) metrics: PrometheusHandle,
    pub(crate) health: Arc<Health>,
}

/// Binds `addr` now (so a taken address fails the start with a clear error) and serves the
/// routes on `rt` until the process exits.
pub(crate) fn serve(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    endpoints: Endpoints,
) -> Result<SocketAddr> {
    let std_listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| KafkaError::Config(format!("cannot serve metrics on {addr}: {e}")))?;
    let bound = std_listener.local_addr().unwrap_or(addr);
    let endpoints = Arc::new(endpoints);
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(std_listener)
        .map_err(|e| KafkaError::Config(format!("cannot serve metrics on {addr}: {e}")))?;
    let upkeep = endpoints.metrics.clone();
    rt.spawn(async move {
        // drains the histograms' buckets and summaries between scrapes
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    rt.spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "metrics listener: too many connections, closing");
                continue;
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let endpoints = endpoints.clone();
                    async move { Ok::<_, Infallible>(route(&endpoints, &req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "metrics listener: connection ended");
                }
                drop(slot);
            });
        }
    });
    Ok(bound)
}

fn route(endpoints: &Endpoints, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
    }
    match req.uri().path() {
        "/metrics" => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(endpoints.metrics.render())))
            .unwrap_or_else(|_| Response::new(Full::default())),
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/status" => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                "{}\n",
                endpoints.health.status()
            ))))
            .unwrap_or_else(|_| Response::new(Full::default())),
        "/readyz" => match endpoints.health.readiness() {
            Ok(why) => text(StatusCode::OK, format!("{why}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        other => text(
            StatusCode::NOT_FOUND,
            format!("no such path: {other} (try /metrics, /healthz, /readyz, /status)\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::default()))
}
