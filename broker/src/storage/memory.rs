//! The in-memory backend: the log's files as byte vectors behind the same seam as the disk.
//! It models durability (what a crash would keep) so tests can freeze fsync after the Nth call,
//! fail writes, and reopen a store on the [`MemBackend::crash_image`] of another.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::{Bytes, BytesMut};

use super::backend::{BackendFile, DirEntry, StorageBackend};
use crate::bufpool::{self, BUFFER as WARM_BUFFER};

/// Counters of injected faults; negative means "never fail".
#[derive(Debug)]
struct Faults {
    syncs_left: AtomicI64,
    writes_left: AtomicI64,
    /// While set, syncs wait (see [`MemBackend::hold_syncs`]); the count of waiting syncs.
    held: Mutex<(bool, usize)>,
    released: Condvar,
}

impl Faults {
    /// Consumes one unit of `counter`; false once it is exhausted.
    fn take(counter: &AtomicI64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                n if n < 0 => Some(n),
                0 => None,
                n => Some(n - 1),
            })
            .is_ok()
    }
    fn sync(&self) -> io::Result<()> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.0 {
            held.1 += 1;
            self.released.notify_all();
            while held.0 {
                held = self.released.wait(held).unwrap_or_else(|p| p.into_inner());
            }
            held.1 -= 1;
        }
        drop(held);
        if Self::take(&self.syncs_left) {
            Ok(())
        } else {
            Err(io::Error::other("injected fsync failure"))
        }
    }
    fn write(&self) -> io::Result<()> {
        if Self::take(&self.writes_left) {
            Ok(())
        } else {
            Err(io::Error::other("injected write failure"))
        }
    }
}

/// Largest buffer reserved ahead for appends to one file.
const MAX_TAIL_RESERVE: usize = 4 * 1024 * 1024;

/// Appends of at least this many bytes (a produced batch of a log segment) go into pooled
/// buffers from a file's start, or are kept as the caller's own bytes
/// ([`BackendFile::append_shared`]); smaller ones grow a small file in proportion.
const LARGE_APPEND: usize = 64 * 1024;

/// A file's bytes as immutable chunks plus a growing tail. A read that reaches the tail
/// freezes it (without copying) first, so reads hand out slices of the stored memory
/// instead of copies; only a read spanning several chunks is copied.
#[derive(Debug, Default)]
struct Chunks {
    /// Frozen pieces in file order, each with its start position.
    frozen: Vec<(usize, Bytes)>,
    /// File position of `tail`'s first byte.
    tail_start: usize,
    /// The bytes after the frozen pieces.
    tail: BytesMut,
}

impl Chunks {
    fn from_slice(data: &[u8]) -> Chunks {
        let mut c = Chunks::default();
        c.tail = BytesMut::from(data);
        c
    }

    fn len(&self) -> usize {
        self.tail_start + self.tail.len()
    }

    fn freeze_tail(&mut self) {
        if !self.tail.is_empty() {
            let part = self.tail.split().freeze();
            let start = self.tail_start;
            self.tail_start += part.len();
            self.frozen.push((start, part));
        }
    }

    fn extend(&mut self, data: &[u8]) {
        self.extend_parts(&[data]);
    }

