//! One live instance per checkpoint directory: an OS lock on `<dir>/.instance-lock`, released
//! by the OS whenever the process ends (kill -9 included), and the wait for a fenced older
//! instance to let go of it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kafka::{KafkaError, Result};

/// The lock file's path in `dir`.
pub(crate) fn lock_path(dir: &Path) -> PathBuf {
    dir.join(".instance-lock")
}

/// Locks `<dir>/.instance-lock`; `None` if another live instance holds it.
pub(crate) fn try_lock(dir: &Path) -> Result<Option<File>> {
    let io = |what: &str, e: std::io::Error| KafkaError::Config(format!("{what}: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| {
        io(
            &format!("cannot create checkpoint directory {}", dir.display()),
            e,
        )
    })?;
    let path = lock_path(dir);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io(&format!("cannot open {}", path.display()), e))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(io(&format!("cannot lock {}", path.display()), e))
        }
    }
}

/// Waits until the fenced older instance released the lock. It fails at its next seal or
/// commit, so this takes about a checkpoint interval; gives up after `limit`.
pub(crate) fn wait_for(dir: &Path, limit: Duration) -> Result<File> {
    let t0 = Instant::now();
    loop {
        if let Some(f) = try_lock(dir)? {
            tracing::info!(
                waited_ms = t0.elapsed().as_millis() as u64,
                "the older instance stopped"
            );
            return Ok(f);
        }
        if t0.elapsed() > limit {
            return Err(KafkaError::Config(format!(
                "the instance holding {} was fenced but did not stop within {} s; stop it (kill it) and start again",
                lock_path(dir).display(),
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_lock(dir.path()).unwrap().expect("first lock");
        assert!(try_lock(dir.path()).unwrap().is_none());
        drop(first);
        assert!(wait_for(dir.path(), Duration::from_secs(5)).is_ok());
    }
}
