//! The baseline a user writes by hand: raw rdkafka transactional producers, no framework, as
//! many as the pipeline has sink subtasks, each on its own thread and partition. Delivery
//! reports are drained by polling (`in_flight_count() == 0`) before every
//! `commit_transaction`, because rust-rdkafka's flush inside the commit waits in 100 ms steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::common::{
    committed_reader, create_topics, delete_topics, now_us, p50_p99, watch, Point,
};

const T: Duration = Duration::from_secs(30);

/// What one raw point runs.
pub struct Spec<'a> {
    /// Bootstrap servers.
    pub brokers: &'a str,
    /// Storage label for the table.
    pub storage: &'a str,
    /// Unique name part for the topic and transactional ids.
    pub tag: &'a str,
    /// Records per transaction.
    pub size: usize,
    /// Value bytes per record.
    pub record_bytes: usize,
    /// Producers (threads, partitions).
    pub producers: usize,
    /// Time to keep committing (at least 3 transactions per producer).
    pub budget: Duration,
    /// Repetition index.
    pub rep: usize,
}

fn send_retry(p: &BaseProducer, mut rec: BaseRecord<'_, [u8], [u8]>) -> anyhow::Result<()> {
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((rdkafka::error::KafkaError::MessageProduction(_), r)) => {
                p.poll(Duration::from_millis(1));
                rec = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

fn drain(p: &BaseProducer) {
    while p.in_flight_count() > 0 {
        p.poll(Duration::from_millis(1));
    }
}

/// One producer thread: warm-up transaction, then transactions of `size` records on
/// `partition` until `budget` passed (and at least 3). Returns (records, commit ms).
fn produce(
    s: &Spec<'_>,
    topic: &str,
    partition: i32,
    start: &Barrier,
    stop: &AtomicBool,
) -> anyhow::Result<(u64, Vec<f64>)> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("transactional.id", format!("raw-{}-{partition}", s.tag))
        .set("linger.ms", "1")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()?;
    let warm = (|| -> anyhow::Result<()> {
        p.init_transactions(T)?;
        // warm-up transaction (coordinator lookup, partition metadata), not measured and not
        // counted by the watcher (its key is empty)
        p.begin_transaction()?;
        let payload = vec![b'x'; s.record_bytes];
        send_retry(
            &p,
            BaseRecord::to(topic)
                .partition(partition)
                .payload(&payload[..]),
        )?;
        drain(&p);
        p.commit_transaction(T)?;
        Ok(())
    })();
    // every thread passes both barriers, also after an error, or the others wait forever
    if warm.is_err() {
        stop.store(true, Ordering::SeqCst);
    }
    start.wait();
    start.wait();
    warm?;
    if stop.load(Ordering::SeqCst) {
        anyhow::bail!("another producer failed to start");
    }
    let payload = vec![b'x'; s.record_bytes];
    let t0 = Instant::now();
    let mut commits = Vec::new();
    let mut records = 0u64;
    while commits.len() < 3 || t0.elapsed() < s.budget {
        p.begin_transaction()?;
        for _ in 0..s.size {
            let key = now_us().to_be_bytes();
            send_retry(
                &p,
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(&key[..])
                    .payload(&payload[..]),
            )?;
        }
        // the fast thing: serve delivery reports until nothing is in flight, then commit
        drain(&p);
        let c = Instant::now();
        p.commit_transaction(T)?;
        commits.push(c.elapsed().as_secs_f64() * 1000.0);
        records += s.size as u64;
        if commits.len() >= 100_000 {
            break;
        }
    }
    Ok((records, commits))
}

/// Runs `producers` threads of transactions of `size` records for about `budget`, with a
/// read_committed consumer timing each record's visibility.
pub fn run(rt: &tokio::runtime::Runtime, s: &Spec<'_>) -> anyhow::Result<Point> {
    let topic = format!("raw-{}", s.tag);
    let parts = s.producers.max(1) as i32;
    create_topics(rt, s.brokers, &[&topic], parts)?;
    let r = measure(s, &topic, parts);
    delete_topics(rt, s.brokers, &[&topic]);
    r
}

fn measure(s: &Spec<'_>, topic: &str, parts: i32) -> anyhow::Result<Point> {
    // watcher: visibility latency of every measured record (key = send time in us)
    let (total_tx, total_rx) = mpsc::channel::<u64>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (brokers2, topic2) = (s.brokers.to_string(), topic.to_string());
    let watcher = std::thread::spawn(move || -> anyhow::Result<(Vec<f64>, u64)> {
        let c = committed_reader(&brokers2, &topic2, parts)?;
        let mut lat = Vec::new();
        let mut last_visible = 0u64;
        let mut expected: Option<u64> = None;
        let mut warm = 0;
        let hard = Instant::now() + Duration::from_secs(600);
        // ready once every warm-up record (no key) is visible: the consumer is positioned
        watch(&c, hard, |m, _| {
            if m.is_some_and(|m| m.key().is_none()) {
                warm += 1;
            }
            warm >= parts
        })?;
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

    let start = Arc::new(Barrier::new(parts as usize + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..parts)
        .map(|part| {
            let (start, stop) = (start.clone(), stop.clone());
            let (brokers, storage, tag, topic) = (
                s.brokers.to_string(),
                s.storage.to_string(),
                s.tag.to_string(),
                topic.to_string(),
            );
            let (size, record_bytes, budget) = (s.size, s.record_bytes, s.budget);
            std::thread::spawn(move || {
                let spec = Spec {
                    brokers: &brokers,
                    storage: &storage,
                    tag: &tag,
                    size,
                    record_bytes,
                    producers: 0,
                    budget,
                    rep: 0,
                };
                produce(&spec, &topic, part, &start, &stop)
            })
        })
        .collect();
    // every producer initialised and committed its warm-up transaction (or failed)
    start.wait();
    let ready =
        !stop.load(Ordering::SeqCst) && ready_rx.recv_timeout(Duration::from_secs(60)).is_ok();
    if !ready {
        stop.store(true, Ordering::SeqCst);
    }
    let start_us = now_us();
    start.wait();
    let mut records = 0u64;
    let mut commits = Vec::new();
    let mut first_err = None;
    for t in threads {
        match t.join() {
            Ok(Ok((n, c))) => {
                records += n;
                commits.extend(c);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow::anyhow!("a producer thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if !ready {
        anyhow::bail!("the read_committed watcher did not see the warm-up records");
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
        storage: s.storage.to_string(),
        record_bytes: s.record_bytes,
        mode: "raw-txn".into(),
        interval_ms: None,
        records_per_txn: s.size as f64,
        records_per_s: records as f64 / secs,
        commit_ms: p50_p99(commits),
        e2e_ms: p50_p99(lat),
        records,
        startup_s: f64::NAN,
        run_s: secs,
        steady_s: secs,
        cpu_s_per_m: f64::NAN,
        rep: s.rep,
    })
}
