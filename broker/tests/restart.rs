//! Durability across kill -9: the broker binary runs as a child process on a temporary data dir
//! with `--fsync every-batch`; an idempotent rdkafka producer writes while the test SIGKILLs the
//! broker at random moments and restarts it on the same dir and port. Every record whose
//! delivery report said "delivered at offset O" must be there at offset O afterwards, once.
//! A second test appends torn/garbage tails to the last segment file between runs: recovery must
//! drop them, never serve them, and keep accepting writes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::records::{
    idempotent_producer_with, produce_acked, read_all, send_all, Acks, TestRecord,
};
use rand::Rng;
use rdkafka::producer::Producer;

/// Checks the log read back against the delivery reports, record by record.
fn verify(
    read: &[onceflow_testkit::records::ReadRecord],
    records: &[TestRecord],
    acks: &Acks,
) -> Result<()> {
    let mut at: HashMap<(i32, i64), &onceflow_testkit::records::ReadRecord> = HashMap::new();
    let mut by_key: HashMap<&[u8], Vec<(i32, i64)>> = HashMap::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for r in read {
        let expected = next.entry(r.partition).or_insert(0);
        ensure!(
            r.offset == *expected,
            "partition {} offsets not dense: got {} expected {}",
            r.partition,
            r.offset,
            expected
        );
        *expected += 1;
        at.insert((r.partition, r.offset), r);
        by_key
            .entry(&r.key)
            .or_default()
            .push((r.partition, r.offset));
    }
    let index_of_key: HashMap<&[u8], usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.key.as_slice(), i))
        .collect();
    // Everything in the log is one of ours, intact, and present once.
    for r in read {
        let Some(&i) = index_of_key.get(r.key.as_slice()) else {
            bail!(
                "unknown record in log at {}/{}: key {:?}",
                r.partition,
                r.offset,
                String::from_utf8_lossy(&r.key)
            );
        };
        ensure!(
            r.matches(&records[i]),
            "record at {}/{} differs from record {i} as sent: {r:?}",
            r.partition,
            r.offset
        );
        let places = &by_key[r.key.as_slice()];
        ensure!(
            places.len() == 1,
            "record {i} is in the log {} times, at {places:?} (duplicate)",
            places.len()
        );
    }
    // Every acknowledged record is at its acknowledged offset.
    let delivered = acks.delivered.lock().unwrap();
    let mut missing = Vec::new();
    let mut without_offset = 0;
    for (&i, &(p, o)) in delivered.iter() {
        if o < 0 {
            // Acknowledged without an offset (a resend answered DUPLICATE_SEQUENCE_NUMBER):
            // it must be in the log, once, in its partition.
            without_offset += 1;
            match by_key.get(records[i].key.as_slice()) {
                Some(places) if places.len() == 1 && places[0].0 == p => continue,
                other => bail!("record {i} acked without offset is in the log at {other:?}"),
            }
        }
        match at.get(&(p, o)) {
            Some(r) if r.matches(&records[i]) => {}
            Some(r) => bail!(
                "acked record {i} at {p}/{o}, but the log has key {:?} there",
                String::from_utf8_lossy(&r.key)
            ),
            None => missing.push((i, p, o)),
        }
    }
    if without_offset > 0 {
        eprintln!("{without_offset} records were acknowledged without an offset (DUPLICATE_SEQUENCE_NUMBER)");
    }
    missing.sort();
    ensure!(
        missing.is_empty(),
        "{} acknowledged records missing, first: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    Ok(())
}

#[test]
fn acknowledged_records_survive_repeated_kill_9() -> Result<()> {
    // Small segments: recovery must walk many segment files and their indexes.
    kill_9_while_producing("restart-kill9", "none", "65536")
}

#[test]
fn acknowledged_lz4_records_survive_repeated_kill_9() -> Result<()> {
    kill_9_while_producing("restart-kill9-lz4", "lz4", "67108864")
}

#[test]
fn acknowledged_zstd_records_survive_repeated_kill_9() -> Result<()> {
    kill_9_while_producing("restart-kill9-zstd", "zstd", "67108864")
}

