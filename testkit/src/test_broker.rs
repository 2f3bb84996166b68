//! The broker under test: the bundled `onceflow-broker` or Apache Kafka 4.4, chosen by one
//! switch, behind one type, so that every end-to-end and crash test file runs against either.
//!
//! The switch is `ONCEFLOW_TEST_BROKER=bundled|apache-kafka`. Without it a test binary whose
//! name starts with `apache_kafka` (the `tests/apache_kafka.rs` binary, which runs the
//! end-to-end files against Kafka in CI) uses Apache Kafka, and every other one the bundled
//! broker. Apache Kafka's `transaction.version` is 2 (the 4.x default) unless the environment
//! says otherwise (`ONCEFLOW_KAFKA_TRANSACTION_VERSION=0|2`) or a scenario runs inside
//! [`with_transaction_version`].

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::apache_kafka::{KafkaNode, KafkaOptions, KAFKA_VERSION};
use crate::broker_process::{BrokerProcess, Storage};

/// Which broker a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerKind {
    /// The bundled `onceflow-broker` binary.
    Bundled,
    /// Apache Kafka 4.4 through `scripts/apache-kafka.sh`.
    ApacheKafka,
}

impl std::fmt::Display for BrokerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrokerKind::Bundled => f.write_str("the bundled broker"),
            BrokerKind::ApacheKafka => write!(f, "Apache Kafka {KAFKA_VERSION}"),
        }
    }
}

/// The broker of this test process (see the module docs). Panics on an unknown value of
/// `ONCEFLOW_TEST_BROKER`, so that a typo does not silently test the other broker.
pub fn broker_kind() -> BrokerKind {
    match std::env::var("ONCEFLOW_TEST_BROKER").ok().as_deref() {
        Some("bundled") => BrokerKind::Bundled,
        Some("apache-kafka") | Some("kafka") => BrokerKind::ApacheKafka,
        Some(other) => panic!(
            "ONCEFLOW_TEST_BROKER={other:?}: expected `bundled` or `apache-kafka` (docs/TESTING.md)"
        ),
        None => {
            let exe = std::env::current_exe().ok();
            let name = exe
                .as_deref()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with("apache_kafka") {
                BrokerKind::ApacheKafka
            } else {
                BrokerKind::Bundled
            }
        }
    }
}

/// True if this test process runs against Apache Kafka.
pub fn on_apache_kafka() -> bool {
    broker_kind() == BrokerKind::ApacheKafka
}

thread_local! {
    static TRANSACTION_VERSION: Cell<Option<u8>> = const { Cell::new(None) };
}

