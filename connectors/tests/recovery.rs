//! Recovery: a job stopped with a checkpoint at parallelism 2 and restored at parallelism 3
//! gives the same result as an uninterrupted run; a corrupted or truncated newest checkpoint
//! fails the restore, naming the file and the older checkpoint, and where the job allows it
//! the restore falls back to the previous one with errors naming the files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use onceflow_connectors::{CollectSink, Generator};
use onceflow_operators::{KeyBy, KeyedContext};
use onceflow_runtime::{
    CheckpointEvent, Error, JobConfig, JobResult, RestoreMode, StopHandle, StreamEnvironment,
};
use serde::{Deserialize, Serialize};

const RECORDS: u64 = 40_000;
const KEYS: u64 = 23;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Summary {
    key: u64,
    count: u64,
    sum: i64,
    distinct_amounts: usize,
    ids_seen: usize,
}

fn record(i: u64) -> (u64, u64, i64) {
    (i % KEYS, i, (i.wrapping_mul(17) % 11) as i64 - 5)
}

fn summarize(
    r: (u64, u64, i64),
    ctx: &mut KeyedContext<'_, u64, Summary>,
) -> onceflow_runtime::Result<()> {
    let (key, id, amount) = r;
    let count = {
        let mut c = ctx.value::<u64>("count")?;
        let n = c.get().copied().unwrap_or(0) + 1;
        c.set(n);
        n
    };
    let sum = {
        let mut s = ctx.value::<i64>("sum")?;
        let v = s.get().copied().unwrap_or(0) + amount;
        s.set(v);
        v
    };
    let distinct_amounts = {
        let mut m = ctx.map::<i64, u64>("amounts")?;
        let prev = m.get(&amount).copied().unwrap_or(0);
        m.insert(amount, prev + 1);
        m.len()
    };
    let ids_seen = {
        let mut l = ctx.list::<u64>("ids")?;
        l.push(id);
        l.get().len()
    };
    ctx.emit(Summary {
        key,
        count,
        sum,
        distinct_amounts,
        ids_seen,
    });
    Ok(())
}

/// Runs the job; if `stop_after` is set, stops (with a final checkpoint) once that many
/// checkpoints completed. With `rate` the source is rate limited and holds back the second
/// half of the input. Returns the result and every record committed to `sink` so far.
/// Runs of one job share a sink: recovery re-commits the restored checkpoint's pending
/// output, which an idempotent sink must not count twice.
fn run(
    config: JobConfig,
    sink: &CollectSink<Summary>,
    stop_after: Option<u64>,
    rate: Option<f64>,
) -> (onceflow_runtime::Result<JobResult>, Vec<Summary>) {
    let stop: Arc<OnceLock<StopHandle>> = Arc::new(OnceLock::new());
    let s2 = stop.clone();
    let config = config.checkpoint_listener(move |ev| {
        if let (CheckpointEvent::Completed(n), Some(limit)) = (ev, stop_after) {
            if n >= limit {
                if let Some(h) = s2.get() {
                    h.stop();
                }
            }
        }
    });
    let env = StreamEnvironment::new(config);
    let _ = stop.set(env.stop_handle());
    let mut gen = Generator::new(RECORDS, record).splits(12);
    if let Some(r) = rate {
        // a run stopped after some checkpoints must stop early whatever the machine's speed:
        // the second half of the input waits for the next run
        gen = gen.rate_per_second(r).pause_at(RECORDS / 2);
    }
    env.source("records", gen)
        .key_by(|r: &(u64, u64, i64)| r.0)
        .process("summarize", summarize)
        .sink("collect", sink.clone());
    let result = env.execute_blocking();
    (result, sink.records())
}

fn finals(records: &[Summary]) -> BTreeMap<u64, Summary> {
    let mut m: BTreeMap<u64, Summary> = BTreeMap::new();
    for r in records {
        if m.get(&r.key).is_none_or(|o| o.count < r.count) {
            m.insert(r.key, r.clone());
        }
    }
    m
}

fn golden() -> BTreeMap<u64, Summary> {
    let (r, out) = run(
        JobConfig::new("golden").parallelism(2),
        &CollectSink::new(),
        None,
        None,
    );
    r.expect("golden run");
    assert_eq!(out.len() as u64, RECORDS);
    let f = finals(&out);
    assert_eq!(f.len() as u64, KEYS);
    f
}

fn checkpointed(name: &str, dir: &Path, parallelism: usize) -> JobConfig {
    JobConfig::new(name)
        .parallelism(parallelism)
        .checkpoint_interval(Duration::from_millis(40))
        .checkpoint_dir(dir)
        .retained_checkpoints(3)
}

