//! The broker binary tells a torn tail of its durable files from corruption in the middle: a
//! flipped byte inside a record followed by valid records makes it refuse to start with an
//! error naming the file and position; `--repair-corrupt-logs` drops the damaged record,
//! keeps the valid ones after it (the group offsets and transaction logs) or truncates the
//! partition there (segments) and reports the drop; a torn tail is cut without the flag. A
//! segment batch damaged while the broker runs is never delivered to a librdkafka consumer.
//! Files derived from the log (offset indexes, producer-state snapshots, the aborted-transaction
//! index, the topic registry) damaged in the middle are rebuilt from the log with a warning
//! naming the file, and the log, high watermark, producer states and aborted transactions come
//! out exactly as before.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use onceflow_broker::group::coordinator::OFFSETS_DIR;
use onceflow_broker::group::offsets_log::{LogRecord as OffsetsRecord, OffsetsLog};
use onceflow_broker::group::{CommittedOffset, OffsetStore, TopicPartition};
use onceflow_broker::storage::batch::{encode_batch, BatchSpec, RecordSpec};
use onceflow_broker::storage::{FsyncPolicy, StorageConfig, Store};
use onceflow_broker::txn::log::{LogRecord as TxnRecord, TxnLog, LOG_FILE};
use onceflow_broker::txn::manager::TXN_DIR;
use onceflow_broker::txn::{now_ms, TxnMetadata};
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

const STOP: Duration = Duration::from_secs(30);
const RECORDS: usize = 10;

fn storage(dir: &Path) -> Storage {
    Storage::Durable {
        dir: dir.to_path_buf(),
        fsync: "every-batch".into(),
    }
}

/// Byte positions of every frame in a `len | crc | payload` file.
fn frame_starts(data: &[u8], big_endian: bool) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= data.len() {
        out.push(pos);
        let b = [data[pos], data[pos + 1], data[pos + 2], data[pos + 3]];
        let len = if big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        };
        pos += 8 + len as usize;
    }
    out
}

fn flip(path: &Path, at: usize) {
    let mut data = std::fs::read(path).unwrap();
    data[at] ^= 0x5a;
    std::fs::write(path, data).unwrap();
}

/// Cuts the last `bytes` bytes off `path`: the last record is incomplete, as after a crash.
fn tear_tail(path: &Path, bytes: u64) {
    let len = std::fs::metadata(path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len - bytes)
        .unwrap();
}

fn tp() -> TopicPartition {
    TopicPartition {
        topic: "orders".into(),
        partition: 0,
    }
}

/// An offsets file where record i commits offset (i + 1) * 100 for group `g`.
fn write_offsets(dir: &Path) -> PathBuf {
    let offsets_dir = dir.join(OFFSETS_DIR);
    std::fs::create_dir_all(&offsets_dir).unwrap();
    let mut bytes = Vec::new();
    for i in 0..RECORDS {
        let record = OffsetsRecord::Commit {
            group: "g".into(),
            offsets: vec![(
                tp(),
                CommittedOffset {
                    offset: (i as i64 + 1) * 100,
                    leader_epoch: -1,
                    metadata: String::new(),
                    commit_timestamp_ms: 1,
                },
            )],
        };
        bytes.extend_from_slice(&record.encode());
    }
    let path = offsets_dir.join(OffsetsLog::FILE_NAME);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn committed(dir: &Path) -> i64 {
    let store = OffsetStore::open(&dir.join(OFFSETS_DIR), true).unwrap();
    store.fetch("g", &tp()).map_or(-1, |c| c.offset)
}

/// A transaction log holding ids `t0..t9` (after the coordinator-epoch record).
fn write_txn_log(dir: &Path) -> PathBuf {
    let txn_dir = dir.join(TXN_DIR);
    let (mut log, _) = TxnLog::open(&txn_dir, false).unwrap();
    for i in 0..RECORDS {
        let m = TxnMetadata::new(&format!("t{i}"), 1000 + i as i64, 60_000, now_ms());
        log.append(&TxnRecord::Upsert(m)).unwrap();
    }
    txn_dir.join(LOG_FILE)
}

fn txn_ids(dir: &Path) -> Vec<String> {
    let (_, image) = TxnLog::open(&dir.join(TXN_DIR), false).unwrap();
    let mut ids: Vec<String> = image.txns.keys().cloned().collect();
    ids.sort();
    ids
}

/// Starts the binary and expects it to exit before listening; returns its error output.
fn refused(dir: &Path) -> String {
    match BrokerProcess::spawn(storage(dir), &[]) {
        Ok(mut broker) => {
            let _ = broker.kill9();
            panic!("the broker started on a corrupt file")
        }
        Err(e) => {
            let message = format!("{e:#}");
            eprintln!("refused as expected: {message}");
            message
        }
    }
}

/// Starts the binary (optionally repairing), stops it cleanly and returns its log.
fn started(dir: &Path, repair: bool) -> Result<String> {
    let args: &[&str] = if repair {
        &["--repair-corrupt-logs"]
    } else {
        &[]
    };
    let mut broker = BrokerProcess::spawn(storage(dir), args).context("start")?;
    let status = broker.terminate(STOP)?;
    anyhow::ensure!(status.success(), "exit {status}");
    Ok(broker.all_logs())
}

#[test]
fn offsets_log_flipped_byte_refuses_then_repairs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_offsets(dir.path());
    let data = std::fs::read(&path)?;
    let starts = frame_starts(&data, false);
    // A byte inside record 4's payload (its offset field region).
    flip(&path, starts[4] + 12);
    let err = refused(dir.path());
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("corrupt record at byte {}", starts[4])),
        "{err}"
    );
    assert!(err.contains("5 valid records"), "{err}");
    assert!(err.contains("--repair-corrupt-logs"), "{err}");
    // Refusing changed nothing: the file is still damaged and still refused.
    assert_eq!(std::fs::read(&path)?.len(), data.len());
    let _ = refused(dir.path());

    let log = started(dir.path(), true)?;
    assert!(log.contains("repairing a corrupt log"), "{log}");
    assert!(log.contains(&format!("from={}", starts[4])), "{log}");
    assert_eq!(
        committed(dir.path()),
        1000,
        "the records after the damage are kept"
    );
    // The repaired file starts without the flag.
    started(dir.path(), false)?;
    Ok(())
}

