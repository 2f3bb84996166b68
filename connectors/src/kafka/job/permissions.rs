//! What a job needs to be allowed to do on the cluster, for the start-up permission check
//! ([`crate::kafka::security::check`]): Read on its input topic and group, Write on its
//! output topic, and in the exactly-once modes Write on every transactional id it will use
//! and Read on the prefix registry's topic and group ([`crate::kafka::registry`]).

use super::args::Settings;
use crate::kafka::registry::{registry_group, REGISTRY_TOPIC};
use crate::kafka::security::acl::{Operation, ResourceType};
use crate::kafka::security::check::{self, Need};
use crate::kafka::{seal_transactional_id, DeliveryMode, KafkaError, KafkaSinkConfig, Result};

/// The transactional ids a job with these settings uses: two-phase commit, one per subtask
/// and ring slot plus the checkpoint seal's; transactional offsets, the instance producer's.
pub(crate) fn transactional_ids(s: &Settings, sink_cfg: &KafkaSinkConfig) -> Vec<String> {
    match s.mode {
        DeliveryMode::TwoPhaseCommit => {
            let mut ids = Vec::new();
            for subtask in 0..s.parallelism {
                for slot in 0..sink_cfg.ring_slots {
                    ids.push(format!("{}-{subtask}-{slot}", s.prefix));
                }
            }
            ids.push(seal_transactional_id(&s.prefix));
            ids
        }
        DeliveryMode::TransactionalOffsets => vec![format!("{}-offsets", s.prefix)],
        DeliveryMode::AtLeastOnce | DeliveryMode::None => Vec::new(),
    }
}

/// Every permission a job with these settings needs.
pub(crate) fn needs(s: &Settings, sink_cfg: &KafkaSinkConfig) -> Vec<Need> {
    use Operation::{Read, Write};
    use ResourceType::{Group, Topic};
    let mut needs = vec![
        Need::new(Topic, &s.input, Read, "consume the input"),
        Need::new(Group, &s.group, Read, "read and commit the input offsets"),
        Need::new(Topic, &s.output, Write, "write the output"),
    ];
    if s.mode.is_transactional() {
        needs.push(Need::new(
            Topic,
            REGISTRY_TOPIC,
            Read,
            "register this job as the user of its transactional id prefix",
        ));
        needs.push(Need::new(
            Group,
            &registry_group(&s.prefix),
            Read,
            "register this job as the user of its transactional id prefix",
        ));
        for id in transactional_ids(s, sink_cfg) {
            needs.push(Need::transactional_id(
                &id,
                &s.prefix,
                "write the output and the input offsets in transactions",
            ));
        }
    }
    needs
}

/// Runs the check before anything is fenced or consumed. Missing permissions stop the job
/// with one message; a check that cannot complete (the cluster unreachable, a protocol error)
/// is logged and the job goes on, so the check never stops a job that could run.
pub(crate) fn verify(
    s: &Settings,
    brokers: &str,
    helper: &tokio::runtime::Runtime,
    sink_cfg: &KafkaSinkConfig,
) -> Result<()> {
    let needs = needs(s, sink_cfg);
    let span = tracing::info_span!("permission_check", needs = needs.len());
    let _entered = span.enter();
    match helper.block_on(check::check(brokers, &s.properties, &needs)) {
        Ok(_) => Ok(()),
        Err(e @ KafkaError::Config(_)) => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "the start-up permission check could not complete; a missing permission shows at its first use");
            Ok(())
        }
    }
}
