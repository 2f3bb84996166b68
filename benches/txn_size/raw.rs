//! The baseline a user writes by hand: one raw rdkafka transactional producer, no framework.
//! Delivery reports are drained by polling (`in_flight_count() == 0`) before every
//! `commit_transaction`, because rust-rdkafka's flush inside the commit waits in 100 ms steps.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::common::{committed_reader, create_topics, now_us, p50_p99, watch, Point};

const T: Duration = Duration::from_secs(30);

/// Runs transactions of `size` records of `record_bytes` for about `budget` (at least 3
/// transactions), with a read_committed consumer timing each record's visibility.
pub fn run(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    storage: &str,
    tag: &str,
    size: usize,
    record_bytes: usize,
    budget: Duration,
) -> anyhow::Result<Point> {
    let topic = format!("raw-{tag}");
    create_topics(rt, brokers, &[&topic], 1)?;
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", format!("raw-{tag}"))
        .set("linger.ms", "1")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()?;
    p.init_transactions(T)?;
    let payload = vec![b'x'; record_bytes];
    // warm-up transaction (coordinator lookup, partition metadata), not measured and not
    // counted by the watcher (its key is empty)
    p.begin_transaction()?;
    p.send(
        BaseRecord::<[u8], [u8]>::to(&topic)
            .partition(0)
            .payload(&payload),
    )
    .map_err(|(e, _)| e)?;
    while p.in_flight_count() > 0 {
        p.poll(Duration::from_millis(1));
    }
    p.commit_transaction(T)?;

    // watcher: visibility latency of every measured record (key = send time in us)
    let (total_tx, total_rx) = mpsc::channel::<u64>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (brokers2, topic2) = (brokers.to_string(), topic.clone());
    let watcher = std::thread::spawn(move || -> anyhow::Result<(Vec<f64>, u64)> {
        let c = committed_reader(&brokers2, &topic2, 1)?;
        let mut lat = Vec::new();
        let mut last_visible = 0u64;
        let mut expected: Option<u64> = None;
        let hard = Instant::now() + Duration::from_secs(600);
        // ready once the warm-up record (no key) is visible: the consumer is positioned
        watch(&c, hard, |m, _| m.is_some_and(|m| m.key().is_none()))?;
        let _ = ready_tx.send(());
        watch(&c, hard, |m, t| {
            if let Some(k) = m.and_then(|m| m.key()).filter(|k| k.len() == 8) {
                let sent = u64::from_be_bytes(k.try_into().unwrap_or([0; 8]));
                lat.push(t.saturating_sub(sent) as f64 / 1000.0);
                last_visible = t;
            }
            if expected.is_none() {
                expected = total_rx.try_recv().ok();
            }
            expected.is_some_and(|e| lat.len() as u64 >= e)
        })?;
        Ok((lat, last_visible))
    });

    ready_rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| {
            anyhow::anyhow!("the read_committed watcher did not see the warm-up record")
        })?;
    let start_us = now_us();
    let start = Instant::now();
    let mut commits = Vec::new();
    let mut records = 0u64;
    while commits.len() < 3 || start.elapsed() < budget {
        p.begin_transaction()?;
        for _ in 0..size {
            let key = now_us().to_be_bytes();
            let mut rec = BaseRecord::to(&topic)
                .partition(0)
                .key(&key[..])
                .payload(&payload[..]);
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        p.poll(Duration::from_millis(1));
                        rec = r;
                    }
                }
            }
        }
        // the fast thing: serve delivery reports until nothing is in flight, then commit
        while p.in_flight_count() > 0 {
            p.poll(Duration::from_millis(1));
        }
        let c = Instant::now();
        p.commit_transaction(T)?;
        commits.push(c.elapsed().as_secs_f64() * 1000.0);
        records += size as u64;
        if commits.len() >= 100_000 {
            break;
        }
    }
    let _ = total_tx.send(records);
    let (lat, last_visible) = watcher
        .join()
        .map_err(|_| anyhow::anyhow!("watcher panicked"))??;
    if (lat.len() as u64) < records {
        anyhow::bail!("only {} of {records} records became visible", lat.len());
    }
    let secs = (last_visible.saturating_sub(start_us) as f64 / 1e6).max(1e-6);
    Ok(Point {
        storage: storage.to_string(),
        record_bytes,
        mode: "raw-txn".into(),
        interval_ms: None,
        records_per_txn: size as f64,
        records_per_s: records as f64 / secs,
        commit_ms: p50_p99(commits),
        e2e_ms: p50_p99(lat),
        records,
    })
}
