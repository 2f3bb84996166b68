//! The Kafka job builder: the library owns the whole start sequence of a Kafka -> Kafka job,
//! so a job binary holds business logic only.
//!
//! ```ignore
//! use onceflow::prelude::*;
//!
//! fn main() {
//!     KafkaJob::from_command_line("totals").main(|input, out| {
//!         let records = input.map(|m: KafkaMessage| SinkRecord::new(m.key, m.payload.unwrap_or_default()));
//!         out.sink("kafka-out", &records);
//!     })
//! }
//! ```
//!
//! [`KafkaJob::run`] does, in this order: flag validation (the transaction timeout against the
//! checkpoint interval, the recovery allowance and the broker's maximum), the metrics
//! endpoint, the embedded broker when no `--brokers` is given, the instance lock on the
//! checkpoint directory, the permission check (every permission the job needs, reported in
//! one message), the prefix claim, the fencing of older instances, the wait for an
//! older instance on the same directory, the choice of the checkpoint to restore (the group's
//! committed offsets in the exactly-once modes), and the wiring of the source and the sinks
//! with one checkpoint interval. Two-phase commit is always sealed (`CheckpointSeal`), so
//! taking over a running instance is exactly-once in both exactly-once modes.
//!
//! Stdout carries one line per event, a contract tests read: `job started` (every sink
//! recovered, records flow), `checkpoint N complete`, `checkpoint N committed` (every sink
//! committed N), `restoring checkpoint N (named by group G)`, and at the end `job stopped:`
//! with a summary. SIGTERM and Ctrl-C stop with a final checkpoint (a second Ctrl-C exits at
//! once). [`KafkaJob::main`] maps failures to [`exit_code`]s.

mod args;
mod embedded;
mod exit;
mod failpoint;
mod health;
mod http;
mod instance;
mod logs;
mod outputs;
mod permissions;
mod reach;
mod scaled;
mod startup;
mod watcher;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onceflow_runtime::{
    CheckpointId, DataStream, RestoreMode, SourceWatermarks, StreamEnvironment, WatermarkStrategy,
};

pub use args::KafkaJobArgs;
pub use exit::{exit_code, init_logs, init_tracing};
pub use logs::LogFormat;
pub use outputs::KafkaOutputs;
pub use scaled::{DATAFLOWS, REBALANCE_PAUSE_SECONDS};

use crate::kafka::{Decoder, KafkaError, KafkaMessage, KafkaSource, Result};
use embedded::Embedded;
use outputs::{Progress, Sealing};
use watcher::spawn_watcher;

/// Prints a line on stdout and flushes it (a job's stdout is a contract tests read).
pub(crate) fn say(line: String) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Where a job runs, as handed to a demo hook (see [`KafkaJob::demo`]).
#[derive(Debug, Clone)]
pub struct JobPlacement {
    /// Bootstrap servers.
    pub brokers: String,
    /// Input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Checkpoint directory.
    pub checkpoint_dir: PathBuf,
}

/// What a finished run reports (also printed as the `job stopped:` line).
#[derive(Debug, Clone, Default)]
pub struct JobSummary {
    /// Records this run read from the input (every one is in the committed output).
    pub processed: u64,
    /// Checkpoints this run completed, the final one included.
    pub completed_checkpoints: u64,
    /// The last complete checkpoint.
    pub last_checkpoint: Option<CheckpointId>,
    /// The checkpoint this run restored from.
    pub restored_from: Option<CheckpointId>,
}

impl std::fmt::Display for JobSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |c: Option<CheckpointId>| c.map_or("none".to_string(), |c| c.to_string());
        write!(
            f,
            "{} records processed, {} checkpoints completed, last checkpoint {}, restored from {}",
            self.processed,
            self.completed_checkpoints,
            opt(self.last_checkpoint),
            opt(self.restored_from)
        )
    }
}

type DemoHook = Box<dyn FnOnce(&JobPlacement) -> Box<dyn FnOnce()>>;

/// A Kafka -> Kafka job: a name, the standard flags, the input's decoder and the pipeline.
pub struct KafkaJob<T = KafkaMessage> {
    name: String,
    args: KafkaJobArgs,
    decoder: Decoder<T>,
    watermarks: Option<WatermarkStrategy<T>>,
    demo: Option<DemoHook>,
}

impl KafkaJob<KafkaMessage> {
    /// A job called `name` (it names the checkpoint directory and the default topics, group
    /// and prefix) with parsed flags; the input arrives as raw [`KafkaMessage`]s.
    pub fn new(name: impl Into<String>, args: KafkaJobArgs) -> Self {
        KafkaJob {
            name: name.into(),
            args,
            decoder: Decoder::raw(),
            watermarks: None,
            demo: None,
        }
    }

