//! Metric names of the Kafka connectors (Prometheus through the `metrics` facade), their
//! catalogue, and the recorder a Kafka job installs: every metric of the job described
//! (`# HELP`), durations as histograms with buckets chosen per metric.

/// Histogram: seconds from commit request to commit done, label `mode`.
pub const TXN_COMMIT_SECONDS: &str = "onceflow_kafka_txn_commit_seconds";
/// Histogram: seconds a two-phase-commit transaction's start waited for its slot's
/// producer (near zero once the ring's producers were made ahead of use).
pub const TXN_PRODUCER_WAIT_SECONDS: &str = "onceflow_kafka_txn_producer_wait_seconds";
/// Histogram: seconds the sink waited for a two-phase commit that ran while the next
/// transaction was written (near zero when the overlap hid the commit).
pub const TXN_COMMIT_WAIT_SECONDS: &str = "onceflow_kafka_txn_commit_wait_seconds";
/// Histogram: seconds a two-phase-commit pre-commit waited for the acks of its
/// transaction's records (the flush at the barrier).
pub const PRE_COMMIT_DRAIN_SECONDS: &str = "onceflow_kafka_pre_commit_drain_seconds";
/// Gauge: age in seconds of the oldest open (not yet committed) transaction, label `subtask`.
pub const TXN_OPEN_AGE_SECONDS: &str = "onceflow_kafka_txn_open_age_seconds";
/// Gauge: the configured transaction timeout in seconds (compare with the open age).
pub const TXN_TIMEOUT_SECONDS: &str = "onceflow_kafka_txn_timeout_seconds";
/// Histogram: seconds from a transaction's start to its commit: how long the oldest record
/// of each committed transaction waited before read_committed readers could see it.
pub const OUTPUT_LATENCY_SECONDS: &str = "onceflow_kafka_output_latency_seconds";
/// Counter: records written to the dead-letter topic (`<output>.dlq`).
pub const DEAD_LETTERS: &str = "onceflow_kafka_dead_letters_total";
/// Histogram: records per committed transaction.
pub const RECORDS_PER_TXN: &str = "onceflow_kafka_records_per_txn";
/// Counter: fencing events (ids fenced at recovery, `kind=recovery`; this producer fenced,
/// `kind=fenced`).
pub const FENCING_EVENTS: &str = "onceflow_kafka_fencing_events_total";
/// Counter: transactions committed at recovery with the raw committer.
pub const RECOVERY_COMMITS: &str = "onceflow_kafka_recovery_commits_total";
/// Gauge: consumer lag (high watermark - position) per partition, labels `topic`, `partition`.
pub const CONSUMER_LAG: &str = "onceflow_kafka_consumer_lag";
/// Counter: records produced, label `mode`.
pub const RECORDS_PRODUCED: &str = "onceflow_kafka_records_produced_total";
/// Counter: records consumed, label `topic`.
pub const RECORDS_CONSUMED: &str = "onceflow_kafka_records_consumed_total";
/// Counter: input partitions found to have lost records before the source read them
/// (deleted by retention or DeleteRecords), label `topic`; the job stops with DATA LOSS.
pub const INPUT_DELETED_BEFORE_READ: &str = "onceflow_kafka_input_deleted_before_read_total";
/// Counter: checkpoints not sealed because their transactions may have timed out (the job
/// restarts from the last sealed one).
pub const SEALS_REFUSED: &str = "onceflow_kafka_seals_refused_total";
/// Counter: start-up permission checks, label `outcome` (`passed`, `failed`, `skipped`) and
/// `method` (`describe-acls`, `probes`, `no-authorizer`, `none`).
pub const PERMISSION_CHECKS: &str = "onceflow_kafka_permission_checks_total";
/// Gauge: permissions the last start-up check found missing.
pub const PERMISSIONS_MISSING: &str = "onceflow_kafka_permissions_missing";
/// Counter: coordinator calls retried after a retriable error (coordinator loading, moved or
/// unavailable, a concurrent transaction, a timeout or a dropped connection), label `call`.
pub const COORDINATOR_RETRIES: &str = "onceflow_kafka_coordinator_retries_total";

use onceflow_runtime::metrics::{def, hist, MetricDef, MetricKind, DURATION_BUCKETS, WAIT_BUCKETS};

/// Buckets for transaction sizes in records.
const RECORD_COUNT_BUCKETS: &[f64] = &[1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0];
/// Buckets for changelog bytes per commit.
const BYTES_BUCKETS: &[f64] = &[
    1_024.0,
    16_384.0,
    131_072.0,
    1_048_576.0,
    8_388_608.0,
    67_108_864.0,
];

use crate::kafka::job::{DATAFLOWS, REBALANCE_PAUSE_SECONDS};
use crate::kafka::scale::member::{REBALANCES, REVOKE_SECONDS, TASKS_OWNED};
use crate::kafka::scale::{
    CHANGELOG_BYTES_PER_COMMIT, CHANGELOG_RECORDS, REPARTITION_PURGES, REPARTITION_RECORDS,
    RESTORE_CACHED_RECORDS, RESTORE_RECORDS, RESTORE_SECONDS,
};
use MetricKind::{Counter, Gauge};

