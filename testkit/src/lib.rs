//! The test kit of onceflow's integration tests: one place for the helpers every broker,
//! connector and end-to-end test uses, so that a fault test is written once.
//!
//! Modules by concern:
//! - [`bins`]: the broker and example binaries (located or built once, pinned against
//!   concurrent rebuilds), the workspace root, programs on PATH.
//! - [`child`]: a child process with its stdout captured line by line, bounded waits for a
//!   line, SIGKILL / SIGTERM / SIGINT / SIGSTOP; external commands bounded in time.
//! - [`broker_process`]: the `onceflow-broker` binary as a child process (port 0, the
//!   `listening on` line, kill -9, SIGTERM, restart on the same data dir and port, its log).
//! - [`apache_kafka`]: Apache Kafka 4.4 as a child process (one KRaft node through
//!   `scripts/apache-kafka.sh`), kill -9, restart on the same ports, Kafka's command-line tools.
//! - [`test_broker`]: the broker under test, bundled or Apache Kafka
//!   (`ONCEFLOW_TEST_BROKER`), behind one type that the end-to-end tests use.
//! - [`inproc`]: the broker in-process, on the test's runtime or on a private one.
//! - [`raw`]: a raw Kafka-protocol client over a blocking socket (kafka-protocol crate).
//! - [`differential`]: the same raw request sequences against the bundled broker and Apache
//!   Kafka, responses normalized and compared field by field (`tests/differential.rs`).
//! - [`records`]: deterministic test records, an idempotent producer that records every
//!   delivery report, a reader that checks every record detail.
//! - [`clients`]: rdkafka transactional and plain producers, assigned consumers with an
//!   isolation level, readers of a topic up to its end (read_committed or not), topic creation.
//! - [`jobs`]: child-job runners: example job binaries, test binaries re-executed as a job
//!   reporting `EVENT` lines, kills at reported events.
//! - [`eos`]: the exactly-once harness: input dataset, record-by-record output checker, the
//!   example job `exactly_once_etl` run to completion across faults.
//! - [`http`]: GET on a job's `/metrics`, `/healthz` and `/readyz`; a free loopback port.
//! - [`proxy`]: a TCP proxy that cuts connections or partitions the network.
//! - [`checkpoints`]: what a job's checkpoint directory says a restart will do.
//! - [`python`]: the kafka-python client runner.
//!
//! Every wait is bounded against a stuck process; none decides a verdict by timing.

pub mod apache_kafka;
pub mod bins;
pub mod broker_process;
pub mod checkpoints;
pub mod child;
pub mod clients;
pub mod differential;
pub mod eos;
pub mod http;
pub mod inproc;
pub mod jobs;
pub mod proxy;
pub mod python;
pub mod raw;
pub mod records;
pub mod security;
pub mod test_broker;