/// An idempotent producer (`compression`) writes 20k records over 4 partitions while the
/// broker is SIGKILLed 3 times at random points and restarted on the same dir and port.
fn kill_9_while_producing(
    topic: &'static str,
    compression: &'static str,
    segment_bytes: &str,
) -> Result<()> {
    const PARTITIONS: i32 = 4;
    const RECORDS: usize = 20_000;
    const KILLS: usize = 3;
    let data = tempfile::tempdir()?;
    let storage = Storage::Durable {
        dir: data.path().to_path_buf(),
        fsync: "every-batch".into(),
    };
    let partitions = PARTITIONS.to_string();
    let flags = [
        "--default-partitions",
        &partitions,
        "--segment-bytes",
        segment_bytes,
    ];
    let mut broker = BrokerProcess::spawn(storage, &flags)?;
    let bootstrap = broker.bootstrap().to_string();

    let records: Vec<TestRecord> = (0..RECORDS)
        .map(|i| TestRecord::numbered(i as i32 % PARTITIONS, i as u64, 120))
        .collect();
    let acks = Arc::new(Acks::default());
    let done = Arc::new(AtomicBool::new(false));
    let sender = {
        let (bootstrap, acks, records, done) = (
            bootstrap.clone(),
            acks.clone(),
            records.clone(),
            done.clone(),
        );
        std::thread::spawn(move || -> Result<()> {
            let producer = idempotent_producer_with(&bootstrap, &acks, compression)?;
            let result = send_all(&producer, topic, &records, 4_000);
            let flushed = producer.flush(Duration::from_secs(100));
            done.store(true, Ordering::SeqCst);
            result?;
            flushed.context("flush")?;
            Ok(())
        })
    };

    let mut rng = rand::rng();
    let mut kills = 0;
    // only a stuck producer or broker reaches this bound, not a loaded machine
    let test_deadline = Instant::now() + Duration::from_secs(600);
    while kills < KILLS && !done.load(Ordering::SeqCst) {
        // Spread the kills over the run: kill k comes once roughly k/(KILLS+1) of the records
        // are acknowledged, at a random point around there.
        let target =
            (kills + 1) * RECORDS / (KILLS + 1) - rng.random_range(0..RECORDS / (2 * (KILLS + 1)));
        while acks.delivered.lock().unwrap().len() < target && !done.load(Ordering::SeqCst) {
            ensure!(
                Instant::now() < test_deadline,
                "the producer made no progress; broker log:\n{}",
                broker.log_tail(3000)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Kill right at the random target (a count of acknowledgements, not a time): the first
        // target is a quarter of the records at most, so at least one kill is certain.
        if done.load(Ordering::SeqCst) {
            break;
        }
        let before = acks.delivered.lock().unwrap().len();
        broker.kill9()?;
        kills += 1;
        eprintln!("kill -9 #{kills}: {before} records acknowledged so far");
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        broker
            .restart_same_port()
            .context("restart after kill -9")?;
        ensure!(Instant::now() < test_deadline, "test ran too long");
    }
    let sent = sender.join().expect("sender thread panicked");
    let failed = acks.failed.lock().unwrap().clone();
    let delivered = acks.delivered.lock().unwrap().len();
    eprintln!(
        "{kills} kills; {delivered} delivered, {} failed",
        failed.len()
    );
    if let Err(e) = sent {
        bail!(
            "producer: {e:#}; failures {:?}\nbroker logs:\n{}",
            &failed[..failed.len().min(5)],
            broker.all_logs()
        );
    }
    ensure!(
        kills >= 1,
        "the producer finished before any kill: make it slower"
    );
    ensure!(
        failed.is_empty(),
        "{} deliveries failed across restarts (an idempotent producer should ride them out), first: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    ensure!(
        delivered == RECORDS,
        "only {delivered} of {RECORDS} delivery reports were successes"
    );

    // One more kill -9 after everything was acknowledged, then read back.
    broker.restart_same_port()?;
    let read = read_all(
        broker.bootstrap(),
        topic,
        PARTITIONS,
        Duration::from_secs(60),
    )?;
    verify(&read, &records, &acks)
        .with_context(|| format!("broker logs:\n{}", broker.all_logs()))?;
    ensure!(
        read.len() == RECORDS,
        "log holds {} records, {RECORDS} were sent once each",
        read.len()
    );
    Ok(())
}

/// The newest segment file of partition `partition` of `topic` under `data_dir`: files in a
/// directory whose name is `{topic}-{partition}` (Kafka's layout) or in `{topic}/{partition}`,
/// preferring `*.log`, the greatest name (segment base offset) wins.
fn last_segment(data_dir: &Path, topic: &str, partition: i32) -> Result<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(data_dir, &mut files)?;
    let kafka_dir = format!("{topic}-{partition}");
    let in_partition = |p: &PathBuf| {
        let parent = p
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let grand = p
            .parent()
            .and_then(|d| d.parent())
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        parent == kafka_dir || (parent == partition.to_string() && grand == topic)
    };
    let mut segments: Vec<PathBuf> = files
        .iter()
        .filter(|p| in_partition(p) && p.extension().and_then(|e| e.to_str()) == Some("log"))
        .cloned()
        .collect();
    segments.sort();
    segments.pop().with_context(|| {
        format!(
            "no *.log segment for {topic}/{partition} under {}: files {files:?}",
            data_dir.display()
        )
    })
}

#[test]
fn torn_tail_is_truncated_and_never_served() -> Result<()> {
    use std::io::Write as _;
    let topic = "torn-tail";
    let data = tempfile::tempdir()?;
    let storage = Storage::Durable {
        dir: data.path().to_path_buf(),
        fsync: "every-batch".into(),
    };
    // 16 KiB segments: each round rolls new segments, so the damaged one is a later segment.
    let flags = ["--default-partitions", "1", "--segment-bytes", "16384"];
    let mut broker = BrokerProcess::spawn(storage, &flags)?;
    let mut all: Vec<TestRecord> = Vec::new();
    let mut rng = rand::rng();

    // Each round: write acknowledged records, kill -9, damage the tail, restart, check.
    let garbage_kinds = [
        "random bytes",
        "torn batch header",
        "batch with a bad CRC",
        "zeros",
    ];
    for (round, kind) in garbage_kinds.iter().enumerate() {
        let batch: Vec<TestRecord> = (0..300)
            .map(|i| TestRecord::numbered(0, (round * 1000 + i) as u64, 80))
            .collect();
        let offsets = produce_acked(broker.bootstrap(), topic, &batch)?;
        for (i, &(p, o)) in offsets.iter().enumerate() {
            ensure!(
                p == 0 && o == (all.len() + i) as i64,
                "record {i} of round {round} acked at {p}/{o}"
            );
        }
        all.extend(batch);
        broker.kill9()?;

        let segment = last_segment(data.path(), topic, 0)?;
        let garbage: Vec<u8> = match *kind {
            "random bytes" => (0..rng.random_range(1..200))
                .map(|_| rng.random())
                .collect(),
            "torn batch header" => {
                // A plausible header of a batch at the next offset whose body never made it.
                let mut g = Vec::new();
                g.extend_from_slice(&(all.len() as i64).to_be_bytes());
                g.extend_from_slice(&500i32.to_be_bytes());
                g.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
                g.push(2); // magic
                g.extend_from_slice(&[0xde, 0xad, 0xbe]); // part of the CRC
                g
            }
            "batch with a bad CRC" => {
                // A whole batch frame (length consistent) whose CRC does not match its body.
                let body_len: i32 = 49 + 20;
                let mut g = Vec::new();
                g.extend_from_slice(&(all.len() as i64).to_be_bytes());
                g.extend_from_slice(&body_len.to_be_bytes());
                g.extend_from_slice(&0i32.to_be_bytes());
                g.push(2);
                g.extend_from_slice(&0x1234_5678u32.to_be_bytes());
                g.extend((0..body_len - 9).map(|_| rng.random::<u8>()));
                g
            }
            _ => vec![0u8; 4096],
        };
        let before = std::fs::metadata(&segment)?.len();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&segment)?
            .write_all(&garbage)?;
        eprintln!(
            "round {round}: appended {} bytes of {kind} to {} ({before} bytes)",
            garbage.len(),
            segment.display()
        );

        broker
            .restart()
            .with_context(|| format!("restart after {kind}"))?;
        let read =
            read_all(broker.bootstrap(), topic, 1, Duration::from_secs(30)).with_context(|| {
                format!(
                    "read back after {kind}; broker log:\n{}",
                    broker.log_tail(4000)
                )
            })?;
        ensure!(
            read.len() == all.len(),
            "after {kind}: the log serves {} records, {} were acknowledged; broker log:\n{}",
            read.len(),
            all.len(),
            broker.log_tail(4000)
        );
        for (i, r) in read.iter().enumerate() {
            ensure!(
                r.offset == i as i64 && r.matches(&all[i]),
                "after {kind}: offset {i} holds {r:?}"
            );
        }
        // Recovery says what it dropped: a log line names the truncation.
        let log = broker.log_tail(100_000).to_lowercase();
        ensure!(
            log.contains("trunc") || log.contains("torn"),
            "broker log after {kind} does not mention truncating the tail:\n{}",
            broker.log_tail(2000)
        );
    }

    // The broker keeps working after the last recovery: write more and read everything back.
    let tail: Vec<TestRecord> = (0..200)
        .map(|i| TestRecord::numbered(0, 9_000_000 + i, 80))
        .collect();
    let offsets = produce_acked(broker.bootstrap(), topic, &tail)?;
    ensure!(
        offsets[0] == (0, all.len() as i64),
        "first record after recovery acked at {:?}",
        offsets[0]
    );
    all.extend(tail);
    let read = read_all(broker.bootstrap(), topic, 1, Duration::from_secs(30))?;
    ensure!(
        read.len() == all.len(),
        "final log holds {} records, expected {}",
        read.len(),
        all.len()
    );
    for (i, r) in read.iter().enumerate() {
        ensure!(
            r.offset == i as i64 && r.matches(&all[i]),
            "final: offset {i} holds {r:?}"
        );
    }
    Ok(())
}

