//! `onceflow`: operate running and stopped jobs from the command line.
//!
//! - `onceflow status --url http://HOST:PORT`: a job's `/status` (its configuration, state,
//!   readiness, records and checkpoints), as text or `--json`.
//! - `onceflow transactions list --brokers B --prefix P`: the transactional ids of a job's
//!   prefix with their state, producer, age against the timeout and partitions, and whether a
//!   live instance holds the prefix.
//! - `onceflow transactions abort --brokers B --prefix P`: ends the open transactions of the
//!   prefix (a lost instance's, which hold back every read_committed reader of their
//!   partitions); refused while a live instance holds the prefix, unless `--force`, and for
//!   two-phase-commit transactions (which a restart of the job commits), unless
//!   `--discard-pre-committed`.
//!
//! Exit codes: 0 done, 2 refused or bad arguments, 4 failed.

use std::io::{Read, Write};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use onceflow::connectors::kafka::admin::{self, TransactionInfo};
use onceflow::connectors::kafka::security::ClientSecurity;
use onceflow::connectors::kafka::ClientProperties;

#[derive(Parser)]
#[command(
    name = "onceflow",
    about = "Operate onceflow jobs: status, transactions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A running job's status, from its listener's `/status`.
    Status {
        /// The job's `--metrics-listen` address, e.g. http://127.0.0.1:9898.
        #[arg(long, env = "ONCEFLOW_STATUS_URL")]
        url: String,
        /// Print the endpoint's JSON as it is.
        #[arg(long)]
        json: bool,
    },
    /// The transactions of a job's transactional id prefix.
    #[command(subcommand)]
    Transactions(Transactions),
}

#[derive(Subcommand)]
enum Transactions {
    /// List the prefix's transactional ids, their state and age.
    List {
        #[command(flatten)]
        cluster: Cluster,
        /// One JSON object per id.
        #[arg(long)]
        json: bool,
    },
    /// Abort the prefix's open transactions (refused while a live instance holds the prefix).
    Abort {
        #[command(flatten)]
        cluster: Cluster,
        /// Only these ids (repeatable; default: every open one of the prefix).
        #[arg(long = "transactional-id")]
        ids: Vec<String>,
        /// Abort even though a live instance holds the prefix (its transactions fail and it
        /// restarts from its last checkpoint).
        #[arg(long)]
        force: bool,
        /// Also abort two-phase-commit transactions. One may be pre-committed: its records
        /// belong to a complete checkpoint, which the job's restart commits; aborting it
        /// loses them. For a job that will not run again; otherwise restart the job instead.
        #[arg(long)]
        discard_pre_committed: bool,
    },
}

#[derive(Args)]
struct Cluster {
    /// HOST:PORT[,HOST:PORT...] of the cluster.
    #[arg(long, env = "ONCEFLOW_BROKERS")]
    brokers: String,
    /// The job's `--transactional-id-prefix`.
    #[arg(long, env = "ONCEFLOW_TRANSACTIONAL_ID_PREFIX")]
    prefix: String,
    /// librdkafka-style client properties (TLS, SASL), as the job's.
    #[arg(long, value_name = "PATH", env = "ONCEFLOW_KAFKA_PROPERTIES_FILE")]
    kafka_properties_file: Option<std::path::PathBuf>,
    /// A client property, `KEY=VALUE`; repeatable.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    kafka_properties: Vec<String>,
}

impl Cluster {
    fn properties(&self) -> Result<ClientProperties, String> {
        let mut p = ClientProperties::new();
        if let Some(f) = &self.kafka_properties_file {
            p.load_file(f).map_err(|e| e.to_string())?;
        }
        for a in &self.kafka_properties {
            p.set_assignment(a).map_err(|e| e.to_string())?;
        }
        Ok(p)
    }
}

/// A failure and its exit code.
struct Failure(i32, String);

fn main() {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Status { url, json } => status(&url, json),
        Command::Transactions(t) => transactions(t),
    };
    if let Err(Failure(code, msg)) = outcome {
        eprintln!("error: {msg}");
        std::process::exit(code);
    }
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure(4, e.to_string())
}

fn status(url: &str, json: bool) -> Result<(), Failure> {
    let body = http_get(url, "/status")?;
    if json {
        println!("{}", body.trim_end());
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| failed(format!("{url}/status is not JSON: {e}")))?;
    let job = &v["job"];
    println!(
        "job {} ({}), instance {}",
        job["name"].as_str().unwrap_or("?"),
        job["mode"].as_str().unwrap_or("?"),
        job["instance"].as_str().unwrap_or("-")
    );
    println!(
        "input {} -> output {}, group {}, prefix {}",
        job["input"], job["output"], job["group"], job["transactional_id_prefix"]
    );
    println!("state: {}", v["state"].as_str().unwrap_or("?"));
    println!("{}", v["readiness"].as_str().unwrap_or("?"));
    println!("records processed: {}", v["records_processed"]);
    let c = &v["checkpoints"];
    let last = match c["last"]["id"].as_u64() {
        Some(id) => format!(
            "last {id}, {:.1} s ago",
            c["last"]["age_seconds"].as_f64().unwrap_or(0.0)
        ),
        None => "none yet".to_string(),
    };
    println!(
        "checkpoints: {} completed, {} failed ({} in a row), {last}",
        c["completed"], c["failed"], c["failed_in_a_row"]
    );
    Ok(())
}

