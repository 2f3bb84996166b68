//! Opening a partition directory after a clean shutdown or a crash: load each segment's index
//! (dropping a damaged tail), validate every batch after the last trusted index entry (length,
//! magic, CRC-32C, contiguous offsets), cut a torn tail with a warning, refuse corruption in the
//! middle (an invalid batch with valid data after it) unless repair was asked for, then rebuild
//! producer state from the newest valid snapshot plus a replay of the log after it.

use std::collections::BTreeSet;
use std::path::Path;

use super::backend::StorageBackend;
use super::batch::BatchHeader;
use super::error::{Result, StorageError};
use super::index::{self, IndexEntry, INDEX_INTERVAL_BYTES};
use super::log_start::{self, LOG_START_FILE};
use super::metrics::RECOVERY_TRUNCATIONS;
use super::partition::{LogState, SNAPSHOTS_KEPT};
use super::producer_state::ProducerStates;
use super::segment::{self, HeaderWalker, Segment};
use super::snapshot;
use super::txn_index::{self, AbortedTxn, CONTROL_ABORT, TXN_INDEX_FILE};
use crate::framed_log::{REPAIRED_BYTES, REPAIRED_RANGES};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |e| StorageError::io(path, e)
}

/// Recovers (or creates) the partition in `dir`. With `repair`, a segment holding an invalid
/// batch followed by valid data is truncated at that batch (with the later segments) and the
/// loss reported, instead of refusing with [`StorageError::Corrupt`].
pub(crate) fn recover(backend: &dyn StorageBackend, dir: &Path, repair: bool) -> Result<LogState> {
    backend.create_dir_all(dir).map_err(io(dir))?;
    // An interrupted cleaner swap is finished (or rolled back) before segments are read.
    super::cleaner::swap::finish_interrupted(backend, dir).map_err(io(dir))?;
    let mut logs = BTreeSet::new();
    let mut indexes = BTreeSet::new();
    let mut snapshots = BTreeSet::new();
    for entry in backend.list(dir).map_err(io(dir))? {
        if entry.is_dir {
            continue;
        }
        if entry.name == TXN_INDEX_FILE || entry.name == LOG_START_FILE {
            continue;
        }
        if entry.name.ends_with(".tmp") {
            let p = dir.join(&entry.name);
            backend.remove_file(&p).map_err(io(&p))?;
            continue;
        }
        match segment::parse_file_name(&entry.name) {
            Some((base, "log")) => {
                logs.insert(base);
            }
            Some((base, "index")) => {
                indexes.insert(base);
            }
            Some((base, "snapshot")) => {
                snapshots.insert(base);
            }
            _ => {
                tracing::warn!(file = %dir.join(&entry.name).display(), "ignoring unknown file in partition directory")
            }
        }
    }
    for orphan in indexes.difference(&logs) {
        let p = dir.join(segment::file_name(*orphan, "index"));
        backend.remove_file(&p).map_err(io(&p))?;
    }
    let mut segments: Vec<Segment> = Vec::new();
    if logs.is_empty() {
        segments.push(Segment::create(backend, dir, 0).map_err(io(dir))?);
        backend.sync_dir(dir).map_err(io(dir))?;
    }
    let mut bases: Vec<i64> = logs.into_iter().collect();
    let checkpoint = read_log_start(backend, dir)?;
    if let Some(start) = checkpoint {
        // Segments wholly below the checkpointed log start are what an interrupted retention
        // pass or DeleteRecords had still to delete: finish the deletion (the last segment
        // always stays).
        let below = bases.windows(2).take_while(|w| w[1] <= start).count();
        if below > 0 {
            tracing::info!(
                dir = %dir.display(), log_start = start, segments = below,
                "removing segments below the checkpointed log start"
            );
            remove_segments(backend, dir, &bases[..below])?;
            bases.drain(..below);
        }
    }
    let mut i = 0;
    while i < bases.len() {
        let base = bases[i];
        if let Some(prev) = segments.last() {
            if prev.next_offset != base {
                tracing::warn!(
                    dir = %dir.display(), expected = prev.next_offset, found = base,
                    "segment does not continue the log; removing it and later segments"
                );
                remove_segments(backend, dir, &bases[i..])?;
                break;
            }
        }
        let (seg, cut) = recover_segment(backend, dir, base, &bases[i + 1..], repair)?;
        segments.push(seg);
        i += 1;
        if cut && i < bases.len() {
            tracing::error!(
                dir = %dir.display(), from = bases[i],
                "repairing a corrupt log: removing the segments after the damaged one"
            );
            remove_segments(backend, dir, &bases[i..])?;
            break;
        }
    }
    let first_base = segments.first().map_or(0, |s| s.base_offset);
    let log_end = segments.last().map_or(0, |s| s.next_offset);
    let log_start = match checkpoint {
        Some(start) if start > log_end => {
            tracing::warn!(
                dir = %dir.display(), checkpoint = start, log_end,
                "log start checkpoint is past the recovered log end (data below it was not \
                 durable); starting the log at its end"
            );
            log_end
        }
        Some(start) => start.max(first_base),
        None => first_base,
    };
    let txn_path = dir.join(TXN_INDEX_FILE);
    let stored_txn = backend.read_file(&txn_path).map_err(io(&txn_path))?;
    let (mut aborted, damaged) = txn_index::load(stored_txn.as_deref());
    if damaged {
        tracing::warn!(file = %txn_path.display(), "aborted-transaction index damaged; keeping its valid prefix and re-deriving the rest");
    }
    let loaded_aborted = aborted.clone();
    let (producers, kept) = recover_producers(
        backend,
        dir,
        &segments,
        snapshots,
        (log_start, log_end),
        &mut aborted,
        // Without a trustworthy index the whole log is replayed so no entry is lost.
        stored_txn.is_some() && !damaged,
    )?;
    // Transactions aborted wholly below the log start can overlap no fetch any more.
    aborted.retain(|e| e.last_offset >= log_start);
    if stored_txn.is_none() || damaged || aborted != loaded_aborted {
        backend
            .write_file_atomic(&txn_path, &txn_index::encode_file(&aborted))
            .map_err(io(&txn_path))?;
    }
    let txn_index = backend.open(&txn_path).map_err(io(&txn_path))?;
    let mut state = LogState {
        segments,
        log_start,
        log_end,
        high_watermark: log_end,
        producers,
        snapshots: kept,
        aborted,
        txn_index,
        txn_index_unsynced: false,
        unsynced: false,
        sealed_unsynced: Vec::new(),
        roll_unsynced: false,
        failed: None,
        deleted: false,
    };
    // A snapshot at the log end spares the next open this replay (an empty log needs none).
    if state.snapshots.last() != Some(&log_end) && log_end > log_start {
        let path = dir.join(segment::file_name(log_end, "snapshot"));
        backend
            .write_file_atomic(&path, &snapshot::encode(log_end, &state.producers))
            .map_err(io(&path))?;
        state.snapshots.push(log_end);
        while state.snapshots.len() > SNAPSHOTS_KEPT {
            let old = state.snapshots.remove(0);
            let p = dir.join(segment::file_name(old, "snapshot"));
            backend.remove_file(&p).map_err(io(&p))?;
        }
    }
    Ok(state)
}

