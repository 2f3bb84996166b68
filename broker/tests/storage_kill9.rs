//! A real kill -9: a child process (this test binary re-executed) appends with every-batch
//! fsync and reports each acknowledgement; the parent SIGKILLs it mid-stream and reopens the
//! data directory. Every acknowledged batch must be there, byte for byte, at its offset, and the
//! producer's sequence must continue.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use onceflow_broker::storage::batch::{encode_batch, set_base_offset, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FsyncPolicy, StorageConfig, Store};

const CHILD_ENV: &str = "ONCEFLOW_STORAGE_KILL9_DIR";
const RECORDS: usize = 3;

fn config(dir: &str) -> StorageConfig {
    StorageConfig {
        data_dir: Some(dir.into()),
        segment_bytes: 8 * 1024,
        fsync: FsyncPolicy::EveryBatch,
        ..StorageConfig::default()
    }
}

/// Batch number `i` of the child's producer (deterministic, so the parent can rebuild it).
fn batch(i: usize) -> Bytes {
    let value = format!("value-{i}-{}", "x".repeat(i % 97));
    let recs = vec![
        RecordSpec {
            timestamp: i as i64,
            key: Some(b"k"),
            value: Some(value.as_bytes()),
            headers: vec![],
        };
        RECORDS
    ];
    encode_batch(
        BatchSpec {
            producer_id: 77,
            producer_epoch: 2,
            base_sequence: (i * RECORDS) as i32,
            ..BatchSpec::default()
        },
        &recs,
    )
    .freeze()
}

/// The child side: does nothing unless started by the parent test.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = Store::open(config(&dir)).expect("child opens store");
    store.create_topic("k", 1).expect("child creates topic");
    let p = store.partition("k", 0).expect("partition");
    // bounded, so an orphaned child stops by itself; the parent kills it long before
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut out = std::io::stdout().lock();
    for i in 0.. {
        let outcome = p.append(batch(i)).expect("child append");
        writeln!(out, "ACK {} {i}", outcome.base_offset).expect("stdout");
        out.flush().expect("flush");
        if Instant::now() > deadline {
            break;
        }
    }
}

#[test]
fn acknowledged_batches_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_str = dir.path().to_str().expect("utf-8 path").to_string();
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &dir_str)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut acked: Vec<(i64, usize)> = Vec::new();
    // kill after a random number of acknowledgements (an event of the child, not a time)
    let kill_after = rand::random_range(50..=400);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let Some(rest) = line.strip_prefix("ACK ") else {
            continue;
        };
        let mut it = rest.split(' ');
        let base: i64 = it.next().and_then(|s| s.parse().ok()).expect("offset");
        let i: usize = it.next().and_then(|s| s.parse().ok()).expect("index");
        acked.push((base, i));
        if acked.len() >= kill_after {
            break;
        }
    }
    child.kill().expect("SIGKILL child");
    child.wait().expect("reap child");
    assert!(
        acked.len() == kill_after,
        "child stopped after {} of {kill_after} acknowledgements",
        acked.len()
    );

    let store = Store::open(config(&dir_str)).expect("reopen after kill -9");
    let p = store.partition("k", 0).expect("partition survives");
    for &(base, i) in &acked {
        assert_eq!(base, (i * RECORDS) as i64);
        let got = p.read(base, 1).expect("read acknowledged batch");
        let mut want = batch(i).to_vec();
        set_base_offset(&mut want, base);
        assert_eq!(&got[..], &want[..], "batch {i} at offset {base}");
    }
    // The log may hold a few batches acknowledged after the last line was read: whole ones.
    let hw = p.high_watermark();
    assert_eq!(hw % RECORDS as i64, 0);
    let written = hw as usize / RECORDS;
    assert!(written >= acked.len());
    // Producer state survived: the last batch is a duplicate, the next one follows on.
    assert!(p.append(batch(written - 1)).expect("resend").duplicate);
    assert_eq!(p.append(batch(written)).expect("next").base_offset, hw);
}
