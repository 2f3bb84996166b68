//! Kafka's own command-line tools (Apache Kafka 4.4's `kafka-topics`, `kafka-configs`,
//! `kafka-consumer-groups`, `kafka-transactions`, `kafka-console-consumer`, `kafka-acls`)
//! against the bundled broker and against one Apache Kafka node: the same sequence of tool
//! invocations and client actions runs on each, every output is normalized (node ids, ports,
//! producer ids, timestamps, column widths) and the two are compared line by line. A
//! difference fails the test unless [`EXPECTED`] lists it with its reason (the same list is in
//! docs/TESTING.md, "Kafka's command-line tools").
//!
//! Run it: `cargo test --test kafka_tools -- --nocapture` (Java 17 and Maven).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use onceflow_testkit::apache_kafka::{run_tool, KafkaNode, KafkaOptions};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::clients::{create_topics, flush, send, txn_producer, T};
use onceflow_testkit::raw::describe_transaction;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

/// Bound of one tool run: only a stuck tool reaches it (a JVM start takes 2-3 s here).
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

const TOPIC: &str = "kt-orders";
const TXN_TOPIC: &str = "kt-txn";
const GROUP: &str = "kt-group";
const TXN_COMMITTED: &str = "kt-committed";
const TXN_ABORTED: &str = "kt-aborted";
const TXN_HANGING: &str = "kt-hanging";
/// Offset of the hanging transaction's record in `kt-txn`: c1 0, c2 1, commit marker 2,
/// a1 3, abort marker 4, h1 5.
const HANGING_OFFSET: &str = "5";

/// One step of the sequence: a tool run (compared) or a client action (not compared).
enum Step {
    Tool {
        label: &'static str,
        tool: &'static str,
        args: &'static [&'static str],
        /// Table columns whose values differ between any two clusters.
        masked_columns: &'static [&'static str],
    },
    Action(&'static str, fn(&str)),
}

use Step::{Action, Tool};

/// Columns masked by name: node ids, producer ids (allocated from different ranges), wall
/// clock times and the coordinator epoch (controller-assigned).
const TXN_COLUMNS: &[&str] = &[
    "ProducerId",
    "Coordinator",
    "CoordinatorId",
    "CurrentTransactionStartTimeMs",
    "TransactionStartTimeMs",
    "TransactionDurationMs",
    "LastTimestamp",
    "CoordinatorEpoch",
];

