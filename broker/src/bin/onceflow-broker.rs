//! The `onceflow-broker` binary: runs the reference broker until SIGTERM or ctrl-c.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use onceflow_broker::config::DEFAULT_MAX_REQUEST_BYTES;
use onceflow_broker::storage::{FsyncPolicy, StorageConfig};
use onceflow_broker::BrokerConfig;

/// A single-node Kafka-wire-protocol broker with a durable log.
#[derive(Debug, Parser)]
#[command(name = "onceflow-broker", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:9092")]
    listen: SocketAddr,
    /// Directory of the durable log.
    #[arg(
        long,
        required_unless_present = "in_memory",
        conflicts_with = "in_memory"
    )]
    data_dir: Option<PathBuf>,
    /// Keep the log in memory (lost on exit).
    #[arg(long)]
    in_memory: bool,
    /// HOST:PORT that Metadata returns to clients (default: the bound address).
    #[arg(long)]
    advertised_listener: Option<String>,
    /// Do not create unknown topics named by Metadata or Produce.
    #[arg(long)]
    no_auto_create_topics: bool,
    /// Partition count of auto-created topics.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    default_partitions: i32,
    /// When to fsync appends: every-batch, interval-ms:N or never.
    #[arg(long, default_value = "every-batch")]
    fsync: String,
    /// Roll log segments at this size in bytes.
    #[arg(long)]
    segment_bytes: Option<u64>,
    /// Default retention.ms of topics that do not set it: closed segments whose newest record
    /// is older are deleted (-1: keep regardless of age).
    #[arg(long, default_value_t = -1, value_parser = clap::value_parser!(i64).range(-1..))]
    log_retention_ms: i64,
    /// Default retention.bytes per partition of topics that do not set it: the oldest closed
    /// segments are deleted while the partition is larger (-1: no limit).
    #[arg(long, default_value_t = -1, value_parser = clap::value_parser!(i64).range(-1..))]
    log_retention_bytes: i64,
    /// How often the retention task runs (Kafka's log.retention.check.interval.ms).
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..))]
    log_retention_check_interval_ms: u64,
    /// Close connections that send a frame larger than this.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Serve Prometheus text metrics over HTTP on this address.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Start even if a durable file holds damage followed by valid data: drop the damaged
    /// bytes, keep the valid data after them, and report what was dropped. Without it such a
    /// file makes the broker refuse to start with an error naming the file and position.
    #[arg(long)]
    repair_corrupt_logs: bool,
    /// Largest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT above).
    #[arg(long, default_value_t = 900_000, value_parser = clap::value_parser!(i32).range(1..))]
    max_transaction_timeout_ms: i32,
    /// Forget transactional ids idle for this long (default 7 days).
    #[arg(long, default_value_t = 604_800_000, value_parser = clap::value_parser!(i64).range(1..))]
    transactional_id_expiration_ms: i64,
    /// Pause between log-cleaner ticks (compaction of `cleanup.policy=compact` topics and
    /// `segment.ms` rolls); 0 runs no cleaner.
    #[arg(long, default_value_t = 1000)]
    log_cleaner_backoff_ms: u64,
    /// Test failpoint: pause this long between persisting PrepareCommit/PrepareAbort and
    /// writing the markers (crash tests).
    #[arg(long, default_value_t = 0, hide = true)]
    txn_marker_delay_ms: u64,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let fsync: FsyncPolicy = match args.fsync.parse() {
        Ok(policy) => policy,
        Err(e) => {
            eprintln!("onceflow-broker: invalid --fsync {:?}: {e}", args.fsync);
            return std::process::ExitCode::from(2);
        }
    };
    let mut storage = StorageConfig {
        data_dir: if args.in_memory {
            None
        } else {
            args.data_dir.clone()
        },
        fsync,
        retention_ms: (args.log_retention_ms >= 0).then_some(args.log_retention_ms),
        retention_bytes: (args.log_retention_bytes >= 0).then_some(args.log_retention_bytes),
        retention_check_interval: Some(std::time::Duration::from_millis(
            args.log_retention_check_interval_ms,
        )),
        ..StorageConfig::default()
    };
    storage.cleaner_interval = (args.log_cleaner_backoff_ms > 0)
        .then(|| std::time::Duration::from_millis(args.log_cleaner_backoff_ms));
    if let Some(bytes) = args.segment_bytes {
        storage.segment_bytes = bytes;
    }
    let config = BrokerConfig {
        listen: args.listen,
        advertised_listener: args.advertised_listener,
        storage,
        auto_create_topics: !args.no_auto_create_topics,
        default_partitions: args.default_partitions,
        max_request_bytes: args.max_request_bytes,
        metrics_listen: args.metrics_listen,
        transactions: onceflow_broker::txn::CoordinatorConfig {
            max_transaction_timeout_ms: args.max_transaction_timeout_ms,
            transactional_id_expiration_ms: args.transactional_id_expiration_ms,
        },
        txn_marker_delay_ms: args.txn_marker_delay_ms,
        repair_corrupt_logs: args.repair_corrupt_logs,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("onceflow-broker: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: BrokerConfig) -> std::process::ExitCode {
    // Listen for SIGTERM / ctrl-c before anything else: a supervisor that stops the broker
    // right after `listening on` must get the graceful shutdown, not the default action.
    let stop = StopSignals::install();
    let broker = match onceflow_broker::start(config).await {
        Ok(broker) => broker,
        Err(e) => {
            eprintln!("onceflow-broker: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on {}", broker.local_addr());
        let _ = stdout.flush();
    }
    stop.wait().await;
    tracing::info!("shutting down");
    broker.shutdown().await;
    std::process::ExitCode::SUCCESS
}

/// SIGTERM and SIGINT (ctrl-c), registered when created: a signal that arrives later, even
/// before anyone waits, is kept for [`StopSignals::wait`].
#[cfg(unix)]
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl StopSignals {
    fn install() -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind: SignalKind, name: &str| {
            signal(kind)
                .map_err(|e| tracing::warn!(error = %e, "cannot listen for {name}"))
                .ok()
        };
        StopSignals {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            int: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }

    async fn wait(mut self) {
        async fn recv(s: Option<&mut tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = recv(self.term.as_mut()) => {}
            _ = recv(self.int.as_mut()) => {}
        }
    }
}

#[cfg(not(unix))]
struct StopSignals;

#[cfg(not(unix))]
impl StopSignals {
    fn install() -> StopSignals {
        StopSignals
    }

    async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}