/// The checkpointed log start, if the file exists and verifies. A damaged checkpoint is
/// dropped with a warning: the log then starts at its first segment, so records below the
/// lost checkpoint may be served again, but none is lost.
fn read_log_start(backend: &dyn StorageBackend, dir: &Path) -> Result<Option<i64>> {
    let path = dir.join(LOG_START_FILE);
    let Some(bytes) = backend.read_file(&path).map_err(io(&path))? else {
        return Ok(None);
    };
    match log_start::decode(&bytes) {
        Ok(offset) => Ok(Some(offset)),
        Err(reason) => {
            tracing::warn!(file = %path.display(), %reason, "log start checkpoint damaged; the log starts at its first segment");
            backend.remove_file(&path).map_err(io(&path))?;
            Ok(None)
        }
    }
}

/// What follows a fault in a segment: a valid batch in the same file, later segments.
struct Damage {
    /// Position (in the file) and base offset of the first valid batch after the fault.
    resync: Option<(u64, i64)>,
    /// Bytes of the later segments.
    later_bytes: u64,
    /// Number of later segments.
    later_segments: usize,
    /// Size of the damaged file.
    file_len: u64,
}

impl Damage {
    fn measure(
        backend: &dyn StorageBackend,
        dir: &Path,
        (log, log_path): (&dyn super::backend::BackendFile, &Path),
        end: &segment::ScanEnd,
        later: &[i64],
    ) -> Result<Self> {
        let file_len = log.len();
        let tail = log
            .read_at(end.valid_end, (file_len - end.valid_end) as usize)
            .map_err(io(log_path))?;
        let resync = segment::resync(&tail, end.next_offset)
            .map(|(at, offset)| (end.valid_end + at as u64, offset));
        let mut later_bytes = 0;
        for b in later {
            let p = dir.join(segment::file_name(*b, "log"));
            later_bytes += backend.open(&p).map_err(io(&p))?.len();
        }
        Ok(Damage {
            resync,
            later_bytes,
            later_segments: later.len(),
            file_len,
        })
    }

