//! A prepared transaction whose producer process was killed is committed by EndTxn sent from
//! a separate raw client holding its transactional id, producer id and epoch (learnt from
//! librdkafka's statistics `eos` object), as a two-phase-commit sink's recovery does.

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::*;
use onceflow_testkit::inproc::start_broker;
use onceflow_testkit::raw;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::statistics::Statistics;

const CHILD_ENV: &str = "ONCEFLOW_TXN_CHILD_BOOTSTRAP";

/// Keeps the latest (producer id, epoch) librdkafka reports.
#[derive(Clone, Default)]
struct EosStats(Arc<Mutex<Option<(i64, i64)>>>);

impl ClientContext for EosStats {
    fn stats(&self, statistics: Statistics) {
        if let Some(eos) = statistics.eos {
            if eos.producer_id >= 0 {
                *self.0.lock().expect("lock") = Some((eos.producer_id, eos.producer_epoch));
            }
        }
    }
}
impl ProducerContext for EosStats {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Child role (run by the test below, never on its own): writes a transaction's data, prints
/// `PREPARED <transactional id> <producer id> <epoch>` and waits to be killed.
#[test]
#[ignore = "child process role of resume_prepared_transaction_from_another_client"]
fn child_prepared_producer() {
    let Ok(bootstrap) = std::env::var(CHILD_ENV) else {
        return;
    };
    let stats = EosStats::default();
    let p: BaseProducer<EosStats> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "tx-resume")
        .set("transaction.timeout.ms", "60000")
        .set("statistics.interval.ms", "100")
        .create_with_context(stats.clone())
        .expect("producer");
    p.init_transactions(T).expect("init");
    p.begin_transaction().expect("begin");
    for i in 0..5 {
        p.send(
            rdkafka::producer::BaseRecord::<str, str>::to("resume")
                .partition(0)
                .payload(&format!("pre-{i}")),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    }
    p.flush(T).expect("flush");
    let deadline = Instant::now() + T;
    let (pid, epoch) = loop {
        p.poll(Duration::from_millis(50));
        if let Some(v) = *stats.0.lock().expect("lock") {
            break v;
        }
        assert!(Instant::now() < deadline, "no eos statistics");
    };
    println!("PREPARED tx-resume {pid} {epoch}");
    std::io::stdout().flush().expect("flush stdout");
    // Wait to be killed (bounded so a lost parent cannot leave it running).
    std::thread::sleep(Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resume_prepared_transaction_from_another_client() {
    let broker = start_broker(1).await;
    let bs = broker.bootstrap_servers();
    let (before, code, retry, after) = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "--exact",
            "child_prepared_producer",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, &bs);
        let mut child = Proc::spawn_quiet("child producer", cmd);
        let line = child
            .wait_line(Duration::from_secs(120), |l| l.starts_with("PREPARED "))
            .expect("the child printed its PREPARED line in time");
        child.kill9();
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (txn_id, pid, epoch): (&str, i64, i16) = (
            parts[1],
            parts[2].parse().expect("pid"),
            parts[3].parse().expect("epoch"),
        );
        let rc = consumer(&bs, true, &[("resume", 0)]);
        let before = poll_for(&rc, Duration::from_millis(1500));
        // A wrong epoch is refused; the right triple commits; a retry answers success.
        assert_ne!(
            raw::end_txn(&bs, txn_id, pid, epoch + 1, true).expect("EndTxn"),
            0
        );
        let code = raw::end_txn(&bs, txn_id, pid, epoch, true).expect("EndTxn");
        let retry = raw::end_txn(&bs, txn_id, pid, epoch, true).expect("EndTxn");
        let after = poll_records(&rc, 5, Duration::from_millis(300));
        (before, code, retry, after)
    })
    .await
    .expect("client thread");
    assert!(
        before.is_empty(),
        "prepared data visible before commit: {before:?}"
    );
    assert_eq!(code, 0, "EndTxn from a separate client");
    assert_eq!(retry, 0, "retried EndTxn after completion");
    assert_eq!(
        values(&after),
        (0..5).map(|i| format!("pre-{i}")).collect::<Vec<_>>()
    );
    broker.shutdown().await;
}
