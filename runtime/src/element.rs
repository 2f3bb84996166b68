//! Stream elements: the shared vocabulary that flows on every edge (records, watermarks,
//! checkpoint barriers, end of stream).

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Identifier of a checkpoint; increases monotonically across restarts of a job (0 = none).
pub type CheckpointId = u64;

/// A type that can flow through a stream: cloneable, sendable and serde-serializable.
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> Data for T {}

/// A type usable as a key of a keyed stream.
pub trait Key: Data + std::hash::Hash + Eq + Sync {}
impl<T: Data + std::hash::Hash + Eq + Sync> Key for T {}

/// A checkpoint barrier: everything before it belongs to checkpoint `checkpoint_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    /// The checkpoint this barrier delimits.
    pub checkpoint_id: CheckpointId,
    /// Wall-clock time the coordinator triggered it (ms since the Unix epoch).
    pub timestamp_ms: u64,
    /// The last checkpoint of the job: sources end their streams after it.
    pub is_final: bool,
}

/// An event-time watermark: no record with a smaller timestamp (ms) is expected any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Watermark(pub i64);

/// One element on an edge. Records travel in small batches to amortise channel costs;
/// the order of elements on one channel is the order the producer emitted them.
#[derive(Debug)]
pub enum StreamElement<T> {
    /// A batch of records (never empty).
    Records(Vec<T>),
    /// An event-time watermark.
    Watermark(Watermark),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// (event time) The producer's watermark is idle (`true`: it has no active input, leave
    /// it out of the minimum) or active again (`false`).
    Idleness(bool),
    /// The producer finished; nothing follows.
    EndOfStream,
}

/// The input of a two-input operator: which side a record came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TwoInputs<A, B> {
    /// A record of the first input.
    First(A),
    /// A record of the second input.
    Second(B),
}
