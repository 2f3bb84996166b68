//! The standard command line of a Kafka job: the runtime's flags ([`JobArgs`]) and the Kafka
//! flags in one clap struct that a job flattens into its own parser.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use onceflow_runtime::JobArgs;

use crate::kafka::{check_mode_security, ClientProperties, DeliveryMode, KafkaError, Result};

/// Flags every Kafka job binary understands (`#[command(flatten)] kafka: KafkaJobArgs`).
///
/// Topic, group and prefix defaults derive from the job's name `N`: input `N-input`, output
/// `N-output`, group and transactional id prefix `onceflow-N`.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaJobArgs {
    /// HOST:PORT of the cluster; without it the job starts the bundled broker in-process
    /// (when built with the `embedded-broker` feature).
    #[arg(long, value_parser = super::reach::parse_brokers, env = "ONCEFLOW_BROKERS")]
    pub brokers: Option<String>,
    /// How long the start-up connection check tries the bootstrap servers before the job
    /// stops with exit code 6 (cluster unreachable), naming each address and the cause.
    #[arg(long, default_value_t = 30_000, env = "ONCEFLOW_CONNECT_TIMEOUT_MS")]
    pub connect_timeout_ms: u64,
    /// Input topic (default `<job>-input`).
    #[arg(long, env = "ONCEFLOW_INPUT")]
    pub input: Option<String>,
    /// Output topic (default `<job>-output`; dead letters go to `<output>.dlq`).
    #[arg(long, env = "ONCEFLOW_OUTPUT")]
    pub output: Option<String>,
    /// Consumer group (default `onceflow-<job>`).
    #[arg(long, env = "ONCEFLOW_GROUP")]
    pub group: Option<String>,
    /// Delivery mode: two-phase-commit | transactional-offsets | at-least-once | none.
    #[arg(long, default_value = "two-phase-commit", value_parser = parse_mode, env = "ONCEFLOW_MODE")]
    pub mode: DeliveryMode,
    /// Prefix of the transactional ids, unique per job (default `onceflow-<job>`).
    #[arg(long, env = "ONCEFLOW_TRANSACTIONAL_ID_PREFIX")]
    pub transactional_id_prefix: Option<String>,
    /// transaction.timeout.ms; must exceed checkpoint interval + recovery allowance and not
    /// exceed the broker's transaction.max.timeout.ms.
    #[arg(
        long,
        default_value_t = 60_000,
        env = "ONCEFLOW_TRANSACTION_TIMEOUT_MS"
    )]
    pub transaction_timeout_ms: u64,
    /// Time a restart may take before the recovery commit.
    #[arg(long, default_value_t = 30_000, env = "ONCEFLOW_RECOVERY_ALLOWANCE_MS")]
    pub recovery_allowance_ms: u64,
    /// A librdkafka property for every Kafka client of the job (consumer, producers, admin),
    /// e.g. `security.protocol=SASL_SSL`; repeatable; applied last. From the environment:
    /// `ONCEFLOW_KAFKA_PROPERTY_<NAME>` sets property <name> (lower case, `_` for `.`), e.g.
    /// `ONCEFLOW_KAFKA_PROPERTY_SASL_PASSWORD`, after the properties file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,
    /// A file of librdkafka properties (`KEY=VALUE` lines, `#` comments) for every Kafka
    /// client of the job; keeps secrets off the command line.
    #[arg(long, value_name = "PATH", env = "ONCEFLOW_KAFKA_PROPERTIES_FILE")]
    pub kafka_properties_file: Option<PathBuf>,
    /// Run as one instance of a scaled-out job (`docs/SCALE-OUT.md`): this instance's stable
    /// name among the instances sharing `--group` and `--transactional-id-prefix`
    /// (letters, digits, `.`, `_`, `-`). Needs `--mode transactional-offsets` and `--brokers`.
    #[arg(long, value_name = "NAME", env = "ONCEFLOW_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Scaled-out mode: the input is already partitioned by the key of `KafkaOutputs::key_by`
    /// (Kafka's default partitioner on the key's bytes), so keyed records need no
    /// repartition topic.
    #[arg(long, env = "ONCEFLOW_INPUT_PARTITIONED_BY_KEY")]
    pub input_partitioned_by_key: bool,
    /// Scaled-out mode: an instance silent for this long loses its partitions to the others.
    #[arg(long, default_value_t = 10_000, env = "ONCEFLOW_SESSION_TIMEOUT_MS")]
    pub session_timeout_ms: u64,
    /// Scaled-out mode: how often an instance deletes the records of the job's repartition
    /// topics below the group's committed offsets (DeleteRecords); 0 never does.
    #[arg(
        long,
        default_value_t = 30_000,
        env = "ONCEFLOW_REPARTITION_PURGE_INTERVAL_MS"
    )]
    pub repartition_purge_interval_ms: u64,
    /// Replicas of the topics the job creates for itself (the prefix registry; scaled out,
    /// the repartition and changelog topics); -1 lets the cluster choose
    /// (`default.replication.factor`).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_parser = parse_replication, env = "ONCEFLOW_INTERNAL_REPLICATION_FACTOR")]
    pub internal_replication_factor: i32,
    /// Serve `/metrics` (Prometheus), `/healthz` and `/readyz` on this address, e.g.
    /// 127.0.0.1:9898.
    #[arg(long, env = "ONCEFLOW_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// `/readyz` answers 503 once the last completed checkpoint is older than this (default:
    /// twice the checkpoint interval plus the checkpoint timeout).
    #[arg(long, value_name = "MS", env = "ONCEFLOW_READY_CHECKPOINT_AGE_MS")]
    pub ready_checkpoint_age_ms: Option<u64>,
    /// Log lines on stderr: `text`, or `json` (one object per line with `job`, `instance`
    /// and the event's fields, e.g. `checkpoint`); filtered by `RUST_LOG`.
    #[arg(long, value_enum, default_value_t = super::LogFormat::Text, env = "ONCEFLOW_LOG_FORMAT")]
    pub log_format: super::LogFormat,
    /// Stop (final checkpoint + commit, exit 0) once this many records were processed.
    #[arg(long, env = "ONCEFLOW_MAX_RECORDS")]
    pub max_records: Option<u64>,
    /// Stop like SIGTERM once no input arrived for this many ms (counted from `job started`).
    #[arg(long, env = "ONCEFLOW_EXIT_WHEN_IDLE_MS")]
    pub exit_when_idle_ms: Option<u64>,
    /// The runtime's flags: parallelism, checkpoint directory and interval, retention,
    /// restore (`--restore` applies to at-least-once and none: the exactly-once modes restore
    /// the checkpoint the group's committed offsets name).
    #[command(flatten)]
    pub runtime: JobArgs,
}

