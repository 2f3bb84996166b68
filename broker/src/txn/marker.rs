//! Which way a transaction ends. The COMMIT/ABORT control batches themselves are built and
//! parsed by the storage (`storage::txn_index`), which also keeps each partition's open
//! transactions, last stable offset and persisted aborted-transaction index.

/// Which way a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// The transaction's data becomes visible to read_committed readers.
    Commit,
    /// The transaction's data is skipped by read_committed readers.
    Abort,
}

impl MarkerKind {
    /// `Commit` for true, `Abort` for false.
    pub fn from_commit(commit: bool) -> Self {
        if commit {
            MarkerKind::Commit
        } else {
            MarkerKind::Abort
        }
    }

    /// Whether this is a commit.
    pub fn is_commit(self) -> bool {
        self == MarkerKind::Commit
    }

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            MarkerKind::Commit => "commit",
            MarkerKind::Abort => "abort",
        }
    }
}
