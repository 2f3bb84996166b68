//! The `onceflow-broker` binary: runs the reference broker until SIGTERM or ctrl-c.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};
use onceflow_broker::config::{
    ConnectionLimits, SecurityConfig, DEFAULT_FETCH_MAX_BYTES, DEFAULT_MAX_REQUEST_BYTES,
};
use onceflow_broker::connection_limits::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_IP, DEFAULT_SASL_MAX_RECEIVE_BYTES,
};
use onceflow_broker::security::scram::{ScramCredential, ScramHash, MIN_ITERATIONS};
use onceflow_broker::security::users::MAX_STORED_ITERATIONS;
use onceflow_broker::security::{ClientAuth, ListenerConfig, SecurityProtocol, TlsConfig};
use onceflow_broker::storage::{FsyncPolicy, StorageConfig};
use onceflow_broker::BrokerConfig;

/// A single-node Kafka-wire-protocol broker with a durable log.
#[derive(Debug, Parser)]
#[command(
    name = "onceflow-broker",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address of a PLAINTEXT listener; port 0 picks a free port (printed on stdout).
    /// Default 127.0.0.1:9092 when no --listener is given.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A listener, `PROTOCOL://HOST:PORT` or `NAME=PROTOCOL://HOST:PORT` with PROTOCOL one
    /// of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL (repeatable; the first one is printed as
    /// `listening on`).
    #[arg(long = "listener", value_name = "[NAME=]PROTOCOL://HOST:PORT")]
    listeners: Vec<ListenerConfig>,
    /// PEM certificate chain of the SSL and SASL_SSL listeners.
    #[arg(long, requires = "ssl_key")]
    ssl_certificate: Option<PathBuf>,
    /// PEM private key of the SSL and SASL_SSL listeners.
    #[arg(long, requires = "ssl_certificate")]
    ssl_key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to; turns on client
    /// authentication (`--ssl-client-auth`, default required).
    #[arg(long)]
    ssl_client_ca: Option<PathBuf>,
    /// none, requested or required (default: required with --ssl-client-ca, else none).
    #[arg(long)]
    ssl_client_auth: Option<ClientAuth>,
    /// SASL users file (`USER:plain:PASSWORD` or `USER:scram-sha-256:salt=..,...` lines).
    #[arg(long)]
    sasl_users: Option<PathBuf>,
    /// Check requests against ACLs (implied by --acl-file and --super-user).
    #[arg(long)]
    authorizer: bool,
    /// ACL bindings to load at start (see broker/README.md, "Security").
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// A principal allowed everything, e.g. `User:admin` (repeatable).
    #[arg(long = "super-user", value_name = "PRINCIPAL")]
    super_users: Vec<String>,
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
    /// Do not create unknown topics named by Metadata (Produce never creates topics).
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
    /// Largest frame a SASL listener accepts before the client has authenticated (Kafka's
    /// sasl.server.max.receive.size).
    #[arg(long, default_value_t = DEFAULT_SASL_MAX_RECEIVE_BYTES, value_parser = clap::value_parser!(u32).range(10..).map(|v| v as usize))]
    sasl_max_receive_bytes: usize,
    /// Cap on the record bytes of one Fetch answer, whatever the client asks (Kafka's
    /// fetch.max.bytes, at least 1024).
    #[arg(long, default_value_t = DEFAULT_FETCH_MAX_BYTES, value_parser = clap::value_parser!(u32).range(1024..).map(|v| v as usize))]
    fetch_max_bytes: usize,
    /// Close connections with nothing in flight and no request received for this long
    /// (Kafka's connections.max.idle.ms; -1 never).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(i64).range(-1..))]
    connections_max_idle_ms: i64,
    /// Connections held at once over all listeners; more are closed at accept (Kafka's
    /// max.connections).
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    max_connections: usize,
    /// Connections held at once from one IP address; more are closed at accept (Kafka's
    /// max.connections.per.ip).
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS_PER_IP, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    max_connections_per_ip: usize,
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

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints a users-file line with SCRAM credentials for a password read from stdin (one
    /// line); the password itself is not printed.
    ScramCredential {
        /// The user name.
        #[arg(long)]
        user: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512.
        #[arg(long, default_value = "SCRAM-SHA-256")]
        mechanism: String,
        /// PBKDF2 iterations (4096 to 16384, Kafka's bounds).
        #[arg(long, default_value_t = MIN_ITERATIONS, value_parser = clap::value_parser!(u32).range(i64::from(MIN_ITERATIONS)..=i64::from(MAX_STORED_ITERATIONS)))]
        iterations: u32,
    },
}