#[test]
fn restore_at_parallelism_3_from_2_equals_uninterrupted_run() {
    let want = golden();
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::new();
    let (r1, out1) = run(
        checkpointed("rescale", dir.path(), 2),
        &sink,
        Some(3),
        Some(20_000.0),
    );
    let r1 = r1.expect("first run");
    assert!(r1.last_checkpoint.is_some());
    assert!((out1.len() as u64) < RECORDS, "first run must stop early");
    let (r2, all) = run(
        checkpointed("rescale", dir.path(), 3).restore(RestoreMode::Latest),
        &sink,
        None,
        None,
    );
    let r2 = r2.expect("restored run");
    assert_eq!(r2.restored_from, r1.last_checkpoint);
    assert_eq!(
        all.len(),
        RECORDS as usize,
        "every record emitted exactly once"
    );
    assert_eq!(finals(&all), want);
    // retention: at most 3 checkpoints kept, every one of them complete
    let dirs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("chk-"))
        .collect();
    assert!(!dirs.is_empty() && dirs.len() <= 3, "{dirs:?}");
    assert!(
        dirs.iter().all(|d| d.join("_metadata").exists()),
        "{dirs:?}"
    );
}

fn state_file_of(dir: &Path, id: u64, node: &str) -> PathBuf {
    let chk = dir.join(format!("chk-{id:020}"));
    std::fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.contains(node) && n.ends_with(".state")
        })
        .unwrap_or_else(|| panic!("no state file of {node} in {}", chk.display()))
}

/// `result` is a run restored from checkpoint `from` after skipping one newer checkpoint per
/// entry of `skipped`, each reported with an error naming that file (newest first).
fn assert_fell_back(result: Result<JobResult, Error>, from: u64, skipped: &[&Path]) {
    let r = result.expect("restored run");
    assert_eq!(r.restored_from, Some(from));
    assert_eq!(
        r.restore_errors.len(),
        skipped.len(),
        "{:?}",
        r.restore_errors
    );
    for (error, path) in r.restore_errors.iter().zip(skipped) {
        assert!(
            error.contains(&path.display().to_string()),
            "{:?}",
            r.restore_errors
        );
    }
}

/// `result` is a corrupt-checkpoint error whose message names `path`.
fn assert_corrupt_naming<T: std::fmt::Debug>(result: Result<T, Error>, path: &Path) {
    match result {
        Err(e @ Error::CorruptCheckpoint { .. }) => {
            assert!(e.to_string().contains(&path.display().to_string()), "{e}")
        }
        other => panic!(
            "expected a corrupt checkpoint error naming {}, got {other:?}",
            path.display()
        ),
    }
}

#[test]
fn corrupt_checkpoint_falls_back_to_previous_with_error_naming_file() {
    let want = golden();
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::new();
    // every snapshot in a file of its own, to damage one (small ones are kept in _metadata)
    let (r1, _) = run(
        checkpointed("corrupt", dir.path(), 2).state_inline_threshold(0),
        &sink,
        Some(4),
        Some(20_000.0),
    );
    let last = r1.expect("first run").last_checkpoint.expect("checkpoints");
    // flip a byte in the newest checkpoint, truncate a file of the one before
    let flipped = state_file_of(dir.path(), last, "summarize");
    let mut bytes = std::fs::read(&flipped).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&flipped, &bytes).unwrap();
    let truncated = state_file_of(dir.path(), last - 1, "records");
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 3]).unwrap();

    // an explicit restore of the corrupt checkpoint fails and names the file
    let (explicit, _) = run(
        checkpointed("corrupt", dir.path(), 2).restore(RestoreMode::Checkpoint(last)),
        &sink,
        None,
        None,
    );
    assert_corrupt_naming(explicit, &flipped);

    // `latest` refuses to go back on its own: the older checkpoint's output after it would be
    // written again, and a sink that committed it would duplicate it
    let (refused, _) = run(
        checkpointed("corrupt", dir.path(), 2).restore(RestoreMode::Latest),
        &sink,
        None,
        None,
    );
    match refused {
        Err(e @ Error::LatestCheckpointCorrupt { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("checkpoint {last} "))
                    && msg.contains(&format!("older checkpoint {}", last - 1))
                    && msg.contains(&flipped.display().to_string())
                    && msg.contains("--restore-older-repeating-output"),
                "{msg}"
            );
        }
        other => panic!("expected the restore to refuse the fallback, got {other:?}"),
    }

    let (r2, all) = run(
        checkpointed("corrupt", dir.path(), 2)
            .restore(RestoreMode::Latest)
            .restore_older_if_corrupt(true),
        &sink,
        None,
        None,
    );
    assert_fell_back(r2, last - 2, &[&flipped, &truncated]);
    // the fallback replays from an older state, so outputs repeat, but the state is exact
    assert_eq!(finals(&all), want);
}

