//! The storage seam: every byte the log reads or writes goes through [`StorageBackend`] and
//! [`BackendFile`]. [`FileBackend`] maps them onto `std::fs`; the in-memory backend in
//! [`super::memory`] runs the same log code without a disk and injects faults in tests.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File or directory name (not the full path).
    pub name: String,
    /// Whether the entry is a directory.
    pub is_dir: bool,
}

/// A file of the log (segment or index): append-only writes, positional reads.
pub trait BackendFile: Send + Sync + fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> u64;
    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends `data` at the end; returns the position it was written at.
    fn append(&self, data: &[u8]) -> io::Result<u64>;
    /// Appends the concatenation of `parts` at the end (without concatenating them in
    /// memory first); returns the position it was written at. On an error the file may hold
    /// a prefix of the parts: the caller truncates.
    fn append_parts(&self, parts: &[&[u8]]) -> io::Result<u64>;
    /// As [`BackendFile::append_parts`], for parts the caller hands over: a backend that keeps
    /// bytes in memory may keep these instead of copying them. The default writes them as
    /// [`BackendFile::append_parts`] does.
    fn append_shared(&self, parts: &[Bytes]) -> io::Result<u64> {
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        self.append_parts(&slices)
    }
    /// Reads up to `len` bytes at `pos`; shorter only at the end of the file.
    fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes>;
    /// Forces written data to stable storage.
    fn sync(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes.
    fn truncate(&self, len: u64) -> io::Result<()>;
}

/// File-system operations the store needs: a directory tree of append-only files plus small
/// files replaced atomically (registry, snapshots).
pub trait StorageBackend: Send + Sync + fmt::Debug {
    /// Creates a directory and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Lists a directory (`NotFound` if it does not exist).
    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>>;
    /// Opens a file for appending and reading, creating it empty if missing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn BackendFile>>;
    /// Removes a file (missing is not an error).
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory tree (missing is not an error).
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Reads a whole small file; `None` if it does not exist.
    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>>;
    /// Replaces a small file atomically and durably (temp file, fsync, rename, fsync dir).
    fn write_file_atomic(&self, path: &Path, data: &[u8]) -> io::Result<()>;
    /// Makes creations and removals of entries in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, atomically replacing `to` if it exists (durable once the
    /// directory is synced). Open handles of either file keep reading what they had.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
}

/// The durable backend on the local file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileBackend;

/// A file of the [`FileBackend`].
#[derive(Debug)]
struct DiskFile {
    file: File,
    len: Mutex<u64>,
}

impl BackendFile for DiskFile {
    fn len(&self) -> u64 {
        *self.len.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        let mut len = self.len.lock().unwrap_or_else(|p| p.into_inner());
        let pos = *len;
        self.file.write_all_at(data, pos)?;
        *len = pos + data.len() as u64;
        Ok(pos)
    }

    fn append_parts(&self, parts: &[&[u8]]) -> io::Result<u64> {
        let mut len = self.len.lock().unwrap_or_else(|p| p.into_inner());
        let pos = *len;
        let mut at = pos;
        for part in parts {
            self.file.write_all_at(part, at)?;
            at += part.len() as u64;
        }
        *len = at;
        Ok(pos)
    }

    fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let end = self.len().min(pos.saturating_add(len as u64));
        let want = end.saturating_sub(pos) as usize;
        let mut buf = BytesMut::zeroed(want);
        let mut done = 0;
        while done < want {
            match self.file.read_at(&mut buf[done..], pos + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(done);
        Ok(buf.freeze())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn truncate(&self, new_len: u64) -> io::Result<()> {
        let mut len = self.len.lock().unwrap_or_else(|p| p.into_inner());
        self.file.set_len(new_len)?;
        *len = new_len;
        Ok(())
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

impl StorageBackend for FileBackend {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            out.push(DirEntry {
                name,
                is_dir: entry.file_type()?.is_dir(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn BackendFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(Arc::new(DiskFile {
            file,
            len: Mutex::new(len),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        match fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        match fs::read(path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_file_atomic(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let tmp = tmp_path(path);
        {
            let f = File::create(&tmp)?;
            f.write_all_at(data, 0)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            self.sync_dir(dir)?;
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_file_appends_reads_truncates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = FileBackend;
        let p = dir.path().join("a.log");
        let f = b.open(&p).expect("open");
        assert_eq!(f.append(b"hello").unwrap(), 0);
        assert_eq!(f.append(b" world").unwrap(), 5);

        assert_eq!(&f.read_at(3, 5).unwrap()[..], b"lo wo");
        assert_eq!(&f.read_at(8, 100).unwrap()[..], b"rld");
        assert_eq!(f.append_parts(&[b"!", b"", b"?"]).unwrap(), 11);
        assert_eq!(&f.read_at(10, 3).unwrap()[..], b"d!?");
        f.sync().unwrap();
        f.truncate(5).unwrap();
        assert_eq!(f.len(), 5);
        drop(f);
        assert_eq!(b.open(&p).unwrap().len(), 5);
        b.write_file_atomic(&dir.path().join("r"), b"x").unwrap();
        assert_eq!(
            b.read_file(&dir.path().join("r")).unwrap(),
            Some(b"x".to_vec())
        );
        assert_eq!(b.read_file(&dir.path().join("missing")).unwrap(), None);
        let names: Vec<_> = b
            .list(dir.path())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec!["a.log", "r"]);
    }
}