fn scram_credential(user: &str, mechanism: &str, iterations: u32) -> std::process::ExitCode {
    let Some(hash) = ScramHash::from_mechanism(mechanism) else {
        eprintln!(
            "onceflow-broker: unknown mechanism {mechanism:?} (SCRAM-SHA-256 or SCRAM-SHA-512)"
        );
        return std::process::ExitCode::from(2);
    };
    if user.is_empty() || user.contains(':') {
        eprintln!("onceflow-broker: the user name must be non-empty and free of ':'");
        return std::process::ExitCode::from(2);
    }
    let mut password = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut password) {
        eprintln!("onceflow-broker: cannot read the password from stdin: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let password = password.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        eprintln!("onceflow-broker: empty password on stdin");
        return std::process::ExitCode::from(2);
    }
    let credential = ScramCredential::from_password(hash, password, iterations);
    println!(
        "{user}:{}:{}",
        hash.mechanism().to_ascii_lowercase(),
        credential.to_file_value()
    );
    std::process::ExitCode::SUCCESS
}

fn main() -> std::process::ExitCode {
    use std::io::IsTerminal;
    // before any thread starts: large fetch buffers stay in the heap and are reused
    let allocator_tuned = onceflow_broker::allocator::tune();
    // colour only on a terminal: a log file or a pipe gets plain text
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    tracing::debug!(allocator_tuned, "C allocator thresholds");
    let args = Args::parse();
    if let Some(Command::ScramCredential {
        user,
        mechanism,
        iterations,
    }) = &args.command
    {
        return scram_credential(user, mechanism, *iterations);
    }
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
    let mut listeners = args.listeners.clone();
    match (args.listen, listeners.is_empty()) {
        // --listen next to --listener adds a PLAINTEXT listener in front.
        (Some(addr), false) => listeners.insert(
            0,
            ListenerConfig::new(SecurityProtocol::Plaintext, addr).named("PLAINTEXT_LISTEN"),
        ),
        (None, true) => listeners.push(ListenerConfig::new(
            SecurityProtocol::Plaintext,
            SocketAddr::from(([127, 0, 0, 1], 9092)),
        )),
        (Some(addr), true) => {
            listeners.push(ListenerConfig::new(SecurityProtocol::Plaintext, addr))
        }
        (None, false) => {}
    }
    if let Some(advertised) = &args.advertised_listener {
        listeners[0].advertised = Some(advertised.clone());
    }
    let tls = match (&args.ssl_certificate, &args.ssl_key) {
        (Some(cert), Some(key)) => Some(TlsConfig {
            certificate_chain: cert.clone(),
            private_key: key.clone(),
            client_ca: args.ssl_client_ca.clone(),
            client_auth: args
                .ssl_client_auth
                .unwrap_or(if args.ssl_client_ca.is_some() {
                    ClientAuth::Required
                } else {
                    ClientAuth::None
                }),
        }),
        _ => None,
    };
    let config = BrokerConfig {
        listen: listeners[0].addr,
        advertised_listener: args.advertised_listener,
        listeners,
        security: SecurityConfig {
            tls,
            sasl_users_file: args.sasl_users,
            authorizer: args.authorizer,
            acl_file: args.acl_file,
            super_users: args.super_users,
        },
        storage,
        auto_create_topics: !args.no_auto_create_topics,
        default_partitions: args.default_partitions,
        max_request_bytes: args.max_request_bytes,
        fetch_max_bytes: args.fetch_max_bytes,
        connections: ConnectionLimits {
            max_connections: args.max_connections,
            max_connections_per_ip: args.max_connections_per_ip,
            // 0 is refused by the config check; -1 turns the timeout off.
            max_idle: u64::try_from(args.connections_max_idle_ms)
                .ok()
                .map(std::time::Duration::from_millis),
            sasl_max_receive_bytes: args.sasl_max_receive_bytes,
        },
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
        // With several listeners, one line each first; `listening on` (the first listener's
        // address) stays the line scripts wait for.
        let several = broker.listeners().count() > 1;
        for (listener, addr) in broker.listeners().filter(|_| several) {
            let _ = writeln!(
                stdout,
                "listener {} {} on {addr}",
                listener.name, listener.protocol
            );
        }
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