/// The Kafka source's, sinks' and job's metrics, and the scaled-out instances' (`onceflow_scale_`).
pub const CATALOGUE: &[MetricDef] = &[
    hist(TXN_COMMIT_SECONDS, "seconds", "mode", "Seconds from a transaction's commit request to its commit done (mode: two-phase-commit, transactional-offsets, recovery, seal).", DURATION_BUCKETS),
    hist(TXN_PRODUCER_WAIT_SECONDS, "seconds", "", "Seconds a two-phase-commit transaction's start waited for its slot's producer.", WAIT_BUCKETS),
    hist(TXN_COMMIT_WAIT_SECONDS, "seconds", "", "Seconds a two-phase-commit sink waited for a commit that ran while the next transaction was written.", WAIT_BUCKETS),
    hist(PRE_COMMIT_DRAIN_SECONDS, "seconds", "", "Seconds a two-phase-commit pre-commit waited for the acknowledgements of its transaction's records.", DURATION_BUCKETS),
    hist(OUTPUT_LATENCY_SECONDS, "seconds", "mode", "Seconds from a transaction's start to its commit: how long the oldest record of each committed transaction waited before read_committed readers could see it.", DURATION_BUCKETS),
    def(TXN_OPEN_AGE_SECONDS, Gauge, "seconds", "subtask", "Age of the oldest open transaction of a sink subtask (compare with onceflow_kafka_txn_timeout_seconds)."),
    def(TXN_TIMEOUT_SECONDS, Gauge, "seconds", "", "The job's transaction timeout (transaction.timeout.ms)."),
    hist(RECORDS_PER_TXN, "records", "", "Records per committed transaction.", RECORD_COUNT_BUCKETS),
    def(FENCING_EVENTS, Counter, "events", "kind", "Fencing events: transactional ids fenced at recovery (kind=recovery), this producer fenced by a newer one (kind=fenced)."),
    def(RECOVERY_COMMITS, Counter, "transactions", "", "Pre-committed transactions committed at recovery."),
    def(CONSUMER_LAG, Gauge, "records", "topic, partition", "Records of an input partition not yet read (high watermark minus position)."),
    def(RECORDS_PRODUCED, Counter, "records", "mode", "Records handed to a Kafka producer."),
    def(DEAD_LETTERS, Counter, "records", "", "Records written to the dead-letter topic <output>.dlq."),
    def(RECORDS_CONSUMED, Counter, "records", "topic", "Records read from the input."),
    def(INPUT_DELETED_BEFORE_READ, Counter, "partitions", "topic", "Input partitions that lost records to retention or DeleteRecords before the job read them (the job stops with DATA LOSS)."),
    def(SEALS_REFUSED, Counter, "checkpoints", "", "Checkpoints not sealed because their transactions may have timed out."),
    def(PERMISSION_CHECKS, Counter, "checks", "outcome, method", "Start-up permission checks by outcome (passed, failed, skipped) and method."),
    def(PERMISSIONS_MISSING, Gauge, "permissions", "", "Permissions the last start-up check found missing."),
    def(COORDINATOR_RETRIES, Counter, "retries", "call", "Coordinator calls retried after a retriable error (loading, moved, unavailable, concurrent transaction, timeout, dropped connection)."),
    def(TASKS_OWNED, Gauge, "partitions", "", "Input partitions (tasks) this instance owns."),
    def(REBALANCES, Counter, "events", "kind", "Rebalance events seen by this instance (assigned, revoked, lost)."),
    hist(REVOKE_SECONDS, "seconds", "", "Seconds the instance spent releasing revoked partitions.", DURATION_BUCKETS),
    hist(REBALANCE_PAUSE_SECONDS, "seconds", "", "Seconds from an assignment change to the next dataflow's start.", DURATION_BUCKETS),
    def(DATAFLOWS, Counter, "dataflows", "reason", "Dataflows the instance built (reason: start, rebalance, failure)."),
    def(CHANGELOG_RECORDS, Counter, "records", "", "State changelog records written (tombstones included)."),
    hist(CHANGELOG_BYTES_PER_COMMIT, "bytes", "", "Bytes of changelog records (keys and values) in one instance commit.", BYTES_BUCKETS),
    def(RESTORE_RECORDS, Counter, "records", "task", "Changelog records read back on restore."),
    def(RESTORE_CACHED_RECORDS, Counter, "records", "task", "Changelog records a restore took from the local cache."),
    hist(RESTORE_SECONDS, "seconds", "topic", "Seconds one operator subtask spent restoring from its changelog.", DURATION_BUCKETS),
    def(REPARTITION_RECORDS, Counter, "records", "direction", "Records through repartition topics (direction: written, read)."),
    def(REPARTITION_PURGES, Counter, "partitions", "", "Repartition partitions whose consumed records were deleted."),
];

