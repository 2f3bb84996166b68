//! The start-up protocol of a Kafka job, in order (docs/KAFKA.md, "Taking over a running
//! instance"): instance lock, the permission check, the broker's maximum transaction timeout, the prefix claim,
//! fencing of every older instance, the wait for an older instance on this directory, and the
//! choice of the checkpoint to restore from the group's committed offsets.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use onceflow_runtime::checkpoint::{CheckpointStorage, LocalDirStorage};
use onceflow_runtime::RestoreMode;

use super::args::Settings;
use super::{instance, permissions, say};
use crate::kafka::security::ClientSecurity;
use crate::kafka::{
    committed_checkpoint, committer, validate_transaction_timeout, CheckpointSeal, DeliveryMode,
    KafkaError, KafkaSinkConfig, OffsetsLink, PrefixClaim, Result,
};

/// What the start-up protocol leaves for the run: where to restore from, the seal (two-phase
/// commit), the link between source and sinks (exactly-once modes) and the guards that must
/// live as long as the job.
pub(crate) struct Started {
    pub restore: RestoreMode,
    pub seal: Option<Arc<CheckpointSeal>>,
    pub link: Option<OffsetsLink>,
    pub _lock: File,
    pub _claim: Option<PrefixClaim>,
}

/// Checks the transaction timeout against the broker's transaction.max.timeout.ms, when the
/// broker tells it.
pub(crate) fn check_broker_max_timeout(
    s: &Settings,
    brokers: &str,
    helper: &tokio::runtime::Runtime,
    sink_cfg: &KafkaSinkConfig,
) -> Result<()> {
    let max_timeout = match ClientSecurity::unsupported(&sink_cfg.client_properties) {
        None => ClientSecurity::from_properties(
            &sink_cfg.client_properties,
            "reading the broker's transaction.max.timeout.ms",
        )
        .map(|security| {
            helper.block_on(committer::broker_max_transaction_timeout(
                brokers, &security,
            ))
        })?,
        // onceflow's own client cannot connect with these properties; the broker enforces
        // its maximum itself (InitProducerId fails with INVALID_TRANSACTION_TIMEOUT)
        Some(_) => Ok(None),
    };
    match max_timeout {
        Ok(Some(max)) => validate_transaction_timeout(s.timeout, s.interval, s.allowance, Some(max))?,
        Ok(None) => tracing::info!(
            "the broker does not report transaction.max.timeout.ms; skipping the broker-maximum check"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot read the broker's transaction.max.timeout.ms; skipping that check"),
    }

    Ok(())
}

/// Runs the protocol for a job whose sinks write with `sink_cfg`. `restore` is what the
/// non-transactional modes restore (the flag or latest).
pub(crate) fn start(
    s: &Settings,
    brokers: &str,
    dir: &Path,
    helper: &tokio::runtime::Runtime,
    sink_cfg: &KafkaSinkConfig,
    restore: RestoreMode,
) -> Result<Started> {
    // one live instance per checkpoint directory; in the exactly-once modes a newer one fences
    // the older one and takes over
    let lock = instance::try_lock(dir)?;
    // every permission the job needs, in one message, before anything is fenced or read
    permissions::verify(s, brokers, helper, sink_cfg)?;
    if !s.mode.is_transactional() {
        let Some(lock) = lock else {
            return Err(KafkaError::Config(format!(
                "checkpoint directory {} is in use by another running instance of this job; stop it first (in --mode two-phase-commit and transactional-offsets a second instance fences the first and takes over)",
                dir.display()
            )));
        };
        return Ok(Started {
            restore,
            seal: None,
            link: None,
            _lock: lock,
            _claim: None,
        });
    }

    check_broker_max_timeout(s, brokers, helper, sink_cfg)?;

    // a different job using this prefix would fence our transactions (and we its): refuse
    let identity = std::fs::canonicalize(dir)
        .map_err(|e| KafkaError::Config(format!("checkpoint directory {}: {e}", dir.display())))?
        .display()
        .to_string();
    let claim = PrefixClaim::claim(
        brokers,
        &sink_cfg.client_properties,
        &s.prefix,
        &identity,
        s.internal_replication,
    )?;

    // 1. fence every older instance: from now on none of them can complete a checkpoint
    //    (two-phase commit: the seal; transactional offsets: the instance producer)
    let link = OffsetsLink::new();
    let seal = if s.mode == DeliveryMode::TwoPhaseCommit {
        Some(Arc::new(CheckpointSeal::fence_previous(
            sink_cfg,
            link.clone(),
        )?))
    } else {
        link.fence_previous(sink_cfg, s.parallelism)?;
        None
    };
    // 2. an older instance on this directory fails at its next seal or commit: wait for it
    let lock = match lock {
        Some(l) => l,
        None => {
            say(format!(
                "another instance of this job holds {}: it is fenced now; waiting for it to stop",
                instance::lock_path(dir).display()
            ));
            instance::wait_for(dir, s.timeout)?
        }
    };
    // 3. the group's committed offsets name the newest complete checkpoint, for good now
    let restore = match committed_checkpoint(
        brokers,
        &sink_cfg.client_properties,
        &s.group,
        &s.input,
    )? {
        Some(c) => {
            let complete = LocalDirStorage::new(dir)
                .and_then(|st| st.list_complete())
                .map_err(|e| KafkaError::Config(e.to_string()))?;
            if !complete.contains(&c) {
                return Err(KafkaError::Config(format!(
                    "group {} has committed offsets of checkpoint {c}, but {} holds no complete checkpoint {c} (it has {complete:?}): the checkpoint directory was deleted or belongs to another job. Restore the directory, or start over with a new --group and a new output topic",
                    s.group,
                    dir.display()
                )));
            }
            say(format!(
                "restoring checkpoint {c} (named by group {})",
                s.group
            ));
            RestoreMode::Checkpoint(c)
        }
        None => RestoreMode::None,
    };
    Ok(Started {
        restore,
        seal,
        link: Some(link),
        _lock: lock,
        _claim: Some(claim),
    })
}
