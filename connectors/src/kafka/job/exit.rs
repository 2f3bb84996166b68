//! The process side of a job binary: tracing from `RUST_LOG`, and the documented exit codes a
//! failure maps to.

use super::logs::{JsonLines, LogFormat};
use crate::kafka::KafkaError;

/// Exit codes of a job binary run through [`super::KafkaJob::main`].
pub mod exit_code {
    /// The job stopped on request (SIGTERM, Ctrl-C, `--max-records`, ...) after its final
    /// checkpoint was committed, or its input ended.
    pub const OK: i32 = 0;
    /// A newer instance of the job fenced this one (it took over); nothing to do.
    pub const FENCED: i32 = 1;
    /// Bad configuration (flags, checkpoint directory, prefix in use, broker limits): the
    /// message says what to change; restarting unchanged fails again.
    pub const CONFIG: i32 = 2;
    /// Output of a complete checkpoint can no longer be committed (`DATA LOSS`): needs a
    /// human; see docs/KAFKA.md.
    pub const DATA_LOSS: i32 = 3;
    /// Any other failure (broker unreachable, disk, a bug): restarting may succeed; the job
    /// restores its last complete checkpoint.
    pub const FAILED: i32 = 4;
    /// A coordinator of the cluster stayed unavailable (loading, moved, unreachable) for
    /// longer than the retry budget of 120 s (`cluster unavailable: ...`); restarting once
    /// the cluster is back succeeds. See docs/JOBS.md, "When the cluster is away".
    pub const UNAVAILABLE: i32 = 5;
    /// No bootstrap server answered at start within `--connect-timeout-ms` (`cluster
    /// unreachable: ...`, naming each address and the cause: name not resolved, connection
    /// refused, TLS handshake failed, SASL authentication failed). Check `--brokers` and the
    /// client properties; a restart succeeds once the cluster is reachable.
    pub const UNREACHABLE: i32 = 6;
    /// A second Ctrl-C: the process exited at once, without a final checkpoint.
    pub const INTERRUPTED: i32 = 130;
}

impl KafkaError {
    /// The exit code a job binary reports for this error (see [`exit_code`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            KafkaError::Config(_) => exit_code::CONFIG,
            KafkaError::Unavailable(_) => exit_code::UNAVAILABLE,
            KafkaError::Unreachable(_) => exit_code::UNREACHABLE,
            KafkaError::Fenced(_) => exit_code::FENCED,
            KafkaError::DataLoss(_) => exit_code::DATA_LOSS,
            KafkaError::Runtime(onceflow_runtime::Error::InvalidJob(_)) => exit_code::CONFIG,
            KafkaError::Runtime(e) => {
                // connector errors reach the runtime as text (`Error::Fatal`), prefixed as
                // KafkaError::{DataLoss, Fenced} display them
                let text = e.to_string();
                if text.contains("DATA LOSS") {
                    exit_code::DATA_LOSS
                } else if text.contains("cluster unavailable: ") {
                    exit_code::UNAVAILABLE
                } else if matches!(e, onceflow_runtime::Error::Fatal(_)) && text.contains("fenced")
                {
                    exit_code::FENCED
                } else {
                    exit_code::FAILED
                }
            }
            KafkaError::Client { .. } | KafkaError::Protocol(_) | KafkaError::Aborted(_) => {
                exit_code::FAILED
            }
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings, and the runtime's and the
/// connectors' info lines), in colour only on a terminal without `NO_COLOR` (a log file or
/// a pipe gets plain text). Does nothing if a subscriber is already installed.
pub fn init_tracing() {
    init_logs(LogFormat::Text, "", None);
}

/// [`init_tracing`] in `format`; JSON lines carry `job` and `instance` (see [`LogFormat`]).
pub fn init_logs(format: LogFormat, job: &str, instance: Option<String>) {
    use std::io::IsTerminal;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "warn,onceflow_runtime=info,onceflow_connectors=info".into())
    };
    let _ = match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .with_env_filter(filter())
            .try_init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(JsonLines {
                job: job.to_string(),
                instance,
            })
            .with_env_filter(filter())
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_their_documented_codes() {
        let code = |e: KafkaError| e.exit_code();
        assert_eq!(code(KafkaError::Config("x".into())), 2);
        assert_eq!(code(KafkaError::Fenced("x".into())), 1);
        assert_eq!(code(KafkaError::DataLoss("x".into())), 3);
        let via_runtime = |e: KafkaError| code(KafkaError::Runtime(e.into()));
        assert_eq!(via_runtime(KafkaError::Fenced("took over".into())), 1);
        assert_eq!(via_runtime(KafkaError::DataLoss("txn aborted".into())), 3);
        assert_eq!(via_runtime(KafkaError::Protocol("eof".into())), 4);
        assert_eq!(via_runtime(KafkaError::Aborted("timed out".into())), 4);
        assert_eq!(
            code(KafkaError::Runtime(onceflow_runtime::Error::InvalidJob(
                "x".into()
            ))),
            2
        );
    }
}