    /// [`KafkaJob::new`] with the flags of this process's command line (clap's `--help`
    /// included; bad flags exit with code 2).
    pub fn from_command_line(name: impl Into<String>) -> Self {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            kafka: KafkaJobArgs,
        }
        Self::new(name, <Cli as clap::Parser>::parse().kafka)
    }
}

impl<T: onceflow_runtime::Data> KafkaJob<T> {
    /// Decodes the input with `decoder` instead (e.g. [`Decoder::json`]).
    pub fn decoder<U>(self, decoder: Decoder<U>) -> KafkaJob<U> {
        KafkaJob {
            name: self.name,
            args: self.args,
            decoder,
            watermarks: None,
            demo: self.demo,
        }
    }

    /// Generates watermarks at the source (per partition with `with_splits`).
    pub fn watermarks(mut self, strategy: WatermarkStrategy<T>) -> Self {
        self.watermarks = Some(strategy);
        self
    }

    /// With the embedded broker only: `start` runs once the broker and the topics exist and
    /// before the job starts (e.g. a demo input generator); the closure it returns runs after
    /// the job stopped, before the broker shuts down (e.g. print what a reader saw).
    pub fn demo<F, G>(mut self, start: F) -> Self
    where
        F: FnOnce(&JobPlacement) -> G + 'static,
        G: FnOnce() + 'static,
    {
        self.demo = Some(Box::new(move |p| Box::new(start(p))));
        self
    }

    /// The parsed flags.
    pub fn args(&self) -> &KafkaJobArgs {
        &self.args
    }

    /// Runs the job (see the module docs), then exits the process with the code of the
    /// outcome ([`exit_code`]); errors are printed as `error: ...` on stderr. Sets up
    /// tracing from `RUST_LOG` first, in the `--log-format`.
    pub fn main(self, pipeline: impl Fn(DataStream<T>, &mut KafkaOutputs)) -> ! {
        init_logs(
            self.args.log_format,
            &self.name,
            self.args.instance_id.clone(),
        );
        let code = match self.run(pipeline) {
            Ok(_) => exit_code::OK,
            Err(e) => {
                eprintln!("error: {e}");
                e.exit_code()
            }
        };
        std::process::exit(code)
    }

    /// Runs the job until it is stopped (SIGTERM, Ctrl-C, `--max-records`,
    /// `--exit-when-idle-ms`) or fails. `pipeline` turns the input stream into records for
    /// one or more sinks of [`KafkaOutputs`]. With `--instance-id` the process is one
    /// instance of a scaled-out job (`docs/SCALE-OUT.md`): `pipeline` then builds a new
    /// dataflow at every change of the instance's assignment.
    pub fn run(self, pipeline: impl Fn(DataStream<T>, &mut KafkaOutputs)) -> Result<JobSummary> {
        let s = self.args.settings(&self.name)?;
        let helper = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| KafkaError::Protocol(format!("cannot start a tokio runtime: {e}")))?;
        let bound = self.args.ready_checkpoint_age_ms.map_or_else(
            || health::default_bound(s.interval, s.checkpoint_timeout),
            Duration::from_millis,
        );
        let health = Arc::new(health::Health::new(bound));
        health.set_identity(serde_json::json!({
            "name": self.name,
            "mode": args::mode_name(s.mode),
            "instance": s.instance_id,
            "brokers": self.args.brokers.as_deref().unwrap_or("embedded"),
            "input": s.input,
            "output": s.output,
            "group": s.group,
            "transactional_id_prefix": s.prefix,
            "parallelism": s.parallelism,
            "checkpoint_interval_ms": s.interval.as_millis() as u64,
            "checkpoint_timeout_ms": s.checkpoint_timeout.as_millis() as u64,
            "transaction_timeout_ms": s.timeout.as_millis() as u64,
        }));
        if let Some(addr) = self.args.metrics_listen {
            let metrics = crate::kafka::metrics::install_recorder()?;
            let endpoints = http::Endpoints {
                metrics,
                health: health.clone(),
            };
            let bound_addr = http::serve(&helper, addr, endpoints)?;
            tracing::info!(address = %bound_addr, "serving /metrics, /healthz and /readyz");
        }
        if let Some(brokers) = &self.args.brokers {
            helper.block_on(reach::check(
                brokers,
                &s.properties,
                Duration::from_millis(self.args.connect_timeout_ms),
            ))?;
        }

        if let (Some(instance), Some(brokers)) = (&s.instance_id, &self.args.brokers) {
            let dir = self.args.runtime.checkpoint_dir.clone().unwrap_or_else(|| {
                PathBuf::from("./onceflow-checkpoints").join(format!("{}-{instance}", self.name))
            });
            let brokers = brokers.clone();
            let outcome = self.run_instance(&s, &brokers, &dir, &helper, &health, pipeline);
            if let Ok(summary) = &outcome {
                tracing::info!(%summary, "instance finished");
                say(format!("job stopped: {summary}"));
            }
            return outcome;
        }