/// Every metric a Kafka job exports: the runtime's, the window operators', the Kafka
/// connectors' and the bundled broker's when it runs in the process.
pub fn job_catalogue() -> Vec<MetricDef> {
    let mut all = Vec::new();
    all.extend_from_slice(onceflow_runtime::metrics::CATALOGUE);
    all.extend_from_slice(onceflow_operators::window::METRICS);
    all.extend_from_slice(CATALOGUE);
    all
}

/// Installs the Prometheus recorder of a job: buckets per histogram from the catalogue,
/// every metric described.
pub(crate) fn install_recorder(
) -> crate::kafka::Result<metrics_exporter_prometheus::PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let catalogue = job_catalogue();
    let mut builder = PrometheusBuilder::new();
    for d in catalogue.iter().filter(|d| d.kind == MetricKind::Histogram) {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(d.name.to_string()), d.buckets)
            .map_err(|e| crate::kafka::KafkaError::Config(format!("buckets of {}: {e}", d.name)))?;
    }
    // the bundled broker in the process (a job without --brokers): its histograms are
    // durations
    builder = builder
        .set_buckets_for_metric(Matcher::Prefix("onceflow_broker_".into()), DURATION_BUCKETS)
        .map_err(|e| crate::kafka::KafkaError::Config(format!("broker buckets: {e}")))?;
    let handle = builder.install_recorder().map_err(|e| {
        crate::kafka::KafkaError::Config(format!("cannot install the Prometheus recorder: {e}"))
    })?;
    onceflow_runtime::metrics::describe(&catalogue);
    Ok(handle)
}

/// The catalogue as the Markdown table of docs/METRICS.md.
pub fn catalogue_table(catalogue: &[MetricDef]) -> String {
    let mut t = String::from("| Name | Type | Unit | Labels | Meaning |\n|---|---|---|---|---|\n");
    for d in catalogue {
        let labels = if d.labels.is_empty() { "-" } else { d.labels };
        t.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            d.name,
            d.kind.as_str(),
            d.unit,
            labels,
            d.help
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/METRICS.md");
    const BEGIN: &str = "<!-- job metrics: begin (generated from the catalogue) -->\n";
    const END: &str = "<!-- job metrics: end -->";

    /// docs/METRICS.md holds the catalogue's table as it is; `ONCEFLOW_BLESS=1` rewrites it.
    #[test]
    fn the_metrics_doc_lists_the_catalogue() {
        let doc = std::fs::read_to_string(DOC).expect("docs/METRICS.md");
        let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
            panic!("docs/METRICS.md lacks the {BEGIN:?} ... {END:?} markers");
        };
        let table = catalogue_table(&job_catalogue());
        let current = &doc[b + BEGIN.len()..e];
        if current != table {
            if std::env::var_os("ONCEFLOW_BLESS").is_some() {
                let new = format!("{}{BEGIN}{table}{}", &doc[..b], &doc[e..]);
                std::fs::write(DOC, new).expect("write docs/METRICS.md");
            } else {
                panic!("docs/METRICS.md's table differs from the catalogue (run with ONCEFLOW_BLESS=1 to rewrite it):\n{table}");
            }
        }
    }

    /// Every broker metric name in the broker's source is listed in docs/METRICS.md.
    #[test]
    fn the_metrics_doc_lists_every_broker_metric() {
        let doc = std::fs::read_to_string(DOC).expect("docs/METRICS.md");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../broker/src");
        let mut missing = Vec::new();
        let mut stack = vec![std::path::PathBuf::from(src)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("broker/src").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for (i, _) in text.match_indices("\"onceflow_broker_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !doc.contains(&format!("`{name}`")) && !missing.contains(&name) {
                        missing.push(name);
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "docs/METRICS.md does not list {missing:?}"
        );
    }

    #[test]
    fn the_catalogue_names_each_metric_once_in_one_scheme() {
        let all = job_catalogue();
        let mut seen = std::collections::BTreeSet::new();
        for d in &all {
            assert!(seen.insert(d.name), "{} listed twice", d.name);
            assert!(d.name.starts_with("onceflow_"), "{}", d.name);
            assert_eq!(
                d.kind == Counter,
                d.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                d.name
            );
            assert_eq!(
                d.kind == MetricKind::Histogram,
                !d.buckets.is_empty(),
                "{}",
                d.name
            );
            assert!(d.buckets.windows(2).all(|w| w[0] < w[1]), "{}", d.name);
            assert!(
                !d.name.contains("micro") && !d.name.contains("millis"),
                "{}: base units",
                d.name
            );
            if d.unit == "seconds" {
                assert!(d.name.contains("seconds"), "{}", d.name);
            }
            if d.unit == "bytes" {
                assert!(d.name.contains("bytes"), "{}", d.name);
            }
            assert!(d.help.ends_with('.'), "{}", d.name);
        }
    }
}
