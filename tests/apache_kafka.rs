//! The end-to-end and crash tests against Apache Kafka 4.4: the same test files as the
//! bundled broker's binaries, compiled once more into this binary, whose name makes the test
//! kit start Apache Kafka (one KRaft node through `scripts/apache-kafka.sh`, see
//! `onceflow_testkit::test_broker`) instead of the bundled broker. A failure here names
//! itself: `apache_kafka::eos_kill9::...` is the kill -9 run on Kafka.
//!
//! Every scenario runs under `transaction.version=2` (transactions v2, KIP-890, the 4.x
//! default); the two kill -9 crash tests and the producer-epoch exhaustion run under
//! `transaction.version=0` as well (a 3.x cluster's rules), in [`transaction_version_0`].
//!
//! Run it: `cargo test --test apache_kafka` (Java 17 and Maven; the first run resolves Kafka's
//! jars into the local Maven repository). Any other end-to-end binary runs against Kafka with
//! `ONCEFLOW_TEST_BROKER=apache-kafka`.

#[path = "eos_broker_kill.rs"]
mod eos_broker_kill;
#[path = "eos_epoch_overflow.rs"]
mod eos_epoch_overflow;
#[path = "eos_fencing.rs"]
mod eos_fencing;
#[path = "eos_kill9.rs"]
mod eos_kill9;
#[path = "eos_scale_out.rs"]
mod eos_scale_out;
#[path = "eos_security.rs"]
mod eos_security;
#[path = "ops_transactions.rs"]
mod ops_transactions;

/// The kill -9 crash tests on a cluster formatted with `transaction.version=0`: no epoch bump
/// at commit, no server-side partition verification, as on Kafka 3.x.
mod transaction_version_0 {
    use onceflow_testkit::test_broker::with_transaction_version;

    use super::eos_epoch_overflow::epoch_overflow_run;
    use super::eos_kill9::exact_kill_run;

    #[test]
    fn two_phase_commit_recovers_across_producer_epoch_exhaustion() {
        with_transaction_version(0, || epoch_overflow_run("eos_epoch_overflow_2pc_tv0"));
    }

    #[test]
    fn two_phase_commit_survives_random_sigkills_exactly_once() {
        with_transaction_version(0, || {
            exact_kill_run("eos_kill9_2pc_tv0", "two-phase-commit")
        });
    }

    #[test]
    fn transactional_offsets_survive_random_sigkills_exactly_once() {
        with_transaction_version(0, || {
            exact_kill_run("eos_kill9_txn_offsets_tv0", "transactional-offsets")
        });
    }
}