const STEPS: &[Step] = &[
    Tool {
        label: "topics-create",
        tool: "kafka-topics",
        args: &[
            "--create",
            "--topic",
            TOPIC,
            "--partitions",
            "2",
            "--replication-factor",
            "1",
        ],
        masked_columns: &[],
    },
    Action("create kt-txn", |b| create_topics(b, &[TXN_TOPIC], 1)),
    Tool {
        label: "topics-list",
        tool: "kafka-topics",
        args: &["--list", "--exclude-internal"],
        masked_columns: &[],
    },
    Tool {
        label: "topics-describe",
        tool: "kafka-topics",
        args: &["--describe", "--topic", TOPIC],
        masked_columns: &[],
    },
    Tool {
        label: "configs-alter",
        tool: "kafka-configs",
        args: &[
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            TOPIC,
            "--add-config",
            "retention.ms=3600000,max.message.bytes=2000000",
        ],
        masked_columns: &[],
    },
    Tool {
        label: "configs-describe",
        tool: "kafka-configs",
        args: &[
            "--describe",
            "--entity-type",
            "topics",
            "--entity-name",
            TOPIC,
        ],
        masked_columns: &[],
    },
    Action("produce and commit group offsets", produce_and_commit),
    Tool {
        label: "groups-list",
        tool: "kafka-consumer-groups",
        args: &["--list"],
        masked_columns: &[],
    },
    Tool {
        label: "groups-describe",
        tool: "kafka-consumer-groups",
        args: &["--describe", "--group", GROUP],
        masked_columns: &[],
    },
    Tool {
        label: "groups-reset-to-earliest",
        tool: "kafka-consumer-groups",
        args: &[
            "--reset-offsets",
            "--to-earliest",
            "--execute",
            "--group",
            GROUP,
            "--topic",
            TOPIC,
        ],
        masked_columns: &[],
    },
    Tool {
        label: "groups-describe-after-reset",
        tool: "kafka-consumer-groups",
        args: &["--describe", "--group", GROUP],
        masked_columns: &[],
    },
    Action("committed, aborted and hanging transactions", transactions),
    Tool {
        label: "transactions-list",
        tool: "kafka-transactions",
        args: &["list"],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "transactions-describe",
        tool: "kafka-transactions",
        args: &["describe", "--transactional-id", TXN_HANGING],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "transactions-describe-producers",
        tool: "kafka-transactions",
        args: &[
            "describe-producers",
            "--topic",
            TXN_TOPIC,
            "--partition",
            "0",
        ],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "transactions-find-hanging",
        tool: "kafka-transactions",
        args: &[
            "find-hanging",
            "--topic",
            TXN_TOPIC,
            "--max-transaction-timeout",
            "0",
        ],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "transactions-abort",
        tool: "kafka-transactions",
        args: &[
            "abort",
            "--topic",
            TXN_TOPIC,
            "--partition",
            "0",
            "--start-offset",
            HANGING_OFFSET,
        ],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "transactions-describe-producers-after-abort",
        tool: "kafka-transactions",
        args: &[
            "describe-producers",
            "--topic",
            TXN_TOPIC,
            "--partition",
            "0",
        ],
        masked_columns: TXN_COLUMNS,
    },
    Tool {
        label: "console-consumer-read-committed",
        tool: "kafka-console-consumer",
        args: &[
            "--topic",
            TXN_TOPIC,
            "--from-beginning",
            "--isolation-level",
            "read_committed",
            "--max-messages",
            "3",
            "--timeout-ms",
            "60000",
        ],
        masked_columns: &[],
    },
    Tool {
        label: "acls-list",
        tool: "kafka-acls",
        args: &["--list"],
        masked_columns: &[],
    },
];