#[test]
fn offsets_log_torn_tail_is_cut_without_the_flag() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_offsets(dir.path());
    tear_tail(&path, 5);
    let log = started(dir.path(), false)?;
    assert!(log.contains("torn tail"), "{log}");
    assert_eq!(committed(dir.path()), 900);
    Ok(())
}

#[test]
fn offsets_log_flipped_byte_in_the_last_record_is_a_torn_tail() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_offsets(dir.path());
    let starts = frame_starts(&std::fs::read(&path)?, false);
    flip(&path, starts[RECORDS - 1] + 12);
    started(dir.path(), false)?;
    assert_eq!(committed(dir.path()), 900);
    Ok(())
}

#[test]
fn txn_log_flipped_byte_refuses_then_repairs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_txn_log(dir.path());
    let starts = frame_starts(&std::fs::read(&path)?, true);
    // starts[0] is the coordinator-epoch record; starts[5] holds t4.
    flip(&path, starts[5] + 20);
    let err = refused(dir.path());
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("corrupt record at byte {}", starts[5])),
        "{err}"
    );
    assert!(err.contains("5 valid records"), "{err}");

    let log = started(dir.path(), true)?;
    assert!(log.contains("repairing a corrupt log"), "{log}");
    let expected: Vec<String> = (0..RECORDS)
        .filter(|i| *i != 4)
        .map(|i| format!("t{i}"))
        .collect();
    assert_eq!(txn_ids(dir.path()), expected);
    started(dir.path(), false)?;
    Ok(())
}

#[test]
fn txn_log_torn_tail_is_cut_without_the_flag() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_txn_log(dir.path());
    tear_tail(&path, 5);
    let log = started(dir.path(), false)?;
    assert!(log.contains("torn tail"), "{log}");
    let expected: Vec<String> = (0..RECORDS - 1).map(|i| format!("t{i}")).collect();
    assert_eq!(txn_ids(dir.path()), expected);
    Ok(())
}

const SEGMENT: &str = "t-0/00000000000000000000.log";

fn store(dir: &Path) -> Store {
    Store::open(StorageConfig {
        data_dir: Some(dir.to_path_buf()),
        fsync: FsyncPolicy::EveryBatch,
        ..StorageConfig::default()
    })
    .unwrap()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i:03}-").repeat(20).into_bytes()
}

/// Topic `t` with one partition holding `RECORDS` one-record batches; returns the segment
/// path and each batch's byte position.
fn write_segment(dir: &Path) -> (PathBuf, Vec<usize>) {
    let store = store(dir);
    store.create_topic("t", 1).unwrap();
    let p = store.partition("t", 0).unwrap();
    for i in 0..RECORDS {
        let v = value(i);
        let rec = RecordSpec {
            timestamp: i as i64,
            key: None,
            value: Some(&v),
            headers: vec![],
        };
        p.append(encode_batch(BatchSpec::default(), &[rec]).freeze())
            .unwrap();
    }
    store.flush_all().unwrap();
    drop(p);
    drop(store);
    let path = dir.join(SEGMENT);
    let data = std::fs::read(&path).unwrap();
    let mut starts = Vec::new();
    let mut pos = 0;
    while pos + 12 <= data.len() {
        starts.push(pos);
        pos += 12 + i32::from_be_bytes(data[pos + 8..pos + 12].try_into().unwrap()) as usize;
    }
    assert_eq!(starts.len(), RECORDS);
    (path, starts)
}

