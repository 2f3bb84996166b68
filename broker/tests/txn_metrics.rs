//! Transaction metrics on the Prometheus endpoint: open transactions, duration, aborts by
//! cause, LSO lag.

use std::io::{Read, Write};
use std::time::Duration;

use onceflow_testkit::clients::*;
use onceflow_testkit::inproc::start_with;
use rdkafka::producer::Producer;

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_metrics_are_exported() {
    let broker = start_with(onceflow_broker::BrokerConfig {
        metrics_listen: Some("127.0.0.1:0".parse().expect("addr")),
        ..onceflow_broker::BrokerConfig::default()
    })
    .await;
    let bs = broker.bootstrap_servers();
    let metrics_addr = broker.metrics_addr().expect("metrics endpoint");
    let (open_text, done_text) = tokio::task::spawn_blocking(move || {
        let p = txn_producer(&bs, "tx-metrics", 30_000);
        p.begin_transaction().expect("begin");
        send(&p, "met", 0, "a");
        flush(&p);
        p.commit_transaction(T).expect("commit");
        p.begin_transaction().expect("begin");
        send(&p, "met", 0, "b");
        flush(&p);
        // The LSO lag is published every second while the transaction is open.
        let rc = consumer(&bs, true, &[("met", 0)]);
        let _ = poll_for(&rc, Duration::from_millis(1500));
        let open_text = scrape(metrics_addr);
        p.abort_transaction(T).expect("abort");
        (open_text, scrape(metrics_addr))
    })
    .await
    .expect("client thread");
    let line = |text: &str, prefix: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_string)
    };
    assert_eq!(
        line(&open_text, "onceflow_broker_open_transactions ").as_deref(),
        Some("onceflow_broker_open_transactions 1"),
        "{open_text}"
    );
    let lag = line(&open_text, "onceflow_broker_lso_lag{").expect("lso lag");
    assert!(lag.ends_with(" 1"), "{lag}");
    assert!(
        line(
            &done_text,
            "onceflow_broker_transaction_aborts_total{cause=\"client\"} 1"
        )
        .is_some(),
        "{done_text}"
    );
    assert!(
        done_text.contains("onceflow_broker_transaction_duration_seconds"),
        "{done_text}"
    );
    // durations are histograms (buckets aggregate across brokers), not summaries
    assert!(
        done_text.contains("onceflow_broker_transaction_duration_seconds_bucket{")
            && !done_text.contains("quantile=\""),
        "{done_text}"
    );
    assert_eq!(
        line(&done_text, "onceflow_broker_open_transactions ").as_deref(),
        Some("onceflow_broker_open_transactions 0")
    );
    broker.shutdown().await;
}