/// GET `path` on `url` (`http://HOST:PORT`): the body of a 200 answer.
fn http_get(url: &str, path: &str) -> Result<String, Failure> {
    let addr = url
        .strip_prefix("http://")
        .map(|a| a.trim_end_matches('/'))
        .ok_or_else(|| {
            Failure(
                2,
                format!("`{url}`: give the job's listener as http://HOST:PORT"),
            )
        })?;
    let mut s = std::net::TcpStream::connect(addr)
        .map_err(|e| failed(format!("cannot reach the job at {addr}: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(failed)?;
    let mut out = Vec::new();
    s.take(16 << 20).read_to_end(&mut out).map_err(failed)?;
    let out = String::from_utf8_lossy(&out);
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| failed(format!("{addr} did not answer HTTP")))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(failed(format!(
            "{addr}{path} answered {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

fn transactions(t: Transactions) -> Result<(), Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failed)?;
    match t {
        Transactions::List { cluster, json } => {
            let props = cluster.properties().map_err(|e| Failure(2, e))?;
            let security =
                ClientSecurity::from_properties(&props, "onceflow transactions").map_err(failed)?;
            let list = rt
                .block_on(admin::list_transactions(
                    &cluster.brokers,
                    &security,
                    &cluster.prefix,
                ))
                .map_err(failed)?;
            let live =
                admin::live_instances(&cluster.brokers, &props, &cluster.prefix).map_err(failed)?;
            if json {
                for t in &list {
                    println!("{}", serde_json::to_string(t).map_err(failed)?);
                }
                return Ok(());
            }
            print_list(&cluster.prefix, &list, &live);
            Ok(())
        }
        Transactions::Abort {
            cluster,
            ids,
            force,
            discard_pre_committed,
        } => {
            let props = cluster.properties().map_err(|e| Failure(2, e))?;
            let security =
                ClientSecurity::from_properties(&props, "onceflow transactions").map_err(failed)?;
            let live =
                admin::live_instances(&cluster.brokers, &props, &cluster.prefix).map_err(failed)?;
            if !live.is_empty() && !force {
                return Err(Failure(
                    2,
                    format!(
                        "a live instance holds prefix `{}` ({}): its transactions are its own, and aborting them fails its checkpoint; stop the job first, or pass --force",
                        cluster.prefix,
                        live.join(", ")
                    ),
                ));
            }
            let list = rt
                .block_on(admin::list_transactions(
                    &cluster.brokers,
                    &security,
                    &cluster.prefix,
                ))
                .map_err(failed)?;
            let chosen: Vec<&TransactionInfo> = list
                .iter()
                .filter(|t| t.is_open())
                .filter(|t| ids.is_empty() || ids.contains(&t.transactional_id))
                .collect();
            let ring: Vec<&str> = chosen
                .iter()
                .filter(|t| t.is_two_phase_commit(&cluster.prefix))
                .map(|t| t.transactional_id.as_str())
                .collect();
            if !ring.is_empty() && !discard_pre_committed {
                return Err(Failure(
                    2,
                    format!(
                        "{} are two-phase-commit transactions: one may be pre-committed, its records part of a complete checkpoint that the job's restart commits, and aborting it loses them. Restart the job to end them (its recovery commits what its last checkpoint names and aborts the rest), or pass --discard-pre-committed for a job that will not run again",
                        ring.join(", ")
                    ),
                ));
            }
            for missing in ids
                .iter()
                .filter(|id| !chosen.iter().any(|t| &t.transactional_id == *id))
            {
                eprintln!(
                    "{missing}: no open transaction of prefix `{}`",
                    cluster.prefix
                );
            }
            for t in &chosen {
                rt.block_on(admin::abort_transaction(
                    &cluster.brokers,
                    &security,
                    t,
                    Duration::from_secs(60),
                ))
                .map_err(failed)?;
                println!(
                    "aborted {} ({} open for {} ms over {})",
                    t.transactional_id,
                    t.state,
                    t.open_for_ms.unwrap_or(0),
                    t.partitions.join(",")
                );
            }
            println!("{} open transactions aborted", chosen.len());
            Ok(())
        }
    }
}

fn print_list(prefix: &str, list: &[TransactionInfo], live: &[String]) {
    if live.is_empty() {
        println!("prefix {prefix}: no live instance holds it");
    } else {
        println!("prefix {prefix}: held by {}", live.join(", "));
    }
    println!(
        "{:<40} {:<16} {:>12} {:>6} {:>12} {:>10}  PARTITIONS",
        "TRANSACTIONAL ID", "STATE", "PRODUCER ID", "EPOCH", "OPEN FOR MS", "TIMEOUT MS"
    );
    for t in list {
        println!(
            "{:<40} {:<16} {:>12} {:>6} {:>12} {:>10}  {}",
            t.transactional_id,
            t.state,
            t.producer_id,
            t.producer_epoch,
            t.open_for_ms.map_or("-".to_string(), |ms| ms.to_string()),
            t.timeout_ms,
            t.partitions.join(",")
        );
    }
    let open = list.iter().filter(|t| t.is_open()).count();
    println!("{} ids, {open} with an open transaction", list.len());
}