fn high_watermark(dir: &Path) -> i64 {
    store(dir).partition("t", 0).unwrap().high_watermark()
}

#[test]
fn segment_flipped_byte_refuses_then_repairs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (path, starts) = write_segment(dir.path());
    // Inside batch 4's record (past the 61-byte batch header): only the CRC shows it.
    flip(&path, starts[4] + 100);
    let err = refused(dir.path());
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("invalid batch at byte {}", starts[4])),
        "{err}"
    );
    assert!(err.contains("CRC-32C mismatch"), "{err}");
    assert!(
        err.contains(&format!(
            "a valid batch follows at byte {} (offset 5)",
            starts[5]
        )),
        "{err}"
    );
    assert!(err.contains("--repair-corrupt-logs"), "{err}");

    let log = started(dir.path(), true)?;
    assert!(log.contains("repairing a corrupt log"), "{log}");
    assert_eq!(
        high_watermark(dir.path()),
        4,
        "the partition is cut at the damage"
    );
    started(dir.path(), false)?;
    Ok(())
}

#[test]
fn segment_torn_tail_is_cut_without_the_flag() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (path, _) = write_segment(dir.path());
    tear_tail(&path, 5);
    let log = started(dir.path(), false)?;
    assert!(log.contains("torn log tail"), "{log}");
    assert_eq!(high_watermark(dir.path()), RECORDS as i64 - 1);
    Ok(())
}

/// Bit rot while the broker runs (so recovery never saw it): the fetch path checks the CRC and
/// answers CORRUPT_MESSAGE, which librdkafka reports to the application.
#[test]
fn rdkafka_consumer_never_receives_a_batch_whose_crc_fails() -> Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir()?;
    let (path, starts) = write_segment(dir.path());
    let mut broker = BrokerProcess::spawn(storage(dir.path()), &[])?;
    {
        // In place: the broker holds the file open.
        let at = (starts[4] + 100) as u64;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let mut byte = [0u8];
        f.seek(SeekFrom::Start(at))?;
        std::io::Read::read_exact(&mut f, &mut byte)?;
        f.seek(SeekFrom::Start(at))?;
        f.write_all(&[byte[0] ^ 0x5a])?;
        f.sync_all()?;
    }
    let consumer: BaseConsumer = onceflow_testkit::records::client_config(broker.bootstrap())
        .set("group.id", "durable-corruption")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("t", 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    // A failure bound, never the verdict: the verdict is the error event.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut received = Vec::new();
    let error = loop {
        if std::time::Instant::now() > deadline {
            return Err(anyhow!("no fetch error within 60 s; received {received:?}"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            Some(Ok(msg)) => {
                assert!(msg.offset() < 4, "offset {} was served", msg.offset());
                assert_eq!(msg.payload(), Some(&value(msg.offset() as usize)[..]));
                received.push(msg.offset());
            }
            Some(Err(e)) => break e,
        }
    };
    // Error code 2 (CORRUPT_MESSAGE), which librdkafka names InvalidMessage.
    assert_eq!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::InvalidMessage),
        "{error}"
    );
    assert_eq!(
        received,
        vec![0, 1, 2, 3],
        "the valid batches before it are served"
    );
    drop(consumer);
    let status = broker.terminate(STOP)?;
    assert!(status.success());
    assert!(broker.all_logs().contains("fetch refused"));
    Ok(())
}

/// What a partition's durable files say, compared before and after a derived file is damaged.
#[derive(Debug, PartialEq)]
struct PartitionFacts {
    segment: Vec<u8>,
    high_watermark: i64,
    idempotent: Option<onceflow_broker::storage::producer_state::ProducerEntry>,
    aborted_producer: Option<onceflow_broker::storage::producer_state::ProducerEntry>,
    aborted: Vec<onceflow_broker::storage::AbortedTxn>,
    topics: Vec<(String, i32)>,
}

const IDEMPOTENT_PID: i64 = 7;
const ABORTED_PID: i64 = 9;
const COMMITTED_PID: i64 = 11;

