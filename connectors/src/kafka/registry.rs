//! Who uses a transactional id prefix.
//!
//! Two jobs with one prefix share transactional ids: each start fences the other's producers,
//! so the older job fails at its next commit and the newer one may commit or abort
//! transactions the older one wrote. A second *instance of the same job* taking over is
//! intended (it fences the first and restores from the group's offsets); a *different job*
//! is a configuration mistake. [`PrefixClaim`] tells them apart before anything is fenced.
//!
//! Every exactly-once job instance is a member of the consumer group
//! `onceflow-prefix.{prefix}`, subscribed to the one-partition topic [`REGISTRY_TOPIC`]
//! (which never holds data), with `client.id = onceflow-job-{hash of the job identity}`. The
//! group coordinator keeps the member while it heartbeats, and drops it one session timeout
//! (6 s) after the process died. At start, [`PrefixClaim::claim`] lists the group's members
//! (DescribeGroups): a member with another job identity is a live job using the prefix, and
//! the start is refused with a message naming it. Members with the same identity are older
//! instances of this job (live or dead), which the caller then fences.
//!
//! The check is made at start and is best effort: two jobs started within the same second can
//! both pass it; the fencing between them then stops the older one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::kafka::ClientProperties;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use super::{KafkaError, Result};

/// The topic the registration consumers subscribe to (one partition, no data).
pub const REGISTRY_TOPIC: &str = "onceflow-prefix-registry";
const CLIENT_ID_PREFIX: &str = "onceflow-job-";
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The consumer group whose members are the live users of `prefix`.
pub fn registry_group(prefix: &str) -> String {
    format!("onceflow-prefix.{prefix}")
}

/// The client id that stands for a job identity (FNV-1a 64 of it: stable across builds).
pub fn job_client_id(job_identity: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job_identity.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{CLIENT_ID_PREFIX}{h:016x}")
}

/// This job instance's membership in the prefix's registry group; leaves the group on drop.
pub struct PrefixClaim {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PrefixClaim {
    /// Refuses if a live job with another identity uses `prefix`, else joins the registry
    /// group. `job_identity` names the job, not the process: the example uses its checkpoint
    /// directory, which every instance of one job shares. Blocking.
    pub fn claim(
        brokers: &str,
        properties: &ClientProperties,
        prefix: &str,
        job_identity: &str,
        replication: i32,
    ) -> Result<PrefixClaim> {
        let group = registry_group(prefix);
        let me = job_client_id(job_identity);
        let consumer: BaseConsumer = properties
            .client_config(brokers)
            .set("group.id", &group)
            .set("client.id", &me)
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "1000")
            .set("auto.offset.reset", "latest")
            .create()
            .map_err(|e| KafkaError::client("creating the prefix registry consumer", e))?;
        // librdkafka's group listing waits for the client's first metadata, which a new
        // client fetches only on its one-second timer; asking for metadata connects now
        let _ = consumer.fetch_metadata(Some(REGISTRY_TOPIC), CALL_TIMEOUT);
        let groups = crate::kafka::retry::blocking(
            &format!("describing group {group}"),
            &format!("group coordinator of {group}"),
            crate::kafka::retry::COORDINATOR_BUDGET,
            || consumer.fetch_group_list(Some(&group), CALL_TIMEOUT),
        )?;
        for g in groups.groups().iter().filter(|g| g.name() == group) {
            for m in g.members() {
                let id = m.client_id();
                if id.starts_with(CLIENT_ID_PREFIX) && id != me {
                    return Err(KafkaError::Config(format!(
                        "transactional id prefix `{prefix}` is in use by another live job ({id} at {}; this job is {me}): two jobs with one prefix fence each other's transactions. Give this job its own --transactional-id-prefix, or stop the other job (a dead job's claim expires 6 s after it stopped)",
                        m.client_host()
                    )));
                }
            }
        }
        ensure_registry_topic(&consumer, brokers, properties, replication)?;
        consumer
            .subscribe(&[REGISTRY_TOPIC])
            .map_err(|e| KafkaError::client("joining the prefix registry group", e))?;
        tracing::info!(prefix, group = %group, client_id = %me, "claimed the transactional id prefix");
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prefix-claim".into())
            .spawn(move || {
                // polling keeps the membership (heartbeats run in librdkafka's threads)
                while !stop2.load(Ordering::Relaxed) {
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(200)) {
                        tracing::debug!(error = %e, "prefix registry consumer");
                    }
                }
                consumer.unsubscribe();
            })
            .map_err(|e| {
                KafkaError::Protocol(format!("cannot start the prefix claim thread: {e}"))
            })?;
        Ok(PrefixClaim {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PrefixClaim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates the registry topic unless it exists, with `replication` replicas (-1: the
/// cluster's `default.replication.factor`): on a cluster with ACLs a job may Read it without
/// the right to Create it (CreateTopics answers TOPIC_AUTHORIZATION_FAILED then, even for an
/// existing topic).
fn ensure_registry_topic(
    consumer: &BaseConsumer,
    brokers: &str,
    properties: &ClientProperties,
    replication: i32,
) -> Result<()> {
    if let Ok(md) = consumer.fetch_metadata(Some(REGISTRY_TOPIC), CALL_TIMEOUT) {
        if md.topics().iter().any(|t| {
            t.name() == REGISTRY_TOPIC && t.error().is_none() && !t.partitions().is_empty()
        }) {
            return Ok(());
        }
    }
    let admin: AdminClient<DefaultClientContext> = properties
        .client_config(brokers)
        .create()
        .map_err(|e| KafkaError::client("creating an admin client", e))?;
    let topic = NewTopic::new(REGISTRY_TOPIC, 1, TopicReplication::Fixed(replication));
    let opts = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
    // rdkafka's admin futures need no runtime: callable from inside or outside tokio
    let created = futures::executor::block_on(admin.create_topics([&topic], &opts))
        .map_err(|e| KafkaError::client(format!("creating topic {REGISTRY_TOPIC}"), e))?;
    for r in created {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, RDKafkaErrorCode::InvalidReplicationFactor)) => {
                return Err(KafkaError::Config(format!(
                    "cannot create topic {t} with replication factor {replication}: the cluster refused it as invalid (more replicas than brokers?); set --internal-replication-factor to at most the number of brokers, or to -1 for the cluster's default.replication.factor"
                )))
            }
            Err((t, code)) => {
                return Err(KafkaError::Protocol(format!(
                    "cannot create topic {t}: {code} (create it with one partition, or allow this job's principal Create on it)"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_stable_and_distinct() {
        assert_eq!(job_client_id("/a"), job_client_id("/a"));
        assert_ne!(job_client_id("/a"), job_client_id("/b"));
        // FNV-1a 64 of the empty string is its offset basis: the hash is not std's
        assert_eq!(job_client_id(""), "onceflow-job-cbf29ce484222325");
    }
}