#[test]
fn sigterm_flushes_and_exits_cleanly() -> Result<()> {
    // With `--fsync never` only the shutdown flush makes the data durable; a clean exit must
    // come with status 0, and the records must be there after the restart.
    let topic = "sigterm";
    let data = tempfile::tempdir()?;
    let storage = Storage::Durable {
        dir: data.path().to_path_buf(),
        fsync: "never".into(),
    };
    let mut broker = BrokerProcess::spawn(storage, &["--default-partitions", "2"])?;
    let records: Vec<TestRecord> = (0..2_000)
        .map(|i| TestRecord::numbered(i as i32 % 2, i, 100))
        .collect();
    let offsets = produce_acked(broker.bootstrap(), topic, &records)?;
    let status = broker.terminate(Duration::from_secs(15))?;
    ensure!(
        status.success(),
        "SIGTERM exit status {status}; log:\n{}",
        broker.log_tail(3000)
    );
    broker.restart()?;
    let read = read_all(broker.bootstrap(), topic, 2, Duration::from_secs(30))?;
    ensure!(
        read.len() == records.len(),
        "{} of {} records after SIGTERM and restart",
        read.len(),
        records.len()
    );
    for (i, (p, o)) in offsets.iter().enumerate() {
        let r = read
            .iter()
            .find(|r| r.partition == *p && r.offset == *o)
            .with_context(|| {
                format!("record {i} (acked at {p}/{o}) missing after SIGTERM and restart")
            })?;
        ensure!(
            r.matches(&records[i]),
            "record {i} at {p}/{o} differs: {r:?}"
        );
    }
    Ok(())
}