/// With the default threshold small snapshots live inside `_metadata`: damage there is
/// caught by the metadata's own checksum, named with its path, and the restore falls back to
/// the checkpoint before.
#[test]
fn damaged_inline_state_falls_back_to_previous_with_error_naming_metadata() {
    let want = golden();
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::new();
    let (r1, _) = run(
        checkpointed("inline", dir.path(), 2),
        &sink,
        Some(4),
        Some(20_000.0),
    );
    let last = r1.expect("first run").last_checkpoint.expect("checkpoints");
    let chk = dir.path().join(format!("chk-{last:020}"));
    let names: Vec<String> = std::fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    // the sources' positions are a few bytes: inline, so no file of theirs
    assert!(
        !names.iter().any(|n| n.contains("records")),
        "source state written to a file: {names:?}"
    );
    let meta = chk.join("_metadata");
    let mut bytes = std::fs::read(&meta).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 0x40;
    std::fs::write(&meta, &bytes).unwrap();

    let (explicit, _) = run(
        checkpointed("inline", dir.path(), 2).restore(RestoreMode::Checkpoint(last)),
        &sink,
        None,
        None,
    );
    assert_corrupt_naming(explicit, &meta);
    let (r2, all) = run(
        checkpointed("inline", dir.path(), 2)
            .restore(RestoreMode::Latest)
            .restore_older_if_corrupt(true),
        &sink,
        None,
        None,
    );
    assert_fell_back(r2, last - 1, &[&meta]);
    assert_eq!(finals(&all), want);
}

/// Every file under `dir` that starts with the checkpoint frame magic.
fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(checkpoint_files(&path));
        } else if std::fs::read(&path).unwrap().starts_with(b"OFLW") {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_checkpoint_of_the_old_key_group_hash_is_refused_not_restored() {
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::new();
    let (r1, _) = run(
        checkpointed("old-format", dir.path(), 2),
        &sink,
        Some(3),
        Some(20_000.0),
    );
    r1.expect("first run");
    // rewrite every checkpoint file as format version 1 (the std-Hash key groups); the
    // checksum covers the payload only, so only the version says what is wrong
    let files = checkpoint_files(dir.path());
    assert!(!files.is_empty());
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
        std::fs::write(f, &bytes).unwrap();
    }
    let (r2, _) = run(
        checkpointed("old-format", dir.path(), 2).restore(RestoreMode::Latest),
        &sink,
        None,
        None,
    );
    match r2 {
        Err(e @ Error::IncompatibleCheckpoint { version: 1, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("format version 1"), "{msg}");
            assert!(msg.contains("new checkpoint directory"), "{msg}");
        }
        other => panic!("expected the old format to be refused, got {other:?}"),
    }
}

/// A new build of `summarize` in which the state `amounts` became a plain counter.
fn summarize_with_changed_state(
    r: (u64, u64, i64),
    ctx: &mut KeyedContext<'_, u64, Summary>,
) -> onceflow_runtime::Result<()> {
    let mut amounts = ctx.value::<u64>("amounts")?;
    let n = amounts.get().copied().unwrap_or(0) + 1;
    amounts.set(n);
    ctx.emit(Summary {
        key: r.0,
        count: n,
        sum: 0,
        distinct_amounts: 0,
        ids_seen: 0,
    });
    Ok(())
}

#[test]
fn a_state_whose_type_changed_is_refused_naming_operator_and_state() {
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::new();
    let (r1, _) = run(
        checkpointed("changed-state", dir.path(), 2),
        &sink,
        Some(3),
        Some(20_000.0),
    );
    r1.expect("first run");
    let env = StreamEnvironment::new(
        checkpointed("changed-state", dir.path(), 2).restore(RestoreMode::Latest),
    );
    env.source("records", Generator::new(RECORDS, record).splits(12))
        .key_by(|r: &(u64, u64, i64)| r.0)
        .process("summarize", summarize_with_changed_state)
        .sink("collect", CollectSink::new());
    let err = env
        .execute_blocking()
        .expect_err("restoring a changed state type must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("operator `summarize[") && msg.contains("state `amounts`"),
        "the error must name the operator and the state: {msg}"
    );
    assert!(msg.contains("type changed"), "{msg}");
}
