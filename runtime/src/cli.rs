//! Standard command-line flags of a job binary (`#[command(flatten)] job: JobArgs` in a clap
//! parser), turned into a [`JobConfig`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::config::{JobConfig, RestoreMode, DEFAULT_STATE_INLINE_THRESHOLD};

impl FromStr for RestoreMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(RestoreMode::None),
            "latest" => Ok(RestoreMode::Latest),
            id => id.parse().map(RestoreMode::Checkpoint).map_err(|_| {
                format!("restore must be `none`, `latest` or a checkpoint id, not `{id}`")
            }),
        }
    }
}

/// Flags every job binary understands.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// Subtasks per operator.
    #[arg(long, default_value_t = 1, env = "ONCEFLOW_PARALLELISM")]
    pub parallelism: usize,
    /// Number of key groups (keep it fixed over the life of a job).
    #[arg(long, default_value_t = 128, env = "ONCEFLOW_MAX_PARALLELISM")]
    pub max_parallelism: usize,
    /// Directory of durable checkpoints (none: no recovery).
    #[arg(long, env = "ONCEFLOW_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint interval in milliseconds (0: only the final checkpoint).
    #[arg(long, default_value_t = 1000, env = "ONCEFLOW_CHECKPOINT_INTERVAL_MS")]
    pub checkpoint_interval_ms: u64,
    /// A checkpoint that has not completed after this many ms fails (default 60000).
    #[arg(long, env = "ONCEFLOW_CHECKPOINT_TIMEOUT_MS")]
    pub checkpoint_timeout_ms: Option<u64>,
    /// Checkpoints that may fail in a row before the job fails (default: any number).
    #[arg(long, env = "ONCEFLOW_TOLERABLE_FAILED_CHECKPOINTS")]
    pub tolerable_failed_checkpoints: Option<u32>,
    /// Complete checkpoints to keep.
    #[arg(long, default_value_t = 3, env = "ONCEFLOW_RETAINED_CHECKPOINTS")]
    pub retained_checkpoints: usize,
    /// A subtask snapshot up to this many bytes is kept inside the checkpoint's `_metadata`
    /// instead of a file of its own (0: every snapshot gets a file).
    #[arg(long, default_value_t = DEFAULT_STATE_INLINE_THRESHOLD, env = "ONCEFLOW_STATE_INLINE_THRESHOLD_BYTES")]
    pub state_inline_threshold_bytes: usize,
    /// Where to restore from: `latest`, `none` or a checkpoint id (default: latest when a
    /// checkpoint directory is given).
    #[arg(long, env = "ONCEFLOW_RESTORE")]
    pub restore: Option<RestoreMode>,
    /// With `--restore latest`: if the newest complete checkpoint does not verify, restore the
    /// newest older one that does. Output written after that older checkpoint is written
    /// again (without this flag the job fails, naming both checkpoints).
    #[arg(long, env = "ONCEFLOW_RESTORE_OLDER_REPEATING_OUTPUT")]
    pub restore_older_repeating_output: bool,
}

impl JobArgs {
    /// The configuration for a job called `name`; SIGTERM stops it with a final checkpoint.
    pub fn to_config(&self, name: &str) -> JobConfig {
        let mut c = JobConfig::new(name)
            .parallelism(self.parallelism)
            .max_parallelism(self.max_parallelism)
            .retained_checkpoints(self.retained_checkpoints)
            .state_inline_threshold(self.state_inline_threshold_bytes)
            .restore_older_if_corrupt(self.restore_older_repeating_output)
            .stop_on_sigterm(true);
        if self.checkpoint_interval_ms > 0 {
            c = c.checkpoint_interval(Duration::from_millis(self.checkpoint_interval_ms));
        }
        if let Some(ms) = self.checkpoint_timeout_ms {
            c = c.checkpoint_timeout(Duration::from_millis(ms));
        }
        if self.tolerable_failed_checkpoints.is_some() {
            c = c.tolerable_failed_checkpoints(self.tolerable_failed_checkpoints);
        }
        if let Some(dir) = &self.checkpoint_dir {
            c = c
                .checkpoint_dir(dir)
                .restore(self.restore.unwrap_or(RestoreMode::Latest));
        } else if let Some(r) = self.restore {
            c = c.restore(r);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        job: JobArgs,
    }

    #[test]
    fn flags_make_a_config() {
        let cli = Cli::parse_from([
            "job",
            "--parallelism",
            "3",
            "--checkpoint-dir",
            "/tmp/x",
            "--checkpoint-interval-ms",
            "250",
        ]);
        let c = cli.job.to_config("j");
        assert_eq!(c.parallelism, 3);
        assert_eq!(c.restore, RestoreMode::Latest);
        assert_eq!(c.checkpoint_interval, Some(Duration::from_millis(250)));
        assert_eq!(c.state_inline_threshold, DEFAULT_STATE_INLINE_THRESHOLD);
        let cli = Cli::parse_from(["job", "--state-inline-threshold-bytes", "0"]);
        assert_eq!(cli.job.to_config("j").state_inline_threshold, 0);
        assert!(Cli::try_parse_from(["job", "--restore", "maybe"]).is_err());
        let cli = Cli::parse_from(["job", "--restore", "7", "--checkpoint-dir", "d"]);
        assert_eq!(cli.job.to_config("j").restore, RestoreMode::Checkpoint(7));
        assert!(!cli.job.to_config("j").restore_older_if_corrupt);
        assert_eq!(cli.job.to_config("j").tolerable_failed_checkpoints, None);
        assert_eq!(
            cli.job.to_config("j").checkpoint_timeout,
            Duration::from_secs(60)
        );
        let cli = Cli::parse_from([
            "job",
            "--tolerable-failed-checkpoints",
            "2",
            "--checkpoint-timeout-ms",
            "9000",
        ]);
        assert_eq!(cli.job.to_config("j").tolerable_failed_checkpoints, Some(2));
        assert_eq!(
            cli.job.to_config("j").checkpoint_timeout,
            Duration::from_secs(9)
        );
        let cli = Cli::parse_from(["job", "--restore-older-repeating-output"]);
        assert!(cli.job.to_config("j").restore_older_if_corrupt);
    }
}