/// Writes 3 records to partition 0 and 1 to partition 1 of [`TOPIC`], and commits offsets 2
/// and 1 for [`GROUP`] without joining it (a consumer group with no active members, so the
/// tools' tables carry no member ids).
fn produce_and_commit(bootstrap: &str) {
    let p = onceflow_testkit::clients::plain_producer(bootstrap);
    for (partition, v) in [(0, "o1"), (0, "o2"), (0, "o3"), (1, "o4")] {
        send(&p, TOPIC, partition, v);
    }
    flush(&p);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(2))
        .expect("tpl");
    tpl.add_partition_offset(TOPIC, 1, Offset::Offset(1))
        .expect("tpl");
    let deadline = Instant::now() + T;
    // the group coordinator may still be loading on a fresh node: retried, bounded
    while let Err(e) = c.commit(&tpl, CommitMode::Sync) {
        assert!(Instant::now() < deadline, "commit offsets: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// On [`TXN_TOPIC`]: a committed transaction (c1, c2), an aborted one (a1), one left open by
/// a producer dropped without ending it (h1, transaction timeout 10 minutes, so it stays open
/// through the test), then another committed one (c3), which read_committed consumers see
/// only once the open one is aborted.
fn transactions(bootstrap: &str) {
    let committed = txn_producer(bootstrap, TXN_COMMITTED, 60_000);
    committed.begin_transaction().expect("begin");
    send(&committed, TXN_TOPIC, 0, "c1");
    send(&committed, TXN_TOPIC, 0, "c2");
    committed.commit_transaction(T).expect("commit");

    let aborted = txn_producer(bootstrap, TXN_ABORTED, 60_000);
    aborted.begin_transaction().expect("begin");
    send(&aborted, TXN_TOPIC, 0, "a1");
    flush(&aborted);
    aborted.abort_transaction(T).expect("abort");
    drop(aborted);

    let hanging = txn_producer(bootstrap, TXN_HANGING, 600_000);
    hanging.begin_transaction().expect("begin");
    send(&hanging, TXN_TOPIC, 0, "h1");
    flush(&hanging);
    drop(hanging);

    committed.begin_transaction().expect("begin");
    send(&committed, TXN_TOPIC, 0, "c3");
    committed.commit_transaction(T).expect("commit");

    // Kafka writes the markers after answering EndTxn; the tools run once both ended
    // transactions are complete (their markers written), not after a sleep.
    for id in [TXN_COMMITTED, TXN_ABORTED] {
        let deadline = Instant::now() + T;
        loop {
            match describe_transaction(bootstrap, id) {
                Ok((_, _, state)) if state.starts_with("Complete") => break,
                other => assert!(
                    Instant::now() < deadline,
                    "{id} did not complete: {other:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A difference the comparison accepts: lines only the bundled broker printed and lines only
/// Kafka printed (after normalization) in one step's output, with the reason.
struct Expected {
    step: &'static str,
    bundled: &'static [&'static str],
    kafka: &'static [&'static str],
    reason: &'static str,
}

const EXPECTED: &[Expected] = &[
    Expected {
        step: "topics-describe",
        bundled: &["Topic: kt-orders PartitionCount: 2 ReplicationFactor: 1 Configs: segment.bytes=67108864"],
        kafka: &["Topic: kt-orders TopicId: * PartitionCount: 2 ReplicationFactor: 1 Configs: min.insync.replicas=1"],
        reason: "no topic ids in the bundled broker (by design); its segment.bytes default is \
                 reported as a static broker config (open, as in the differential harness), \
                 Kafka's min.insync.replicas as a broker-level setting",
    },
    Expected {
        step: "topics-describe",
        bundled: &[
            "Topic: kt-orders Partition: 0 Leader: N Replicas: N Isr: N Elr: N/A LastKnownElr: N/A",
            "Topic: kt-orders Partition: 1 Leader: N Replicas: N Isr: N Elr: N/A LastKnownElr: N/A",
        ],
        kafka: &[
            "Topic: kt-orders Partition: 0 Leader: N Replicas: N Isr: N Elr: LastKnownElr:",
            "Topic: kt-orders Partition: 1 Leader: N Replicas: N Isr: N Elr: LastKnownElr:",
        ],
        reason: "no DescribeTopicPartitions (API 75) in the bundled broker: the tool falls \
                 back to Metadata, which carries no eligible leader replicas (N/A)",
    },
    Expected {
        step: "transactions-describe-producers-after-abort",
        bundled: &["* 1 0 -1 * None"],
        kafka: &["* 0 0 0 * None"],
        reason: "by design: the bundled broker's WriteTxnMarkers aborts a transaction its \
                 coordinator still runs as a timeout would, fencing the producer (epoch 1) \
                 and writing the markers at the new epoch (last sequence reset); Kafka writes \
                 the marker at the given epoch 0 and its coordinator keeps the transaction \
                 Ongoing until it times out",
    },
    Expected {
        step: "acls-list",
        bundled: &[
            "Error while executing ACL command: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker (--acl-file, --super-user or --authorizer)",
            "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker (--acl-file, --super-user or --authorizer)",
            "Caused by: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker (--acl-file, --super-user or --authorizer)",
        ],
        kafka: &[
            "Error while executing ACL command: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker",
            "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker",
            "Caused by: org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer is configured on the broker",
        ],
        reason: "same error (SECURITY_DISABLED, exit 1); the bundled broker's message adds the \
                 flags that enable its authorizer",
    },
];

/// What one step printed on one broker, normalized.
#[derive(Clone, Debug)]
struct Seen {
    label: &'static str,
    raw: String,
    lines: Vec<String>,
}

/// Runs every step against `bootstrap`; returns the normalized outputs of the tool steps.
fn run_sequence(side: &str, bootstrap: &str) -> Vec<Seen> {
    let mut seen = Vec::new();
    for step in STEPS {
        match step {
            Action(what, f) => {
                let t = Instant::now();
                f(bootstrap);
                eprintln!("[{side}] {what}: {:?}", t.elapsed());
            }
            Tool {
                label,
                tool,
                args,
                masked_columns,
            } => {
                let mut full = vec!["--bootstrap-server", bootstrap];
                full.extend_from_slice(args);
                let t = Instant::now();
                let out = run_tool(tool, &full, TOOL_TIMEOUT)
                    .unwrap_or_else(|e| panic!("[{side}] {label}: {e:#}"));
                eprintln!("[{side}] {label}: {:?}", t.elapsed());
                let raw = format!(
                    "exit {}\n--- stdout\n{}--- stderr\n{}",
                    if out.success { "0" } else { "non-zero" },
                    out.stdout,
                    out.stderr
                );
                let mut lines = vec![format!("exit {}", if out.success { 0 } else { 1 })];
                lines.extend(normalize(&out.stdout, bootstrap, masked_columns));
                lines.extend(
                    normalize(&out.stderr, bootstrap, &[])
                        .into_iter()
                        .map(|l| format!("stderr: {l}")),
                );
                seen.push(Seen { label, raw, lines });
            }
        }
    }
    seen
}

/// Column widths collapse to one space; the broker's address becomes `BOOTSTRAP`; node ids
/// after `Leader:`, `Replicas:`, `Isr:` and the random id after `TopicId:` become `N` and
/// `*`; values in `masked` columns of a table (the line with those headers, and the rows
/// after it with as many fields) become `*`. Java stack frames are left out: they name the
/// tool's code, not the broker's answer (the exception and its message stay).
fn normalize(text: &str, bootstrap: &str, masked: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut mask_at: Option<(usize, Vec<usize>)> = None;
    for line in text.lines() {
        let line = line.replace(bootstrap, "BOOTSTRAP");
        let mut fields: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if fields.is_empty() || fields[0] == "at" || fields[0] == "..." {
            continue;
        }
        let header: Vec<usize> = fields
            .iter()
            .enumerate()
            .filter(|(_, f)| masked.contains(&f.as_str()))
            .map(|(i, _)| i)
            .collect();
        if !header.is_empty() {
            mask_at = Some((fields.len(), header));
        } else if let Some((n, at)) = &mask_at {
            if fields.len() == *n {
                for &i in at {
                    fields[i] = "*".into();
                }
            }
        }
        for i in 1..fields.len() {
            match fields[i - 1].as_str() {
                "Leader:" | "Replicas:" | "Isr:" => fields[i] = "N".into(),
                "TopicId:" => fields[i] = "*".into(),
                _ => {}
            }
        }
        out.push(fields.join(" "));
    }
    out
}

/// Lines of `a` not matched by a line of `b` (as multisets).
fn only_in(a: &[String], b: &[String]) -> Vec<String> {
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for l in b {
        *left.entry(l).or_default() += 1;
    }
    a.iter()
        .filter(|l| match left.get_mut(l.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .cloned()
        .collect()
}

#[test]
fn kafka_tools_answer_alike_on_the_bundled_broker_and_apache_kafka() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let bundled = BrokerProcess::builder(Storage::durable(dir.path().join("bundled")))
        .args(&["--default-partitions", "1"])
        .log_file(dir.path().join("bundled.log"))
        .spawn()
        .expect("bundled broker starts");
    let kafka = KafkaNode::start(
        &dir.path().join("kafka"),
        KafkaOptions {
            properties: vec!["num.partitions=1".into()],
            ..KafkaOptions::default()
        },
    )
    .expect("Apache Kafka starts");
    eprintln!("brokers up after {:?}", started.elapsed());

    // The two sequences are independent: they run side by side.
    let (b_addr, k_addr) = (
        bundled.bootstrap().to_string(),
        kafka.bootstrap().to_string(),
    );
    let (ours, theirs) = std::thread::scope(|s| {
        let b = s.spawn(|| run_sequence("bundled", &b_addr));
        let k = s.spawn(|| run_sequence("kafka", &k_addr));
        (b.join(), k.join())
    });
    let ours = ours.unwrap_or_else(|_| panic!("bundled sequence failed\n{}", bundled.describe()));
    let theirs = theirs.unwrap_or_else(|_| panic!("Kafka sequence failed\n{}", kafka.describe()));

    let mut failures = Vec::new();
    let mut used = vec![false; EXPECTED.len()];
    println!("| step | outcome |\n|---|---|");
    for (b, k) in ours.iter().zip(&theirs) {
        let mut bundled_only = only_in(&b.lines, &k.lines);
        let mut kafka_only = only_in(&k.lines, &b.lines);
        let mut reasons = Vec::new();
        for (i, e) in EXPECTED
            .iter()
            .enumerate()
            .filter(|(_, e)| e.step == b.label)
        {
            let hit_b = e
                .bundled
                .iter()
                .all(|l| bundled_only.iter().any(|x| x == l));
            let hit_k = e.kafka.iter().all(|l| kafka_only.iter().any(|x| x == l));
            if hit_b && hit_k {
                used[i] = true;
                bundled_only.retain(|x| !e.bundled.contains(&x.as_str()));
                kafka_only.retain(|x| !e.kafka.contains(&x.as_str()));
                reasons.push(e.reason);
            }
        }
        let outcome = if !bundled_only.is_empty() || !kafka_only.is_empty() {
            failures.push(format!(
                "{}: unexplained difference\n  bundled only: {bundled_only:#?}\n  kafka only: \
                 {kafka_only:#?}\n--- bundled broker printed ---\n{}\n--- Apache Kafka \
                 printed ---\n{}",
                b.label, b.raw, k.raw
            ));
            "UNEXPLAINED"
        } else if reasons.is_empty() {
            "same"
        } else {
            "expected differences"
        };
        println!("| {} | {outcome} |", b.label);
        for l in &b.lines {
            println!("|   | `{l}` |");
        }
        for r in reasons {
            println!("|   | {r} |");
        }
    }
    for (e, used) in EXPECTED.iter().zip(used) {
        if !used {
            failures.push(format!(
                "{}: the expected difference is gone (update EXPECTED and docs/TESTING.md): {}",
                e.step, e.reason
            ));
        }
    }
    // Beyond equality: what each side must show for the transactions.
    for (side, seen) in [("bundled", &ours), ("kafka", &theirs)] {
        let lines = |label: &str| {
            seen.iter()
                .find(|s| s.label == label)
                .map(|s| s.lines.clone())
                .unwrap_or_default()
        };
        let open_at = |label: &str| {
            lines(label)
                .iter()
                .filter(|l| l.ends_with(&format!(" {HANGING_OFFSET}")))
                .count()
        };
        if open_at("transactions-describe-producers") != 1
            || open_at("transactions-describe-producers-after-abort") != 0
        {
            failures.push(format!(
                "{side}: the hanging transaction was not open at offset \
                 {HANGING_OFFSET} before the abort, or still open after it"
            ));
        }
        let consumed = lines("console-consumer-read-committed");
        if consumed[..]
            != [
                "exit 0",
                "c1",
                "c2",
                "c3",
                "stderr: Processed a total of 3 messages",
            ]
        {
            failures.push(format!(
                "{side}: read_committed console consumer printed {consumed:?}, not the \
                 committed c1, c2, c3"
            ));
        }
    }
    println!(
        "{} tool steps per broker in {:?}",
        ours.len(),
        started.elapsed()
    );
    drop(bundled);
    drop(kafka);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
