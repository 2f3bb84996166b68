//! [`Appender`]: appends whole frames to one of the broker's own logs (the group offsets log,
//! the transaction log) so that a failed write or fsync never leaves bytes that later records
//! land behind. The rules are the partition logs':
//!
//! - a failed write is cut back to the file's length before it (the last whole frame), so
//!   the next append starts where a reader expects a frame;
//! - after a failed fsync, or a cut that failed, nothing is known about what reached the
//!   disk: the log goes offline and every later append and sync fails, naming the first
//!   failure, until a restart reads back what the disk holds.
//!
//! All file access goes through [`LogFile`], the seam unit tests inject faults through.

use std::fs::File;
use std::io::{self, Write};

/// The operations an [`Appender`] needs from its file (opened for appends: every write goes
/// to the current end, also after [`LogFile::set_len`]).
pub trait LogFile: Send + std::fmt::Debug {
    /// Writes all of `bytes` at the end of the file.
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl LogFile for File {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        Write::write_all(self, bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

/// Appends frames to a log file; see the module docs.
#[derive(Debug)]
pub struct Appender {
    file: Box<dyn LogFile>,
    /// Length of the file up to its last whole frame.
    len: u64,
    /// Why the log went offline, if it did.
    offline: Option<String>,
}

impl Appender {
    /// An appender of `file` (opened for appends), `len` bytes long.
    pub fn new(file: impl LogFile + 'static, len: u64) -> Self {
        Appender {
            file: Box::new(file),
            len,
            offline: None,
        }
    }

    /// The file's length up to its last whole frame.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Why the log is offline, if it is.
    pub fn offline(&self) -> Option<&str> {
        self.offline.as_deref()
    }

    fn check_online(&self) -> io::Result<()> {
        match &self.offline {
            Some(why) => Err(io::Error::other(format!(
                "log offline until restart: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn go_offline(&mut self, why: String) {
        tracing::error!(reason = %why, "broker log offline until restart");
        self.offline.get_or_insert(why);
    }

    /// Appends one whole frame, and fsyncs it if `sync`. On a failed write the file is cut
    /// back to its previous length; a failed fsync (or cut) takes the log offline.
    pub fn append(&mut self, frame: &[u8], sync: bool) -> io::Result<()> {
        self.check_online()?;
        if let Err(e) = self.file.write_all(frame) {
            if let Err(cut) = self.file.set_len(self.len) {
                self.go_offline(format!(
                    "a failed write ({e}) could not be cut back to {} bytes: {cut}",
                    self.len
                ));
            }
            return Err(e);
        }
        if sync {
            if let Err(e) = self.file.sync_data() {
                // The caller answers this record as failed: drop it from the file as far as
                // that still helps, and accept nothing more.
                let _ = self.file.set_len(self.len);
                self.go_offline(format!("fsync failed: {e}"));
                return Err(e);
            }
        }
        self.len += frame.len() as u64;
        Ok(())
    }

    /// Makes every appended frame durable; a failure takes the log offline.
    pub fn sync(&mut self) -> io::Result<()> {
        self.check_online()?;
        self.file.sync_data().inspect_err(|e| {
            self.go_offline(format!("fsync failed: {e}"));
        })
    }

    /// Wraps the file (tests inject faults with it).
    #[cfg(test)]
    pub fn wrap_file(&mut self, wrap: impl FnOnce(Box<dyn LogFile>) -> Box<dyn LogFile>) {
        let file = std::mem::replace(&mut self.file, Box::new(Unset));
        self.file = wrap(file);
    }
}

/// Placeholder while [`Appender::wrap_file`] swaps files.
#[cfg(test)]
#[derive(Debug)]
struct Unset;

#[cfg(test)]
impl LogFile for Unset {
    fn write_all(&mut self, _: &[u8]) -> io::Result<()> {
        Err(io::Error::other("no file"))
    }
    fn sync_data(&mut self) -> io::Result<()> {
        Err(io::Error::other("no file"))
    }
    fn set_len(&mut self, _: u64) -> io::Result<()> {
        Err(io::Error::other("no file"))
    }
}

/// A file that fails on command, for tests of what the logs do after a failed write or fsync.
#[cfg(test)]
pub mod faulty {
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::LogFile;

    /// Which operations fail; shared with the test that flips them.
    #[derive(Debug, Default)]
    pub struct Faults {
        /// The next writes store half their bytes, then fail (as a full disk does).
        pub torn_write: AtomicBool,
        /// The next fsyncs fail.
        pub sync: AtomicBool,
    }

    /// A [`LogFile`] that fails as [`Faults`] say.
    #[derive(Debug)]
    pub struct FaultyFile {
        /// The real file.
        pub inner: Box<dyn LogFile>,
        /// What fails.
        pub faults: Arc<Faults>,
    }

    impl LogFile for FaultyFile {
        fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
            if self.faults.torn_write.load(Ordering::SeqCst) {
                self.inner.write_all(&bytes[..bytes.len() / 2])?;
                return Err(io::Error::other("injected: no space left on device"));
            }
            self.inner.write_all(bytes)
        }
        fn sync_data(&mut self) -> io::Result<()> {
            if self.faults.sync.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected: fsync failed"));
            }
            self.inner.sync_data()
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
    }
}