    fn extend_parts(&mut self, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let small = len < LARGE_APPEND && self.len() + len < WARM_BUFFER;
        if self.tail.capacity() - self.tail.len() < len && small {
            // Reserve in proportion to the file, so small files (indexes) stay small.
            let ahead = self.len().clamp(4096, MAX_TAIL_RESERVE);
            self.tail.reserve(len.max(ahead));
        }
        // A large file or append fills its buffer to the end and goes on in the next (a read
        // across the seam is copied, as for any read spanning two frozen pieces).
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let room = self.tail.capacity() - self.tail.len();
                if room == 0 {
                    self.freeze_tail();
                    self.tail = bufpool::take();
                    continue;
                }
                let n = room.min(rest.len());
                self.tail.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
        }
    }

    /// Appends `parts`, keeping each large one as a piece of its own instead of copying it:
    /// the caller's bytes (a produce request's batch) become the file's. Small parts are
    /// copied into the tail as by [`Chunks::extend_parts`].
    fn extend_shared(&mut self, parts: &[Bytes]) {
        for part in parts {
            if part.len() >= LARGE_APPEND {
                self.freeze_tail();
                self.frozen.push((self.tail_start, part.clone()));
                self.tail_start += part.len();
            } else {
                self.extend(part);
            }
        }
    }

    /// Bytes `start..end` (clamped to the file).
    fn read(&mut self, start: usize, end: usize) -> Bytes {
        let end = end.min(self.len());
        if start >= end {
            return Bytes::new();
        }
        if end > self.tail_start {
            self.freeze_tail();
        }
        let first = self
            .frozen
            .partition_point(|(s, _)| *s <= start)
            .saturating_sub(1);
        let mut out: Option<BytesMut> = None;
        for (s, chunk) in &self.frozen[first..] {
            if *s >= end {
                break;
            }
            let from = start.saturating_sub(*s);
            let to = (end - *s).min(chunk.len());
            if from >= to {
                continue;
            }
            if out.is_none() && *s + to == end {
                // The whole range lies in this chunk: share it.
                return chunk.slice(from..to);
            }
            out.get_or_insert_with(|| BytesMut::with_capacity(end - start))
                .extend_from_slice(&chunk[from..to]);
        }
        out.map_or_else(Bytes::new, BytesMut::freeze)
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.tail_start {
            self.tail.truncate(len - self.tail_start);
            return;
        }
        self.tail = BytesMut::new();
        self.frozen.retain(|(s, _)| *s < len);
        if let Some((s, chunk)) = self.frozen.last_mut() {
            chunk.truncate(len - *s);
        }
        self.tail_start = len;
    }

    fn prefix_vec(&mut self, len: usize) -> Vec<u8> {
        self.read(0, len).to_vec()
    }

    /// Takes the file's buffers out for reuse: each allocation that no reader still shares,
    /// once. Frozen pieces of one buffer share its allocation, so all but the last piece of
    /// each fail to convert and are dropped, which leaves the last one the only handle.
    fn reclaim(&mut self) -> Vec<BytesMut> {
        let mut out: Vec<BytesMut> = self
            .frozen
            .drain(..)
            .filter_map(|(_, piece)| piece.try_into_mut().ok())
            .collect();
        out.push(std::mem::take(&mut self.tail));
        self.tail_start = 0;
        out
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        for buf in self.reclaim() {
            bufpool::give_back(buf);
        }
    }
}

#[derive(Debug, Default)]
struct MemData {
    bytes: Chunks,
    /// Length of the prefix that a crash keeps.
    synced: usize,
    /// Whether the file's directory entry survives a crash.
    durable_entry: bool,
}

/// A file of the [`MemBackend`].
#[derive(Debug)]
struct MemFile {
    data: Mutex<MemData>,
    faults: Arc<Faults>,
}

impl MemFile {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemData> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BackendFile for MemFile {
    fn len(&self) -> u64 {
        self.lock().bytes.len() as u64
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        self.faults.write()?;
        let mut d = self.lock();
        let pos = d.bytes.len() as u64;
        d.bytes.extend(data);
        Ok(pos)
    }

    fn append_parts(&self, parts: &[&[u8]]) -> io::Result<u64> {
        self.faults.write()?;
        let mut d = self.lock();
        let pos = d.bytes.len() as u64;
        d.bytes.extend_parts(parts);
        Ok(pos)
    }

    fn append_shared(&self, parts: &[Bytes]) -> io::Result<u64> {
        self.faults.write()?;
        let mut d = self.lock();
        let pos = d.bytes.len() as u64;
        d.bytes.extend_shared(parts);
        Ok(pos)
    }

    fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let mut d = self.lock();
        let start = usize::try_from(pos)
            .unwrap_or(usize::MAX)
            .min(d.bytes.len());
        let end = start.saturating_add(len).min(d.bytes.len());
        Ok(d.bytes.read(start, end))
    }