        // where: the given cluster, or the bundled broker in this process
        let (brokers, embedded, checkpoint_dir) = match &self.args.brokers {
            Some(b) => {
                let dir =
                    self.args.runtime.checkpoint_dir.clone().unwrap_or_else(|| {
                        PathBuf::from("./onceflow-checkpoints").join(&self.name)
                    });
                (b.clone(), None, dir)
            }
            None => {
                let (e, brokers) = Embedded::start(&helper, &[&s.input, &s.output])?;
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                let dir = self.args.runtime.checkpoint_dir.clone().unwrap_or_else(|| {
                    std::env::temp_dir().join(format!(
                        "onceflow-{}-{}-{stamp}",
                        self.name,
                        std::process::id()
                    ))
                });
                say(format!(
                    "embedded broker at {brokers} (no --brokers given); input {}, output {}; checkpoints in {}",
                    s.input,
                    s.output,
                    dir.display()
                ));
                (brokers, Some(e), dir)
            }
        };
        let placement = JobPlacement {
            brokers: brokers.clone(),
            input: s.input.clone(),
            output: s.output.clone(),
            checkpoint_dir: checkpoint_dir.clone(),
        };
        let demo_end = match (&embedded, self.demo) {
            (Some(_), Some(start)) => Some(start(&placement)),
            _ => None,
        };

        let sink_cfg = s.sink_config(&brokers);
        if !s.properties.is_empty() {
            tracing::info!(properties = %s.properties.describe(), "Kafka client properties");
        }
        let restore_flag = self.args.runtime.restore.unwrap_or(RestoreMode::Latest);
        let started = startup::start(
            &s,
            &brokers,
            &checkpoint_dir,
            &helper,
            &sink_cfg,
            restore_flag,
        )?;

        let mut config = s
            .job_config(&self.args.runtime, &self.name)
            .checkpoint_dir(&checkpoint_dir)
            .restore(started.restore)
            .checkpoint_listener(health::checkpoint_listener(&health));
        if let Some(seal) = &started.seal {
            config = config.completion_hook(Arc::new(Sealing(seal.clone())));
        }
        let env = StreamEnvironment::new(config);
        let stop = env.stop_handle();
        let progress = Arc::new(Progress::with_health(health.clone()));

        let counter = progress.clone();
        let inner = self.decoder;
        let decoder = Decoder::from_owned(move |m| {
            // counted as it leaves the source: before the barrier of the checkpoint holding it
            counter.processed.fetch_add(1, Ordering::Relaxed);
            inner.decode_owned(m)
        });
        let mut source = KafkaSource::new(brokers.clone(), s.input.clone(), decoder)
            .group(s.group.clone())
            .client_properties(s.properties.clone());
        if let Some(link) = &started.link {
            source = source.offsets_link(link.clone());
        }
        let input = match self.watermarks {
            Some(w) => env.source("kafka-in", source.with_watermarks(w)),
            None => env.source("kafka-in", source),
        };
        let mut outputs = KafkaOutputs::new(
            sink_cfg,
            started.link.clone(),
            started.seal.clone(),
            s.clone(),
            progress.clone(),
            stop.clone(),
        );
        pipeline(input, &mut outputs);
        outputs.check(&self.name)?;

        let watcher_done = Arc::new(AtomicBool::new(false));
        spawn_watcher(
            progress.clone(),
            stop,
            watcher_done.clone(),
            self.args.max_records,
            self.args.exit_when_idle_ms.map(Duration::from_millis),
            embedded.is_some(),
        );
        let result = env.execute_blocking();
        health.stopped("stopped");
        watcher_done.store(true, Ordering::Relaxed);
        if let Some(end) = demo_end {
            end();
        }
        let outcome = result
            .map_err(KafkaError::from)
            .map(|r| summary(&progress, &r));
        if let Ok(summary) = &outcome {
            tracing::info!(%summary, "job finished");
            say(format!("job stopped: {summary}"));
        }
        // the prefix claim and the seal's clients leave before the embedded broker stops, so
        // none of them reports the broker gone
        drop(started);
        if let Some(e) = embedded {
            e.shutdown(&helper);
        }
        outcome
    }
}

fn summary(progress: &Progress, result: &onceflow_runtime::JobResult) -> JobSummary {
    JobSummary {
        processed: progress.processed.load(Ordering::Relaxed),
        completed_checkpoints: result.completed_checkpoints,
        last_checkpoint: result.last_checkpoint,
        restored_from: result.restored_from,
    }
}