    /// Nothing valid follows the fault: the normal result of a crash in an append.
    fn is_torn_tail(&self) -> bool {
        self.resync.is_none() && self.later_bytes == 0
    }

    fn refusal(&self, end: &segment::ScanEnd, reason: &str) -> String {
        let next = match self.resync {
            Some((pos, offset)) => {
                format!("a valid batch follows at byte {pos} (offset {offset})")
            }
            None => "no valid batch follows in this file".to_string(),
        };
        format!(
            "invalid batch at byte {} (expected offset {}): {reason}; {next}, and {} later \
             segment(s) hold {} bytes. Cutting the log there would drop {} bytes of this file \
             and every later segment (offsets {} and up); the files were left unchanged. \
             Restart with --repair-corrupt-logs to truncate the partition there",
            end.valid_end,
            end.next_offset,
            self.later_segments,
            self.later_bytes,
            self.file_len - end.valid_end,
            end.next_offset,
        )
    }
}

fn remove_segments(backend: &dyn StorageBackend, dir: &Path, bases: &[i64]) -> Result<()> {
    for base in bases {
        for ext in ["log", "index"] {
            let p = dir.join(segment::file_name(*base, ext));
            backend.remove_file(&p).map_err(io(&p))?;
        }
    }
    backend.sync_dir(dir).map_err(io(dir))
}

/// Recovers one segment; the flag says whether its tail had to be cut. `later` are the base
/// offsets of the segments after it: data there means a fault here is not a torn tail.
fn recover_segment(
    backend: &dyn StorageBackend,
    dir: &Path,
    base: i64,
    later: &[i64],
    repair: bool,
) -> Result<(Segment, bool)> {
    let log_path = dir.join(segment::file_name(base, "log"));
    let index_path = dir.join(segment::file_name(base, "index"));
    let log = backend.open(&log_path).map_err(io(&log_path))?;
    let len = log.len();
    let stored = backend.read_file(&index_path).map_err(io(&index_path))?;
    let loaded = index::load(stored.as_deref(), base, len);
    let mut entries = loaded.entries;
    let mut rewrite = loaded.damaged;
    if loaded.damaged && stored.is_some() {
        // The index is derived from the log: its damaged part is rebuilt, nothing is lost.
        tracing::warn!(file = %index_path.display(), kept_entries = entries.len(),
            "offset index damaged; keeping its valid prefix and rebuilding the rest from the log");
    }
    if let Some(last) = entries.last().copied() {
        let mut walker = HeaderWalker::new(log.as_ref(), len);
        let matches = matches!(walker.header_at(last.position), Ok(Some(Ok(h))) if h.base_offset == last.offset);
        if !matches {
            tracing::warn!(file = %index_path.display(), "index does not match the log; rebuilding it");
            entries.clear();
            rewrite = true;
        }
    }
    let (start_pos, start_offset, mut max_ts) = entries.last().map_or((0, base, i64::MIN), |e| {
        (e.position, e.offset, e.max_ts_before)
    });
    let mut last_entry_pos = start_pos;
    let before = entries.len();
    let end = segment::scan_validate(log.as_ref(), start_pos, start_offset, |pos, h| {
        if pos >= last_entry_pos + INDEX_INTERVAL_BYTES {
            entries.push(IndexEntry {
                offset: h.base_offset,
                position: pos,
                max_ts_before: max_ts,
            });
            last_entry_pos = pos;
        }
        max_ts = max_ts.max(h.max_timestamp);
    })
    .map_err(io(&log_path))?;
    rewrite |= entries.len() != before;
    let cut = end.fault.is_some();
    if let Some(reason) = &end.fault {
        let damage = Damage::measure(backend, dir, (log.as_ref(), &log_path), &end, later)?;
        if damage.is_torn_tail() {
            tracing::warn!(
                file = %log_path.display(), position = end.valid_end, offset = end.next_offset,
                dropped_bytes = len - end.valid_end, %reason,
                "truncating a torn log tail (an interrupted append); it will not be served"
            );
        } else if !repair {
            return Err(StorageError::Corrupt {
                path: log_path,
                reason: damage.refusal(&end, reason),
            });
        } else {
            tracing::error!(
                file = %log_path.display(), position = end.valid_end, offset = end.next_offset,
                dropped_bytes = len - end.valid_end, later_segments = later.len(),
                later_segment_bytes = damage.later_bytes, %reason,
                "repairing a corrupt log: truncating the partition at the damaged batch; every \
                 offset from here on is dropped"
            );
            let dropped = len - end.valid_end + damage.later_bytes;
            metrics::counter!(REPAIRED_BYTES, "file" => "segment").increment(dropped);
            metrics::counter!(REPAIRED_RANGES, "file" => "segment").increment(1);
        }
        metrics::counter!(RECOVERY_TRUNCATIONS).increment(1);
        log.truncate(end.valid_end).map_err(io(&log_path))?;
        log.sync().map_err(io(&log_path))?;
    }
    let seg = Segment::recovered(
        backend,
        dir,
        base,
        end.next_offset,
        max_ts,
        log,
        entries,
        rewrite,
    )
    .map_err(io(&index_path))?;
    Ok((seg, cut))
}

