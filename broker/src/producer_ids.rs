//! Producer id allocation for InitProducerId, durable so ids are never reused after a restart.
//!
//! Ids are handed out from blocks: before the first id of a block is given away, the end of
//! the block is written to `<data dir>/`[`PRODUCER_ID_FILE`] (temp file, fsync, rename). After
//! a restart allocation resumes at the recorded end, so at most one block of ids is skipped.
//!
//! The file is `<end>\ncrc32c <hex of CRC-32C of the first line>\n`. It is only ever replaced
//! atomically, so it cannot be torn: a checksum mismatch is corruption and refuses the start
//! (reusing producer ids would let a new producer pass as an old one's duplicate). A file
//! without the checksum line (written by an older broker) is accepted as it is.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{BrokerError, Result};

/// File under the data dir holding the first producer id not yet reserved.
pub const PRODUCER_ID_FILE: &str = "producer-ids.next";

/// How many ids one durable reservation covers.
pub const BLOCK_SIZE: i64 = 1000;

/// Hands out producer ids.
pub struct ProducerIdAllocator {
    file: Option<PathBuf>,
    ids: Mutex<Reservation>,
}

struct Reservation {
    next: i64,
    reserved_until: i64,
}

impl ProducerIdAllocator {
    /// An allocator persisting into `data_dir` (or purely in memory when `None`).
    pub fn open(data_dir: Option<&Path>) -> Result<Self> {
        let file = data_dir.map(|d| d.join(PRODUCER_ID_FILE));
        let next = match &file {
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => decode(&text).map_err(|reason| BrokerError::Io {
                    context: format!("parsing {}", path.display()),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(source) => {
                    return Err(BrokerError::Io {
                        context: format!("reading {}", path.display()),
                        source,
                    })
                }
            },
            None => 0,
        };
        Ok(Self {
            file,
            ids: Mutex::new(Reservation {
                next,
                reserved_until: next,
            }),
        })
    }

    /// The next unused producer id. Blocks on a file write once per [`BLOCK_SIZE`] ids.
    pub fn allocate(&self) -> Result<i64> {
        let mut ids = self.ids.lock();
        if ids.next >= ids.reserved_until {
            let until = ids.next + BLOCK_SIZE;
            if let Some(path) = &self.file {
                write_durably(path, until)?;
            }
            ids.reserved_until = until;
        }
        let id = ids.next;
        ids.next += 1;
        Ok(id)
    }
}

fn write_durably(path: &Path, value: i64) -> Result<()> {
    use std::io::Write;
    let io = |context: &str, source| BrokerError::Io {
        context: format!("{context} {}", path.display()),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating temp file for", e))?;
    f.write_all(encode(value).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into", e))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing directory of", e))?;
    }
    Ok(())
}

fn encode(value: i64) -> String {
    let line = value.to_string();
    format!("{line}\ncrc32c {:08x}\n", crate::crc32c(line.as_bytes()))
}

fn decode(text: &str) -> std::result::Result<i64, String> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim();
    let value = first
        .parse::<i64>()
        .map_err(|e| format!("first line {first:?}: {e}"))?;
    let Some(check) = lines.next() else {
        return Ok(value);
    };
    let stored = check
        .strip_prefix("crc32c ")
        .and_then(|hex| u32::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| format!("second line {check:?} is not `crc32c HEX`"))?;
    let computed = crate::crc32c(first.as_bytes());
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is \
             corrupt; the broker will not guess the next producer id"
        ));
    }
    if lines.any(|l| !l.trim().is_empty()) {
        return Err("unexpected lines after the checksum".into());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let a = ProducerIdAllocator::open(Some(dir.path())).unwrap();
        let first: Vec<i64> = (0..3).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(first, vec![0, 1, 2]);
        drop(a);
        let b = ProducerIdAllocator::open(Some(dir.path())).unwrap();
        let next = b.allocate().unwrap();
        assert!(next > 2, "reused id {next}");
        assert_eq!(next, BLOCK_SIZE);
    }

    #[test]
    fn in_memory_allocator_counts_up() {
        let a = ProducerIdAllocator::open(None).unwrap();
        assert_eq!(a.allocate().unwrap(), 0);
        assert_eq!(a.allocate().unwrap(), 1);
    }

    #[test]
    fn flipped_digit_is_an_error_and_old_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PRODUCER_ID_FILE);
        let a = ProducerIdAllocator::open(Some(dir.path())).unwrap();
        a.allocate().unwrap();
        drop(a);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(decode(&text), Ok(BLOCK_SIZE));
        std::fs::write(&path, text.replacen('1', "7", 1)).unwrap();
        let err = ProducerIdAllocator::open(Some(dir.path())).err().unwrap();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        std::fs::write(&path, "5000\n").unwrap();
        let b = ProducerIdAllocator::open(Some(dir.path())).unwrap();
        assert_eq!(b.allocate().unwrap(), 5000);
    }

    #[test]
    fn garbage_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PRODUCER_ID_FILE), "not a number").unwrap();
        assert!(ProducerIdAllocator::open(Some(dir.path())).is_err());
    }
}
