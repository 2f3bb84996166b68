//! Crash-safe replacement of a segment's log by its cleaned copy, and the recovery of every
//! state an interrupted replacement leaves (Kafka's `.cleaned` -> `.swap` -> replace order).
//!
//! 1. `<base>.cleaned` is written, fsynced, and the directory fsynced. A crash now leaves the
//!    old segment intact: recovery deletes the `.cleaned` file.
//! 2. `.cleaned` is renamed to `<base>.swap` and the directory fsynced: from here on the
//!    cleaned copy is complete and recovery finishes the swap.
//!    (Test failpoints: `cleaner before swap` before this rename, `cleaner mid swap` after it;
//!    neither holds the partition lock.)
//! 3. Under the partition lock: `<base>.index` is removed, `.swap` is renamed over
//!    `<base>.log` (atomic), the directory fsynced, and the index rebuilt. Recovery of a `.swap`
//!    does the same; the index is rebuilt from the log when it is missing.
//!
//! A `.swap` whose `<base>.log` is gone belongs to a segment deleted meanwhile (retention):
//! recovery removes it.

use std::io;
use std::path::{Path, PathBuf};

use super::failpoint;
use crate::storage::backend::StorageBackend;
use crate::storage::segment;

/// Extension of a cleaned copy being written.
pub const CLEANED_EXT: &str = "cleaned";
/// Extension of a complete cleaned copy waiting to replace its segment.
pub const SWAP_EXT: &str = "swap";

fn path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(segment::file_name(base, ext))
}

/// Step 1: writes and fsyncs `<base>.cleaned`.
pub fn write_cleaned(
    backend: &dyn StorageBackend,
    dir: &Path,
    base: i64,
    bytes: &[u8],
) -> io::Result<()> {
    let p = path(dir, base, CLEANED_EXT);
    let f = backend.open(&p)?;
    f.truncate(0)?;
    f.append(bytes)?;
    f.sync()?;
    backend.sync_dir(dir)
}

/// Step 2: the cleaned copy becomes the swap file.
pub fn promote(backend: &dyn StorageBackend, dir: &Path, base: i64) -> io::Result<()> {
    failpoint::hit("cleaner before swap");
    backend.rename(&path(dir, base, CLEANED_EXT), &path(dir, base, SWAP_EXT))?;
    backend.sync_dir(dir)?;
    failpoint::hit("cleaner mid swap");
    Ok(())
}

/// Step 3 (caller holds the partition lock): the swap file replaces `<base>.log`; the caller
/// rebuilds the index.
pub fn install(backend: &dyn StorageBackend, dir: &Path, base: i64) -> io::Result<()> {
    backend.remove_file(&path(dir, base, "index"))?;
    backend.rename(&path(dir, base, SWAP_EXT), &path(dir, base, "log"))?;
    backend.sync_dir(dir)
}

/// Removes the cleaned copy of `base` at whatever step it is.
pub fn discard(backend: &dyn StorageBackend, dir: &Path, base: i64) -> io::Result<()> {
    backend.remove_file(&path(dir, base, CLEANED_EXT))?;
    backend.remove_file(&path(dir, base, SWAP_EXT))?;
    backend.sync_dir(dir)
}

/// Recovery, before segments are opened: deletes `.cleaned` files and completes (or, without
/// their segment, deletes) `.swap` files. Returns how many swaps it completed.
pub fn finish_interrupted(backend: &dyn StorageBackend, dir: &Path) -> io::Result<usize> {
    let entries = backend.list(dir)?;
    let names: Vec<&str> = entries
        .iter()
        .filter(|e| !e.is_dir)
        .map(|e| e.name.as_str())
        .collect();
    let mut changed = false;
    let mut completed = 0;
    for name in &names {
        let Some((base, ext)) = segment::parse_file_name(name) else {
            continue;
        };
        match ext {
            CLEANED_EXT => {
                tracing::info!(file = %dir.join(name).display(), "removing an unfinished cleaned segment (the cleaner was interrupted before its swap)");
                backend.remove_file(&dir.join(name))?;
                changed = true;
            }
            SWAP_EXT => {
                let log = segment::file_name(base, "log");
                if names.contains(&log.as_str()) {
                    tracing::info!(file = %dir.join(name).display(), "completing an interrupted cleaner swap");
                    backend.remove_file(&path(dir, base, "index"))?;
                    backend.rename(&dir.join(name), &dir.join(&log))?;
                    completed += 1;
                } else {
                    tracing::info!(file = %dir.join(name).display(), "removing the swap file of a deleted segment");
                    backend.remove_file(&dir.join(name))?;
                }
                changed = true;
            }
            _ => {}
        }
    }
    if changed {
        backend.sync_dir(dir)?;
    }
    Ok(completed)
}