fn parse_replication(s: &str) -> std::result::Result<i32, String> {
    match s.parse::<i32>() {
        Ok(n) if n == -1 || (1..=i32::from(i16::MAX)).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}`: a replication factor is -1 (the cluster's default) or a positive number"
        )),
    }
}

fn parse_mode(s: &str) -> std::result::Result<DeliveryMode, String> {
    s.parse().map_err(|e: KafkaError| e.to_string())
}

/// The checked settings of one run, derived from [`KafkaJobArgs`] and the job's name.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub mode: DeliveryMode,
    pub input: String,
    pub output: String,
    pub group: String,
    pub prefix: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub allowance: Duration,
    /// The runtime's checkpoint timeout (see [`checkpoint_limits`]).
    pub checkpoint_timeout: Duration,
    /// The runtime's tolerable failed checkpoints in a row (see [`checkpoint_limits`]).
    pub tolerable_failed_checkpoints: Option<u32>,
    pub parallelism: usize,
    pub properties: ClientProperties,
    /// Scaled-out mode: this instance's name.
    pub instance_id: Option<String>,
    pub session_timeout: Duration,
    pub input_partitioned_by_key: bool,
    /// Replicas of the job's internal topics (-1: the cluster's default).
    pub internal_replication: i32,
    /// Scaled-out mode: the repartition purge interval (`None`: never).
    pub repartition_purge_interval: Option<Duration>,
}

impl KafkaJobArgs {
    /// Checks the flags that need no broker (the transaction timeout against the checkpoint
    /// interval and the recovery allowance included) and fills in the defaults for `job`.
    pub(crate) fn settings(&self, job: &str) -> Result<Settings> {
        let rt = &self.runtime;
        if rt.parallelism == 0 {
            return Err(KafkaError::Config(
                "--parallelism must be at least 1".into(),
            ));
        }
        if rt.checkpoint_interval_ms == 0 {
            return Err(KafkaError::Config(
                "--checkpoint-interval-ms must be positive: a Kafka job commits its output at checkpoints".into(),
            ));
        }
        if self.mode.is_transactional() && rt.restore_older_repeating_output {
            return Err(KafkaError::Config(format!(
                "--restore-older-repeating-output does not apply to --mode {}: the group's committed offsets name the checkpoint to restore, and it is never replaced by an older one",
                mode_name(self.mode)
            )));
        }
        if self.mode.is_transactional() && rt.restore.is_some() {
            return Err(KafkaError::Config(format!(
                "--restore does not apply to --mode {}: the group's committed offsets name the checkpoint to restore (start over with a new --group and a new output topic instead)",
                mode_name(self.mode)
            )));
        }
        let timeout = Duration::from_millis(self.transaction_timeout_ms);
        let interval = Duration::from_millis(rt.checkpoint_interval_ms);
        let allowance = Duration::from_millis(self.recovery_allowance_ms);
        let (checkpoint_timeout, tolerable_failed_checkpoints) = checkpoint_limits(
            self.mode,
            timeout,
            interval,
            allowance,
            rt.checkpoint_timeout_ms.map(Duration::from_millis),
            rt.tolerable_failed_checkpoints,
        )?;
        let mut properties = ClientProperties::new();
        if let Some(file) = &self.kafka_properties_file {
            properties.load_file(file)?;
        }
        for (key, value) in env_properties(std::env::vars()) {
            properties.set(&key, &value)?;
        }
        for assignment in &self.kafka_properties {
            properties.set_assignment(assignment)?;
        }
        check_mode_security(self.mode, &properties)?;
        if let Some(id) = &self.instance_id {
            check_instance_id(id, self.mode, self.brokers.is_some())?;
        }
        if self.brokers.is_none() && !properties.is_plaintext() {
            return Err(KafkaError::Config(format!(
                "security.protocol={} needs --brokers: the embedded broker listens on PLAINTEXT only",
                properties.security_protocol()
            )));
        }
        let s = Settings {
            mode: self.mode,
            input: self.input.clone().unwrap_or_else(|| format!("{job}-input")),
            output: self
                .output
                .clone()
                .unwrap_or_else(|| format!("{job}-output")),
            group: self
                .group
                .clone()
                .unwrap_or_else(|| format!("onceflow-{job}")),
            prefix: self
                .transactional_id_prefix
                .clone()
                .unwrap_or_else(|| format!("onceflow-{job}")),
            interval,
            timeout,
            allowance,
            checkpoint_timeout,
            tolerable_failed_checkpoints,
            parallelism: rt.parallelism,
            properties,
            instance_id: self.instance_id.clone(),
            session_timeout: Duration::from_millis(self.session_timeout_ms),
            input_partitioned_by_key: self.input_partitioned_by_key,
            internal_replication: self.internal_replication_factor,
            repartition_purge_interval: (self.repartition_purge_interval_ms > 0)
                .then(|| Duration::from_millis(self.repartition_purge_interval_ms)),
        };
        Ok(s)
    }
}

/// The prefix of environment variables that set a Kafka client property.
pub(crate) const ENV_PROPERTY_PREFIX: &str = "ONCEFLOW_KAFKA_PROPERTY_";

/// The Kafka client properties the environment sets: `ONCEFLOW_KAFKA_PROPERTY_SASL_PASSWORD=x`
/// is `sasl.password=x` (librdkafka's property names are lower case with `.`), in name order.
pub(crate) fn env_properties(
    vars: impl Iterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut props: Vec<(String, String)> = vars
        .filter_map(|(name, value)| {
            let key = name.strip_prefix(ENV_PROPERTY_PREFIX)?;
            (!key.is_empty()).then(|| (key.to_ascii_lowercase().replace('_', "."), value))
        })
        .collect();
    props.sort();
    props
}

/// The runtime's checkpoint timeout and tolerable failed checkpoints for a job in `mode`.
///
/// In the exactly-once modes a transaction sealed at checkpoint n stays open until a later
/// checkpoint completes: with f failures in a row tolerated, that is up to
/// (f + 1) x (interval + checkpoint timeout) after it opened, and a crash then adds the
/// recovery allowance before the restart commits it. The broker must not abort it before:
/// `transaction timeout >= (f + 1) x (interval + checkpoint timeout) + allowance`. So f
/// defaults to 0 there (Flink's `tolerable-failed-checkpoints` default), and the checkpoint
/// timeout to what the rule leaves, at most the runtime's 60 s. Explicit values are checked
/// against the rule. The other modes keep the runtime's defaults (60 s, any number).
pub(crate) fn checkpoint_limits(
    mode: DeliveryMode,
    timeout: Duration,
    interval: Duration,
    allowance: Duration,
    checkpoint_timeout: Option<Duration>,
    tolerable: Option<u32>,
) -> Result<(Duration, Option<u32>)> {
    const RUNTIME_DEFAULT: Duration = Duration::from_secs(60);
    if checkpoint_timeout == Some(Duration::ZERO) {
        return Err(KafkaError::Config(
            "--checkpoint-timeout-ms must be positive".into(),
        ));
    }
    if !mode.is_transactional() {
        return Ok((checkpoint_timeout.unwrap_or(RUNTIME_DEFAULT), tolerable));
    }
    // the rule without checkpoint time first: its message names the plain mistake
    crate::kafka::validate_transaction_timeout(timeout, interval, allowance, None)?;
    let f = tolerable.unwrap_or(0);
    let rounds = f + 1;
    let checkpoint_timeout = match checkpoint_timeout {
        Some(t) => t,
        None => {
            let per_round = timeout.saturating_sub(allowance) / rounds;
            per_round.saturating_sub(interval).min(RUNTIME_DEFAULT)
        }
    };
    let needed = (interval + checkpoint_timeout) * rounds + allowance;
    if checkpoint_timeout.is_zero() || timeout < needed {
        return Err(KafkaError::Config(format!(
            "transaction timeout {} ms must be at least (tolerable failed checkpoints {f} + 1) x (checkpoint interval {} ms + checkpoint timeout {} ms) + recovery allowance {} ms = {} ms: \
             a pre-committed transaction stays open until a later checkpoint completes, and the broker would abort it first. \
             Raise --transaction-timeout-ms, or lower --checkpoint-timeout-ms, --tolerable-failed-checkpoints, the interval or the allowance",
            timeout.as_millis(),
            interval.as_millis(),
            checkpoint_timeout.as_millis(),
            allowance.as_millis(),
            needed.as_millis(),
        )));
    }
    Ok((checkpoint_timeout, Some(f)))
}

impl Settings {
    /// The runtime configuration of job `name` from its runtime flags: theirs, with the
    /// checkpoint limits of [`checkpoint_limits`].
    pub(crate) fn job_config(&self, runtime: &JobArgs, name: &str) -> onceflow_runtime::JobConfig {
        runtime
            .to_config(name)
            .checkpoint_timeout(self.checkpoint_timeout)
            .tolerable_failed_checkpoints(self.tolerable_failed_checkpoints)
    }

    /// The sinks' configuration: output topic, mode, prefix, timeouts and client properties.
    pub(crate) fn sink_config(&self, brokers: &str) -> crate::kafka::KafkaSinkConfig {
        crate::kafka::KafkaSinkConfig::new(brokers.to_string(), self.output.clone())
            .mode(self.mode)
            .transactional_id_prefix(self.prefix.clone())
            .transaction_timeout(self.timeout)
            .checkpoint_interval(self.interval)
            .recovery_allowance(self.allowance)
            .client_properties(self.properties.clone())
    }
}

/// `--instance-id`: a name usable in a transactional id, for a transactional-offsets job on
/// a cluster (instances of one job must share one).
fn check_instance_id(id: &str, mode: DeliveryMode, has_brokers: bool) -> Result<()> {
    if id.is_empty()
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(KafkaError::Config(format!(
            "--instance-id `{id}`: use letters, digits, `.`, `_` and `-` only"
        )));
    }
    if mode != DeliveryMode::TransactionalOffsets {
        return Err(KafkaError::Config(format!(
            "--instance-id runs one instance of a scaled-out job, which needs --mode transactional-offsets (this is --mode {}; two-phase commit scales up with --parallelism in one process)",
            mode_name(mode)
        )));
    }
    if !has_brokers {
        return Err(KafkaError::Config(
            "--instance-id needs --brokers: the instances of a scaled-out job share one cluster"
                .into(),
        ));
    }
    Ok(())
}

/// The flag value of a mode.
pub(crate) fn mode_name(mode: DeliveryMode) -> &'static str {
    match mode {
        DeliveryMode::TwoPhaseCommit => "two-phase-commit",
        DeliveryMode::TransactionalOffsets => "transactional-offsets",
        DeliveryMode::AtLeastOnce => "at-least-once",
        DeliveryMode::None => "none",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaJobArgs,
    }

    #[test]
    fn kafka_properties_come_from_prefixed_variables() {
        let vars = [
            ("ONCEFLOW_KAFKA_PROPERTY_SASL_PASSWORD", "s3cret"),
            ("ONCEFLOW_KAFKA_PROPERTY_", "ignored: no name"),
            ("ONCEFLOW_BROKERS", "not a property"),
            ("ONCEFLOW_KAFKA_PROPERTY_SECURITY_PROTOCOL", "SASL_SSL"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            env_properties(vars.into_iter()),
            vec![
                ("sasl.password".to_string(), "s3cret".to_string()),
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ]
        );
    }

    #[test]
    fn replication_factors_are_minus_one_or_positive() {
        assert_eq!(parse_replication("-1"), Ok(-1));
        assert_eq!(parse_replication("3"), Ok(3));
        assert!(parse_replication("0").is_err());
        assert!(parse_replication("-2").is_err());
        assert!(parse_replication("40000").is_err());
    }

    #[test]
    fn defaults_derive_from_the_job_name() {
        let cli = Cli::parse_from(["job", "--parallelism", "3"]);
        let s = cli.kafka.settings("etl").unwrap();
        assert_eq!(s.input, "etl-input");
        assert_eq!(s.output, "etl-output");
        assert_eq!(s.group, "onceflow-etl");
        assert_eq!(s.prefix, "onceflow-etl");
        assert_eq!(s.parallelism, 3);
        assert_eq!(s.mode, DeliveryMode::TwoPhaseCommit);
    }

    #[test]
    fn exactly_once_modes_bound_checkpoint_time_by_the_transaction_timeout() {
        let ms = Duration::from_millis;
        let two_phase = DeliveryMode::TwoPhaseCommit;
        // the defaults: 60 s transactions, 1 s interval, 30 s allowance leave 29 s a round
        let (t, f) =
            checkpoint_limits(two_phase, ms(60_000), ms(1000), ms(30_000), None, None).unwrap();
        assert_eq!((t, f), (ms(29_000), Some(0)));
        // two tolerated failures split what is left in three rounds
        let (t, f) =
            checkpoint_limits(two_phase, ms(60_000), ms(1000), ms(30_000), None, Some(2)).unwrap();
        assert_eq!((t, f), (ms(9000), Some(2)));
        // at most the runtime's 60 s
        let (t, _) =
            checkpoint_limits(two_phase, ms(900_000), ms(1000), ms(30_000), None, None).unwrap();
        assert_eq!(t, ms(60_000));
        // an explicit timeout the transaction cannot outlive is refused, naming the rule
        let e = checkpoint_limits(
            two_phase,
            ms(60_000),
            ms(1000),
            ms(30_000),
            Some(ms(40_000)),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("= 71000 ms"), "{e}");
        let e = checkpoint_limits(two_phase, ms(60_000), ms(1000), ms(30_000), None, Some(40))
            .unwrap_err();
        assert!(
            e.to_string().contains("tolerable failed checkpoints 40"),
            "{e}"
        );
        // the other modes keep the runtime's defaults
        let (t, f) = checkpoint_limits(
            DeliveryMode::AtLeastOnce,
            ms(1000),
            ms(1000),
            ms(30_000),
            None,
            None,
        )
        .unwrap();
        assert_eq!((t, f), (ms(60_000), None));
    }

    #[test]
    fn bad_flags_are_configuration_errors() {
        assert!(Cli::try_parse_from(["job", "--mode", "maybe"]).is_err());
        let refused = |args: &[&str]| {
            let cli = Cli::parse_from(args);
            matches!(cli.kafka.settings("j"), Err(KafkaError::Config(_)))
        };
        assert!(refused(&["job", "--parallelism", "0"]));
        assert!(refused(&["job", "--checkpoint-interval-ms", "0"]));
        assert!(refused(&["job", "--transaction-timeout-ms", "5000"]));
        assert!(refused(&["job", "--restore", "latest"]));
        assert!(refused(&["job", "--restore-older-repeating-output"]));
        assert!(refused(&["job", "--kafka-property", "group.id=other"]));
        assert!(refused(&["job", "--kafka-property", "no-equals"]));
        // two-phase-commit recovery cannot speak GSSAPI (librdkafka's default mechanism)
        assert!(refused(&[
            "job",
            "--brokers",
            "h:1",
            "--kafka-property",
            "security.protocol=SASL_SSL"
        ]));
        assert!(!refused(&[
            "job",
            "--brokers",
            "h:1",
            "--kafka-property",
            "security.protocol=SASL_PLAINTEXT",
            "--kafka-property",
            "sasl.mechanism=SCRAM-SHA-256",
            "--kafka-property",
            "sasl.username=u",
            "--kafka-property",
            "sasl.password=p"
        ]));
        assert!(refused(&[
            "job",
            "--mode",
            "transactional-offsets",
            "--kafka-property",
            "security.protocol=SSL"
        ]));
        assert!(!refused(&[
            "job",
            "--brokers",
            "h:1",
            "--mode",
            "transactional-offsets",
            "--kafka-property",
            "security.protocol=SSL"
        ]));
        // scaled-out instances: transactional-offsets on a cluster, with a usable name
        assert!(refused(&["job", "--brokers", "h:1", "--instance-id", "a"]));
        assert!(refused(&[
            "job",
            "--mode",
            "transactional-offsets",
            "--instance-id",
            "a"
        ]));
        assert!(refused(&[
            "job",
            "--brokers",
            "h:1",
            "--mode",
            "transactional-offsets",
            "--instance-id",
            "node a"
        ]));
        assert!(!refused(&[
            "job",
            "--brokers",
            "h:1",
            "--mode",
            "transactional-offsets",
            "--instance-id",
            "node-a.1"
        ]));
        assert!(!refused(&[
            "job",
            "--mode",
            "at-least-once",
            "--restore",
            "latest"
        ]));
    }
}
