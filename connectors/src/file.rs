//! A file sink writing JSON lines. Exactly-once mode: each subtask writes into a hidden
//! in-progress file; at barrier n the file is flushed and fsynced (pre-commit) and remembered
//! in checkpoint n; when n is complete it is renamed to `part-<subtask>-<n>.jsonl` (commit,
//! idempotent: an already renamed file counts as committed). Recovery commits the restored
//! checkpoint's pending files and deletes every other in-progress file. At-least-once mode
//! writes visible files directly and only flushes at barriers (replays duplicate records).

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use onceflow_runtime::{async_trait, CheckpointId, Error, Result, Sink, SinkFactory, SubtaskInfo};
use serde::{Deserialize, Serialize};

const IN_PROGRESS_PREFIX: &str = ".inprogress-";

/// Delivery guarantee of the file sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileSinkMode {
    /// Two-phase commit with the checkpoints.
    ExactlyOnce,
    /// Write visible files directly (duplicates after a restore).
    AtLeastOnce,
}

/// Builds file sink subtasks writing into a directory.
#[derive(Clone, Debug)]
pub struct FileSink {
    dir: PathBuf,
    mode: FileSinkMode,
}

impl FileSink {
    /// An exactly-once file sink into `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileSink {
            dir: dir.into(),
            mode: FileSinkMode::ExactlyOnce,
        }
    }

    /// Sets the delivery mode.
    pub fn mode(mut self, mode: FileSinkMode) -> Self {
        self.mode = mode;
        self
    }
}

/// A pre-committed file: `staged` becomes `target` on commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePending {
    /// The synced in-progress file.
    pub staged: PathBuf,
    /// The visible name it gets on commit.
    pub target: PathBuf,
}

/// One subtask of the file sink.
pub struct FileSinkWriter {
    dir: PathBuf,
    mode: FileSinkMode,
    subtask: usize,
    run_id: u128,
    seq: u64,
    current: Option<(PathBuf, BufWriter<fs::File>)>,
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

impl FileSinkWriter {
    fn open_file(&mut self) -> Result<()> {
        if self.current.is_some() {
            return Ok(());
        }
        self.seq += 1;
        let name = match self.mode {
            FileSinkMode::ExactlyOnce => format!(
                "{IN_PROGRESS_PREFIX}{:03}-{}-{}",
                self.subtask, self.run_id, self.seq
            ),
            FileSinkMode::AtLeastOnce => {
                format!(
                    "part-{:03}-r{}-{}.jsonl",
                    self.subtask, self.run_id, self.seq
                )
            }
        };
        let path = self.dir.join(name);
        let f = fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
        self.current = Some((path, BufWriter::with_capacity(64 * 1024, f)));
        Ok(())
    }

    fn commit_file(&self, p: &FilePending) -> Result<()> {
        if p.staged.exists() {
            fs::rename(&p.staged, &p.target).map_err(|e| Error::io(&p.target, e))?;
            return sync_dir(&self.dir);
        }
        if p.target.exists() {
            return Ok(()); // committed before
        }
        Err(Error::Connector(format!(
            "pre-committed file {} is gone and {} does not exist: output of a complete checkpoint was lost",
            p.staged.display(),
            p.target.display()
        )))
    }
}

#[async_trait]
impl<T: Serialize + Send + 'static> Sink<T> for FileSinkWriter {
    type Pending = FilePending;

    async fn recover(&mut self, pending: Vec<FilePending>) -> Result<()> {
        for p in &pending {
            self.commit_file(p)?;
        }
        if self.subtask == 0 && self.mode == FileSinkMode::ExactlyOnce {
            let rd = fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
                let name = entry.file_name();
                if name.to_string_lossy().starts_with(IN_PROGRESS_PREFIX) {
                    let path = entry.path();
                    tracing::info!(file = %path.display(), "file sink: removing uncommitted output of a previous run");
                    fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                }
            }
        }
        Ok(())
    }

    async fn write_batch(&mut self, records: Vec<T>) -> Result<()> {
        self.open_file()?;
        let Some((path, w)) = self.current.as_mut() else {
            return Err(Error::Internal("file sink has no open file".into()));
        };
        for r in &records {
            serde_json::to_writer(&mut *w, r).map_err(Error::serialization)?;
            w.write_all(b"\n").map_err(|e| Error::io(&*path, e))?;
        }
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Option<FilePending>> {
        let Some((path, w)) = self.current.as_mut() else {
            return Ok(None);
        };
        w.flush().map_err(|e| Error::io(&*path, e))?;
        w.get_ref().sync_all().map_err(|e| Error::io(&*path, e))?;
        if self.mode == FileSinkMode::AtLeastOnce {
            return Ok(None);
        }
        let (staged, _) = self.current.take().expect("checked above");
        Ok(Some(FilePending {
            staged,
            target: self
                .dir
                .join(format!("part-{:03}-{checkpoint:020}.jsonl", self.subtask)),
        }))
    }

    async fn commit(&mut self, _checkpoint: CheckpointId, pending: FilePending) -> Result<()> {
        self.commit_file(&pending)
    }

    async fn abort(&mut self, pending: FilePending) -> Result<()> {
        match fs::remove_file(&pending.staged) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&pending.staged, e)),
        }
    }
}

impl<T: Serialize + Send + 'static> SinkFactory<T> for FileSink {
    type Sink = FileSinkWriter;

    fn create(&self, info: &SubtaskInfo) -> Result<FileSinkWriter> {
        fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let run_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(FileSinkWriter {
            dir: self.dir.clone(),
            mode: self.mode,
            subtask: info.index,
            run_id,
            seq: 0,
            current: None,
        })
    }
}

/// Reads every committed (visible) line of a file sink's directory, in file-name order.
pub fn read_committed_lines(dir: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("part-"))
        })
        .collect();
    files.sort();
    let mut lines = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        lines.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
    }
    Ok(lines)
}