fn facts(dir: &Path) -> PartitionFacts {
    let store = store(dir);
    let p = store.partition("t", 0).unwrap();
    let hw = p.high_watermark();
    PartitionFacts {
        segment: std::fs::read(dir.join(SEGMENT)).unwrap(),
        high_watermark: hw,
        idempotent: p.producer_state(IDEMPOTENT_PID),
        aborted_producer: p.producer_state(ABORTED_PID),
        aborted: p.aborted_transactions(0, hw),
        topics: store.topics(),
    }
}

/// Topic `t` (one partition, several index entries) with an idempotent producer, an aborted
/// and a committed transaction, flushed so a producer-state snapshot exists; and a second
/// topic so the registry lists more than one.
fn write_partition_with_derived_files(dir: &Path) -> PartitionFacts {
    use onceflow_broker::storage::batch::ATTR_TRANSACTIONAL;
    let store = store(dir);
    store.create_topic("t", 1).unwrap();
    store.create_topic("other", 3).unwrap();
    let p = store.partition("t", 0).unwrap();
    let mut seq = 0;
    let mut idempotent = |p: &onceflow_broker::storage::Partition, n: usize| {
        for _ in 0..n {
            let v = value(seq as usize);
            let rec = RecordSpec {
                timestamp: seq as i64,
                key: None,
                value: Some(&v),
                headers: vec![],
            };
            let spec = BatchSpec {
                producer_id: IDEMPOTENT_PID,
                producer_epoch: 0,
                base_sequence: seq,
                ..BatchSpec::default()
            };
            p.append(encode_batch(spec, &[rec]).freeze()).unwrap();
            seq += 1;
        }
    };
    idempotent(&p, 40);
    for (pid, commit) in [(ABORTED_PID, false), (COMMITTED_PID, true)] {
        let v = value(1000);
        let rec = RecordSpec {
            timestamp: 5,
            key: None,
            value: Some(&v),
            headers: vec![],
        };
        let spec = BatchSpec {
            attributes: ATTR_TRANSACTIONAL,
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchSpec::default()
        };
        p.append(encode_batch(spec, &[rec]).freeze()).unwrap();
        p.append_marker(pid, 0, commit, 0, 6).unwrap();
    }
    idempotent(&p, 40);
    store.flush_all().unwrap();
    drop(p);
    drop(store);
    let before = facts(dir);
    assert_eq!(
        before.aborted.len(),
        1,
        "the aborted transaction is indexed"
    );
    assert!(before.idempotent.is_some());
    before
}

/// The one file in `t-0/` with extension `ext`.
fn partition_file(dir: &Path, ext: &str) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("t-0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(files.len(), 1, "{ext} files: {files:?}");
    files.into_iter().next().unwrap()
}

/// Flips a byte in the middle of `path`, starts the broker binary without the repair flag,
/// expects `warning` in its log next to the file's name, and checks nothing changed.
fn derived_file_is_rebuilt(path_of: impl Fn(&Path) -> PathBuf, warning: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let before = write_partition_with_derived_files(dir.path());
    let path = path_of(dir.path());
    let len = std::fs::metadata(&path)?.len() as usize;
    anyhow::ensure!(len > 40, "{} is only {len} bytes", path.display());
    flip(&path, len / 2);
    let log = started(dir.path(), false)?;
    let named = log
        .lines()
        .any(|l| l.contains(warning) && l.contains(&path.display().to_string()));
    anyhow::ensure!(
        named,
        "no warning {warning:?} naming {}: {log}",
        path.display()
    );
    anyhow::ensure!(
        facts(dir.path()) == before,
        "rebuilding {} changed the partition",
        path.display()
    );
    // And the rebuilt file is trusted on the next start.
    let log = started(dir.path(), false)?;
    anyhow::ensure!(!log.contains(warning), "rebuilt twice: {log}");
    Ok(())
}

#[test]
fn damaged_offset_index_is_rebuilt_from_the_log() -> Result<()> {
    derived_file_is_rebuilt(|d| partition_file(d, "index"), "offset index damaged")
}

#[test]
fn damaged_producer_snapshot_is_discarded_and_replayed() -> Result<()> {
    derived_file_is_rebuilt(
        |d| partition_file(d, "snapshot"),
        "discarding producer-state snapshot",
    )
}

#[test]
fn damaged_aborted_transaction_index_is_rederived() -> Result<()> {
    derived_file_is_rebuilt(
        |d| d.join("t-0/aborted.txnindex"),
        "aborted-transaction index damaged",
    )
}

#[test]
fn damaged_topic_registry_is_rebuilt_from_partition_directories() -> Result<()> {
    derived_file_is_rebuilt(|d| d.join("topics.registry"), "topic registry not trusted")
}
