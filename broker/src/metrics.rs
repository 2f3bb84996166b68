//! Broker metrics (the `metrics` facade) and the Prometheus text endpoint.
//!
//! Names: `onceflow_broker_requests_total{api,outcome}`,
//! `onceflow_broker_request_duration_seconds{api}` (handling),
//! `onceflow_broker_request_turnaround_seconds{api}` (frame read to answer written),
//! `onceflow_broker_bytes_in_total`,
//! `onceflow_broker_bytes_out_total`, `onceflow_broker_partition_errors_total{api,code}`,
//! `onceflow_broker_log_end_offset{topic,partition}`, `onceflow_broker_connections`.
//! Without `--metrics-listen` no recorder is installed and recording costs next to nothing.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{BrokerError, Result};

/// Counts one handled request.
pub fn request_done(api: &'static str, outcome: &'static str, seconds: f64) {
    metrics::counter!("onceflow_broker_requests_total", "api" => api, "outcome" => outcome)
        .increment(1);
    metrics::histogram!("onceflow_broker_request_duration_seconds", "api" => api).record(seconds);
}

/// Records how long a request took from its frame being read off the socket to its answer
/// being written (handling plus waiting for the answers before it).
pub fn request_turnaround(api: &'static str, seconds: f64) {
    metrics::histogram!("onceflow_broker_request_turnaround_seconds", "api" => api).record(seconds);
}

/// Counts bytes received in request frames.
pub fn bytes_in(n: usize) {
    metrics::counter!("onceflow_broker_bytes_in_total").increment(n as u64);
}

/// Counts bytes sent in response frames.
pub fn bytes_out(n: usize) {
    metrics::counter!("onceflow_broker_bytes_out_total").increment(n as u64);
}

/// Counts a partition-level (or resource-level) error code in a response.
pub fn partition_error(api: &'static str, code: i16) {
    if code != 0 {
        metrics::counter!("onceflow_broker_partition_errors_total", "api" => api, "code" => code.to_string())
            .increment(1);
    }
}

/// Records a partition's log end offset (high watermark).
pub fn log_end_offset(topic: &str, partition: i32, offset: i64) {
    metrics::gauge!("onceflow_broker_log_end_offset", "topic" => topic.to_string(), "partition" => partition.to_string())
        .set(offset as f64);
}

/// Tracks open client connections.
pub fn connections(delta: f64) {
    metrics::gauge!("onceflow_broker_connections").increment(delta);
}

/// Counts one connection closed for idling past `connections.max.idle.ms`.
pub fn idle_connection_closed() {
    metrics::counter!("onceflow_broker_idle_connections_closed_total").increment(1);
}

/// Bucket bounds of the broker's duration histograms, 100 us to 60 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

static HANDLE: OnceLock<std::result::Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once; later brokers in the same process
/// share it.
fn prometheus_handle() -> Result<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            // every broker histogram is a duration: buckets (not a summary's quantiles), so
            // brokers aggregate with histogram_quantile
            PrometheusBuilder::new()
                .set_buckets(DURATION_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| BrokerError::Config(format!("cannot install the Prometheus recorder: {e}")))
}

/// Binds `addr` and serves the Prometheus text format to any HTTP GET until `shutdown`.
/// Returns the bound address.
pub async fn serve(addr: SocketAddr, mut shutdown: watch::Receiver<bool>) -> Result<SocketAddr> {
    let handle = prometheus_handle()?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BrokerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| BrokerError::Bind { addr, source })?;
    tracing::info!(%local, "serving Prometheus metrics");
    tokio::spawn(async move {
        let mut upkeep = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = crate::state::shutdown_signalled(&mut shutdown) => break,
                _ = upkeep.tick() => handle.run_upkeep(),
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let handle = handle.clone();
                        tokio::spawn(answer_scrape(stream, handle));
                    }
                    Err(e) => tracing::warn!(error = %e, "metrics accept failed"),
                },
            }
        }
    });
    Ok(local)
}

async fn answer_scrape(mut stream: tokio::net::TcpStream, handle: PrometheusHandle) {
    // Read the request head (bounded); any path gets the metrics.
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .is_err()
    {
        return;
    }
    let body = handle.render();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if let Err(e) = stream.write_all(response.as_bytes()).await {
        tracing::debug!(error = %e, "metrics scrape write failed");
    }
    let _ = stream.shutdown().await;
}