    fn sync(&self) -> io::Result<()> {
        self.faults.sync()?;
        let mut d = self.lock();
        d.synced = d.bytes.len();
        Ok(())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.faults.write()?;
        let mut d = self.lock();
        let len = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(d.bytes.len());
        d.bytes.truncate(len);
        d.synced = d.synced.min(len);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Tree {
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, Arc<MemFile>>,
}

/// The in-memory backend. Clones share the same files.
#[derive(Debug, Clone)]
pub struct MemBackend {
    tree: Arc<Mutex<Tree>>,
    faults: Arc<Faults>,
}

impl Default for MemBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemBackend {
    /// An empty backend that never fails.
    pub fn new() -> Self {
        MemBackend {
            tree: Arc::new(Mutex::new(Tree::default())),
            faults: Arc::new(Faults {
                syncs_left: AtomicI64::new(-1),
                writes_left: AtomicI64::new(-1),
                held: Mutex::new((false, 0)),
                released: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After `n` more successful syncs (file syncs, directory syncs and atomic writes), every
    /// later one fails: nothing written afterwards becomes durable.
    pub fn fail_syncs_after(&self, n: u64) {
        self.faults
            .syncs_left
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// Makes every later sync (of a file, a directory or an atomic write) wait until
    /// [`MemBackend::release_syncs`]: a slow disk, for tests of what may go on during an
    /// fsync.
    pub fn hold_syncs(&self) {
        self.faults.held.lock().unwrap_or_else(|p| p.into_inner()).0 = true;
    }

    /// Lets held syncs (and later ones) go on.
    pub fn release_syncs(&self) {
        self.faults.held.lock().unwrap_or_else(|p| p.into_inner()).0 = false;
        self.faults.released.notify_all();
    }

    /// Waits until at least `n` syncs wait in [`MemBackend::hold_syncs`]; false if that did
    /// not happen within `limit`.
    pub fn wait_for_held_syncs(&self, n: usize, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut held = self.faults.held.lock().unwrap_or_else(|p| p.into_inner());
        while held.1 < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            held = self
                .faults
                .released
                .wait_timeout(held, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// After `n` more successful writes (appends and truncations), every later one fails.
    pub fn fail_writes_after(&self, n: u64) {
        self.faults
            .writes_left
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// A new, fault-free backend holding only what a crash right now would leave: files whose
    /// directory entry was synced, cut to their synced length.
    pub fn crash_image(&self) -> MemBackend {
        let image = MemBackend::new();
        {
            let tree = self.lock();
            let mut out = image.lock();
            out.dirs = tree.dirs.clone();
            for (path, file) in &tree.files {
                let mut d = file.lock();
                if !d.durable_entry {
                    continue;
                }
                let synced = d.synced;
                let kept = d.bytes.prefix_vec(synced);
                let synced = kept.len();
                out.files.insert(
                    path.clone(),
                    Arc::new(MemFile {
                        data: Mutex::new(MemData {
                            bytes: Chunks::from_slice(&kept),
                            synced,
                            durable_entry: true,
                        }),
                        faults: Arc::clone(&image.faults),
                    }),
                );
            }
        }
        image
    }

    fn check_parent(tree: &Tree, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() && !tree.dirs.contains(p) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", p.display()),
            )),
            _ => Ok(()),
        }
    }
}

impl StorageBackend for MemBackend {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut tree = self.lock();
        for a in dir.ancestors() {
            if !a.as_os_str().is_empty() {
                tree.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let tree = self.lock();
        if !tree.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ));
        }
        let name_of = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
        let mut out: Vec<DirEntry> = tree
            .dirs
            .iter()
            .filter(|d| d.parent() == Some(dir))
            .filter_map(|d| name_of(d).map(|name| DirEntry { name, is_dir: true }))
            .chain(
                tree.files
                    .keys()
                    .filter(|f| f.parent() == Some(dir))
                    .filter_map(|f| {
                        name_of(f).map(|name| DirEntry {
                            name,
                            is_dir: false,
                        })
                    }),
            )
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn BackendFile>> {
        let mut tree = self.lock();
        if let Some(f) = tree.files.get(path) {
            return Ok(Arc::clone(f) as Arc<dyn BackendFile>);
        }
        Self::check_parent(&tree, path)?;
        let f = Arc::new(MemFile {
            data: Mutex::new(MemData::default()),
            faults: Arc::clone(&self.faults),
        });
        tree.files.insert(path.to_path_buf(), Arc::clone(&f));
        Ok(f)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.lock().files.remove(path);
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut tree = self.lock();
        tree.files.retain(|p, _| !p.starts_with(dir));
        tree.dirs.retain(|p| !p.starts_with(dir));
        Ok(())
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let tree = self.lock();
        Ok(tree.files.get(path).map(|f| {
            let mut d = f.lock();
            let len = d.bytes.len();
            d.bytes.prefix_vec(len)
        }))
    }

    fn write_file_atomic(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        self.faults.write()?;
        self.faults.sync()?;
        let mut tree = self.lock();
        Self::check_parent(&tree, path)?;
        let f = Arc::new(MemFile {
            data: Mutex::new(MemData {
                bytes: Chunks::from_slice(data),
                synced: data.len(),
                durable_entry: true,
            }),
            faults: Arc::clone(&self.faults),
        });
        tree.files.insert(path.to_path_buf(), f);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.faults.write()?;
        let mut tree = self.lock();
        Self::check_parent(&tree, to)?;
        let f = tree.files.remove(from).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", from.display()),
            )
        })?;
        // The new name is durable once the directory is synced, like a created file.
        f.lock().durable_entry = false;
        tree.files.insert(to.to_path_buf(), f);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.faults.sync()?;
        let tree = self.lock();
        for (p, f) in &tree.files {
            if p.parent() == Some(dir) {
                f.lock().durable_entry = true;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_file_reads_match_a_flat_copy_across_freezes_and_truncation() {
        let mut c = Chunks::default();
        let mut flat: Vec<u8> = Vec::new();
        let mut n = 0u8;
        for round in 0..200usize {
            let piece: Vec<u8> = (0..(round * 37) % 5000 + 1)
                .map(|_| {
                    n = n.wrapping_add(1);
                    n
                })
                .collect();
            c.extend(&piece);
            flat.extend_from_slice(&piece);
            // Reads reaching the tail freeze it; compare a few ranges each round.
            let len = flat.len();
            for (a, b) in [
                (0, len),
                (len / 3, len),
                (len / 2, len / 2 + 10),
                (len, len + 5),
            ] {
                assert_eq!(&c.read(a, b)[..], &flat[a.min(len)..b.min(len)], "{a}..{b}");
            }
            if round % 50 == 49 {
                let keep = len * 2 / 3;
                c.truncate(keep);
                flat.truncate(keep);
                assert_eq!(c.len(), keep);
            }
        }
        assert_eq!(c.prefix_vec(flat.len()), flat);
    }

    #[test]
    fn a_large_file_spans_warm_buffers_without_losing_bytes() {
        let mut c = Chunks::default();
        let mut flat: Vec<u8> = Vec::new();
        // 1 MB appends of two parts each, past several buffers, with reads in between.
        for round in 0..14u8 {
            let head = [round; 8];
            let body: Vec<u8> = (0..1_000_000u32).map(|i| (i as u8) ^ round).collect();
            c.extend_parts(&[&head, &body]);
            flat.extend_from_slice(&head);
            flat.extend_from_slice(&body);
            let len = flat.len();
            if round % 3 == 0 {
                let (a, b) = (len.saturating_sub(1_500_000), len);
                assert_eq!(&c.read(a, b)[..], &flat[a..b], "{a}..{b}");
            }
        }
        assert!(c.len() > 3 * WARM_BUFFER);
        for start in (0..flat.len()).step_by(WARM_BUFFER / 2) {
            let end = (start + 1_000_003).min(flat.len());
            assert_eq!(&c.read(start, end)[..], &flat[start..end], "{start}..{end}");
        }
        c.truncate(WARM_BUFFER + 17);
        flat.truncate(WARM_BUFFER + 17);
        c.extend(b"after");
        flat.extend_from_slice(b"after");
        assert_eq!(c.prefix_vec(flat.len()), flat);
    }

    #[test]
    fn large_shared_parts_are_kept_uncopied_and_read_back_with_the_copied_ones() {
        let mut c = Chunks::default();
        let mut flat: Vec<u8> = Vec::new();
        let mut kept: Vec<(usize, Bytes)> = Vec::new();
        for round in 0..12u32 {
            // A batch as the log writes it: a fresh 8-byte offset, then the request's bytes.
            let offset = Bytes::copy_from_slice(&u64::from(round).to_be_bytes());
            let size = if round % 3 == 0 {
                1000
            } else {
                100_000 + round as usize
            };
            let body: Bytes = (0..size).map(|i| (i as u8) ^ (round as u8)).collect();
            let at = c.len() + 8;
            c.extend_shared(&[offset.clone(), body.clone()]);
            flat.extend_from_slice(&offset);
            flat.extend_from_slice(&body);
            if body.len() >= LARGE_APPEND {
                kept.push((at, body));
            }
            // Reads across the seams, and within a kept part.
            let len = flat.len();
            for (a, b) in [(0, len), (len - size, len), (at - 8, at + 3), (at + 5, len)] {
                assert_eq!(&c.read(a, b)[..], &flat[a..b], "{a}..{b}");
            }
        }
        // A read within a kept part is the caller's memory itself.
        for (at, body) in &kept {
            let read = c.read(*at, *at + body.len());
            assert_eq!(read.as_ptr(), body.as_ptr());
        }
        let cut = kept[2].0 + 50;
        c.truncate(cut);
        flat.truncate(cut);
        c.extend_shared(&[Bytes::from_static(b"after")]);
        flat.extend_from_slice(b"after");
        assert_eq!(c.prefix_vec(flat.len()), flat);
    }

    #[test]
    fn a_deleted_files_buffers_are_reclaimed_unless_a_reader_still_holds_them() {
        let mut c = Chunks::default();
        let mb: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
        // Ten 1 MB appends with reads in between (each read freezes a piece of the tail)
        // fill two whole buffers and part of a third.
        for _ in 0..10 {
            c.extend(&mb);
            let len = c.len();
            let _ = c.read(len - 10, len);
        }
        assert_eq!(c.len(), 10_000_000);
        // A reader still holds a slice of the first buffer: that one is not reclaimed.
        let held = c.read(100, 200);
        let starts: Vec<usize> = c.frozen.iter().map(|(_, b)| b.as_ptr() as usize).collect();
        let reusable: Vec<BytesMut> = c
            .reclaim()
            .into_iter()
            .filter_map(bufpool::reusable)
            .collect();
        // The second and third buffers come back, each through its last frozen piece, whole
        // and empty, at the address of its first piece.
        assert_eq!(reusable.len(), 2);
        for buf in &reusable {
            assert!(buf.is_empty() && buf.capacity() >= WARM_BUFFER);
            assert!(starts.contains(&(buf.as_ptr() as usize)));
        }
        assert_eq!(&held[..], &mb[100..200]);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn crash_image_keeps_only_synced_prefix_of_synced_entries() {
        let b = MemBackend::new();
        let dir = Path::new("/m/t-0");
        b.create_dir_all(dir).unwrap();
        let f = b.open(&dir.join("a")).unwrap();
        f.append(b"durable").unwrap();
        f.sync().unwrap();
        f.append(b"-lost").unwrap();
        let unlisted = b.open(&dir.join("b")).unwrap();
        unlisted.append(b"x").unwrap();
        unlisted.sync().unwrap();
        // Neither directory entry is synced yet: a crash loses both files.
        let img = b.crash_image();
        assert_eq!(img.read_file(&dir.join("a")).unwrap(), None);
        b.sync_dir(dir).unwrap();
        let img = b.crash_image();
        assert_eq!(
            img.read_file(&dir.join("a")).unwrap(),
            Some(b"durable".to_vec())
        );
        assert_eq!(img.read_file(&dir.join("b")).unwrap(), Some(b"x".to_vec()));
    }

    #[test]
    fn syncs_fail_after_budget() {
        let b = MemBackend::new();
        b.create_dir_all(Path::new("/d")).unwrap();
        let f = b.open(Path::new("/d/f")).unwrap();
        b.sync_dir(Path::new("/d")).unwrap();
        b.fail_syncs_after(1);
        f.append(b"one").unwrap();
        f.sync().unwrap();
        f.append(b"two").unwrap();
        assert!(f.sync().is_err());
        assert_eq!(
            b.crash_image().read_file(Path::new("/d/f")).unwrap(),
            Some(b"one".to_vec())
        );
        assert!(b.open(Path::new("/nodir/f")).is_err());
    }
}