/// Runs `f` with Apache Kafka nodes started on this thread formatted with
/// `transaction.version=version` (0: the 3.x rules; 2: transactions v2). The bundled broker
/// ignores it.
pub fn with_transaction_version<R>(version: u8, f: impl FnOnce() -> R) -> R {
    let before = TRANSACTION_VERSION.with(|v| v.replace(Some(version)));
    struct Restore(Option<u8>);
    impl Drop for Restore {
        fn drop(&mut self) {
            TRANSACTION_VERSION.with(|v| v.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// The `transaction.version` an Apache Kafka node started now gets.
pub fn transaction_version() -> u8 {
    TRANSACTION_VERSION.with(Cell::get).unwrap_or_else(|| {
        match std::env::var("ONCEFLOW_KAFKA_TRANSACTION_VERSION")
            .ok()
            .as_deref()
        {
            None | Some("") | Some("2") => 2,
            Some("0") => 0,
            Some("1") => 1,
            Some(other) => {
                panic!("ONCEFLOW_KAFKA_TRANSACTION_VERSION={other:?}: expected 0, 1 or 2")
            }
        }
    })
}

/// A running broker of either kind; killed on drop.
pub enum TestBroker {
    /// The bundled broker.
    Bundled(BrokerProcess),
    /// Apache Kafka.
    ApacheKafka(KafkaNode),
}

impl TestBroker {
    /// Starts the broker of [`broker_kind`] with its data in `dir` (the bundled broker: a
    /// durable `dir/broker-data` with 4 partitions per auto-created topic; Apache Kafka: a
    /// node in `dir/apache-kafka`, likewise 4). `bundled_flags` are the bundled broker's
    /// flags; the ones Kafka has a setting for are translated (`--advertised-listener ADDR`,
    /// `--max-transaction-timeout-ms N`, `--default-partitions N`); any other panics, naming
    /// the flag, since the test would not test what it says on Kafka.
    pub fn start(dir: &Path, bundled_flags: &[&str]) -> TestBroker {
        match broker_kind() {
            BrokerKind::Bundled => TestBroker::Bundled(bundled(dir, bundled_flags)),
            BrokerKind::ApacheKafka => {
                let options = KafkaOptions {
                    transaction_version: transaction_version(),
                    properties: kafka_properties(bundled_flags).unwrap_or_else(|e| panic!("{e:#}")),
                    ..KafkaOptions::default()
                };
                let node = KafkaNode::start(&dir.join("apache-kafka"), options)
                    .unwrap_or_else(|e| panic!("start Apache Kafka: {e:#}"));
                eprintln!(
                    "[broker] Apache Kafka {KAFKA_VERSION} at {} (transaction.version={})",
                    node.bootstrap(),
                    transaction_version()
                );
                TestBroker::ApacheKafka(node)
            }
        }
    }

    /// Which broker this is.
    pub fn kind(&self) -> BrokerKind {
        match self {
            TestBroker::Bundled(_) => BrokerKind::Bundled,
            TestBroker::ApacheKafka(_) => BrokerKind::ApacheKafka,
        }
    }

    /// `127.0.0.1:PORT` of the client listener.
    pub fn bootstrap(&self) -> &str {
        match self {
            TestBroker::Bundled(b) => b.bootstrap(),
            TestBroker::ApacheKafka(k) => k.bootstrap(),
        }
    }

    /// The bundled broker, for tests of its own features.
    pub fn bundled(&self) -> Option<&BrokerProcess> {
        match self {
            TestBroker::Bundled(b) => Some(b),
            TestBroker::ApacheKafka(_) => None,
        }
    }

    /// The Apache Kafka node, for its command-line tools.
    pub fn apache_kafka(&self) -> Option<&KafkaNode> {
        match self {
            TestBroker::Bundled(_) => None,
            TestBroker::ApacheKafka(k) => Some(k),
        }
    }

    /// The broker's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        match self {
            TestBroker::Bundled(b) => b.pid(),
            TestBroker::ApacheKafka(k) => k.pid(),
        }
    }

    /// True while the broker process has not exited.
    pub fn is_alive(&mut self) -> bool {
        match self {
            TestBroker::Bundled(b) => b.is_alive(),
            TestBroker::ApacheKafka(k) => k.is_alive(),
        }
    }

    /// kill -9 of the broker process. Returns true if it was running.
    pub fn kill9(&mut self) -> Result<bool> {
        match self {
            TestBroker::Bundled(b) => b.kill9(),
            TestBroker::ApacheKafka(k) => Ok(k.kill9()),
        }
    }

    /// SIGTERM and a wait of up to `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        match self {
            TestBroker::Bundled(b) => b.terminate(timeout),
            TestBroker::ApacheKafka(k) => k.terminate(timeout),
        }
    }

    /// Starts the broker again on the same data and the same port (kill -9 first if it runs),
    /// so that clients keep their bootstrap address; returns once it serves.
    pub fn restart_same_port(&mut self) -> Result<()> {
        match self {
            TestBroker::Bundled(b) => b.restart_same_port(),
            TestBroker::ApacheKafka(k) => k.restart_same_port(),
        }
    }

    /// The broker's log, for assertion messages.
    pub fn describe(&self) -> String {
        match self {
            TestBroker::Bundled(b) => b.describe(),
            TestBroker::ApacheKafka(k) => k.describe(),
        }
    }
}

/// The bundled broker of a scenario (see [`TestBroker::start`]).
fn bundled(dir: &Path, flags: &[&str]) -> BrokerProcess {
    let data_dir = dir.join("broker-data");
    std::fs::create_dir_all(&data_dir).expect("broker data dir");
    BrokerProcess::builder(Storage::durable(data_dir))
        .args(&["--default-partitions", "4"])
        .args(flags)
        .rust_log(&std::env::var("ONCEFLOW_EOS_BROKER_LOG").unwrap_or_else(|_| "warn".into()))
        .log_file(dir.join("broker.stderr.log"))
        .spawn()
        .expect("broker starts")
}

/// Kafka `server.properties` lines for the bundled broker's `flags`.
pub fn kafka_properties(flags: &[&str]) -> Result<Vec<String>> {
    let mut props = Vec::new();
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .map(|v| v.to_string())
                .ok_or_else(|| anyhow::anyhow!("the bundled broker flag {flag} needs a value"))
        };
        match *flag {
            "--advertised-listener" => {
                props.push(format!("advertised.listeners=CLIENT://{}", value()?))
            }
            "--max-transaction-timeout-ms" => {
                props.push(format!("transaction.max.timeout.ms={}", value()?))
            }
            "--default-partitions" => props.push(format!("num.partitions={}", value()?)),
            other => bail!(
                "the bundled broker flag {other} has no Apache Kafka translation in the test \
                 kit (testkit/src/test_broker.rs): run this test with ONCEFLOW_TEST_BROKER=bundled"
            ),
        }
    }
    Ok(props)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_flags_translate_to_kafka_properties() {
        let props = kafka_properties(&[
            "--advertised-listener",
            "127.0.0.1:9999",
            "--max-transaction-timeout-ms",
            "60000",
        ])
        .unwrap();
        assert_eq!(
            props,
            [
                "advertised.listeners=CLIENT://127.0.0.1:9999",
                "transaction.max.timeout.ms=60000"
            ]
        );
        let err = kafka_properties(&["--listener", "SASL_SSL://127.0.0.1:0"]).unwrap_err();
        assert!(err.to_string().contains("--listener"), "{err}");
        assert!(kafka_properties(&["--default-partitions"]).is_err());
    }

    #[test]
    fn transaction_version_override_is_scoped() {
        let outside = transaction_version();
        assert_eq!(with_transaction_version(0, transaction_version), 0);
        assert_eq!(transaction_version(), outside);
    }
}