/// Loads the newest valid snapshot at or below `log_end` (deleting newer or damaged ones) and
/// replays the log after it, re-deriving aborted-index entries from the ABORT markers there
/// (`aborted` keeps only the entries before the replay start). Returns the state and the
/// snapshot offsets kept.
fn recover_producers(
    backend: &dyn StorageBackend,
    dir: &Path,
    segments: &[Segment],
    snapshots: BTreeSet<i64>,
    (log_start, log_end): (i64, i64),
    aborted: &mut Vec<AbortedTxn>,
    use_snapshots: bool,
) -> Result<(ProducerStates, Vec<i64>)> {
    let mut kept = Vec::new();
    let mut loaded: Option<(i64, ProducerStates)> = None;
    for off in snapshots.into_iter().rev() {
        let path = dir.join(segment::file_name(off, "snapshot"));
        let inside = (log_start..=log_end).contains(&off);
        if inside && (loaded.is_some() || !use_snapshots) {
            kept.push(off);
            continue;
        }
        let verdict = if !inside {
            Err(format!(
                "snapshot offset outside the log [{log_start}, {log_end}]"
            ))
        } else {
            match backend.read_file(&path).map_err(io(&path))? {
                None => Err("vanished".to_string()),
                Some(bytes) => snapshot::decode(&bytes).and_then(|(o, s)| {
                    if o == off {
                        Ok((o, s))
                    } else {
                        Err(format!("snapshot names offset {off} but holds {o}"))
                    }
                }),
            }
        };
        match verdict {
            Ok(state) => {
                kept.push(off);
                loaded = Some(state);
            }
            Err(reason) => {
                tracing::warn!(file = %path.display(), %reason, "discarding producer-state snapshot");
                backend.remove_file(&path).map_err(io(&path))?;
            }
        }
    }
    kept.reverse();
    let (from, mut producers) = loaded.unwrap_or((log_start, ProducerStates::default()));
    aborted.retain(|e| e.last_offset < from);
    for seg in segments.iter().filter(|s| s.next_offset > from) {
        let mut walker = HeaderWalker::new(seg.log.as_ref(), seg.size());
        let (mut pos, _) = seg.locate(from);
        loop {
            match walker.header_at(pos) {
                Ok(Some(Ok(h))) => {
                    if h.base_offset >= from {
                        if h.is_control() {
                            let bytes = seg.log.read_at(pos, h.size).map_err(io(&seg.log_path))?;
                            derive_abort(&producers, &bytes, &h, aborted);
                            producers.replay(&h);
                            if let Some(epoch) = txn_index::marker_coordinator_epoch(&bytes, &h) {
                                producers.note_marker(h.producer_id, epoch);
                            }
                        } else {
                            producers.replay(&h);
                        }
                    }
                    pos += h.size as u64;
                }
                Ok(_) => break,
                Err(e) => return Err(StorageError::io(&seg.log_path, e)),
            }
        }
    }
    Ok((producers, kept))
}

/// Adds the aborted-index entry of an ABORT marker met during replay (before `producers`
/// applies it).
fn derive_abort(
    producers: &ProducerStates,
    bytes: &[u8],
    h: &BatchHeader,
    aborted: &mut Vec<AbortedTxn>,
) {
    if txn_index::control_type(bytes, h) != Some(CONTROL_ABORT) {
        return;
    }
    let Some(first) = producers
        .get(h.producer_id)
        .and_then(|e| e.txn_first_offset)
    else {
        return;
    };
    let lso = producers
        .iter()
        .filter(|(pid, _)| **pid != h.producer_id)
        .filter_map(|(_, e)| e.txn_first_offset)
        .min()
        .map_or(h.base_offset + 1, |m| m.min(h.base_offset + 1));
    aborted.push(AbortedTxn {
        producer_id: h.producer_id,
        first_offset: first,
        last_offset: h.base_offset,
        last_stable_offset: lso,
    });
}
