//! Output side of a subtask: routes records to downstream channels (forward, rebalance or by
//! key group), batches them, and broadcasts watermarks, barriers and end of stream.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::element::StreamElement;
use crate::keygroup::subtask_for_key_group;
use crate::{Error, Result};

/// Computes the key group of a record.
pub type KeyGroupFn<T> = Arc<dyn Fn(&T) -> u16 + Send + Sync>;

/// How records of an edge are distributed over the consumer's subtasks.
pub enum Partitioning<T> {
    /// Subtask i sends to subtask i if parallelisms match, otherwise round robin.
    Auto,
    /// Subtask i sends to subtask i (parallelisms must match).
    Forward,
    /// Round robin over all consumer subtasks.
    Rebalance,
    /// By key group (keyed edge).
    KeyGroups(KeyGroupFn<T>),
}

impl<T> Clone for Partitioning<T> {
    fn clone(&self) -> Self {
        match self {
            Partitioning::Auto => Partitioning::Auto,
            Partitioning::Forward => Partitioning::Forward,
            Partitioning::Rebalance => Partitioning::Rebalance,
            Partitioning::KeyGroups(f) => Partitioning::KeyGroups(f.clone()),
        }
    }
}

enum Route<T> {
    Single,
    RoundRobin(usize),
    KeyGroups {
        f: KeyGroupFn<T>,
        max_parallelism: usize,
    },
}

/// One producer subtask's writer for one edge.
pub struct EdgeWriter<T> {
    route: Route<T>,
    senders: Vec<mpsc::Sender<StreamElement<T>>>,
    buffers: Vec<Vec<T>>,
}

impl<T: Send + 'static> EdgeWriter<T> {
    /// A writer over `senders` (one per reachable consumer subtask).
    pub fn new(
        partitioning: &Partitioning<T>,
        senders: Vec<mpsc::Sender<StreamElement<T>>>,
        max_parallelism: usize,
    ) -> Self {
        let route = match partitioning {
            _ if senders.len() == 1 => Route::Single,
            Partitioning::KeyGroups(f) => Route::KeyGroups {
                f: f.clone(),
                max_parallelism,
            },
            _ => Route::RoundRobin(0),
        };
        let buffers = senders.iter().map(|_| Vec::new()).collect();
        EdgeWriter {
            route,
            senders,
            buffers,
        }
    }

    fn target(&mut self, record: &T) -> usize {
        match &mut self.route {
            Route::Single => 0,
            Route::RoundRobin(n) => {
                *n = (*n + 1) % self.senders.len();
                *n
            }
            Route::KeyGroups { f, max_parallelism } => {
                subtask_for_key_group(f(record), *max_parallelism, self.senders.len())
            }
        }
    }

    async fn send_buffer(&mut self, i: usize) -> Result<()> {
        if self.buffers[i].is_empty() {
            return Ok(());
        }
        // the next batch starts at the size this one reached: no regrowing record by record
        let cap = self.buffers[i].len();
        let batch = std::mem::replace(&mut self.buffers[i], Vec::with_capacity(cap));
        self.senders[i]
            .send(StreamElement::Records(batch))
            .await
            .map_err(|_| Error::ChannelClosed("a downstream subtask stopped".into()))
    }
}

async fn push<T: Send + 'static>(
    edge: &mut EdgeWriter<T>,
    rec: T,
    batch_size: usize,
) -> Result<()> {
    let t = edge.target(&rec);
    edge.buffers[t].push(rec);
    if edge.buffers[t].len() >= batch_size {
        edge.send_buffer(t).await?;
    }
    Ok(())
}

/// All outgoing edges of a subtask.
pub struct Output<T> {
    edges: Vec<EdgeWriter<T>>,
    batch_size: usize,
    records_out: metrics::Counter,
}

impl<T: Clone + Send + 'static> Output<T> {
    /// An output over `edges`.
    pub fn new(
        edges: Vec<EdgeWriter<T>>,
        batch_size: usize,
        records_out: metrics::Counter,
    ) -> Self {
        Output {
            edges,
            batch_size,
            records_out,
        }
    }

    /// Routes every record of `records` (draining it); sends full batches.
    pub async fn emit_all(&mut self, records: &mut Vec<T>) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.records_out.increment(records.len() as u64);
        let n_edges = self.edges.len();
        if n_edges == 0 {
            records.clear();
            return Ok(());
        }
        for r in records.drain(..) {
            for e in 0..n_edges - 1 {
                let copy = r.clone();
                push(&mut self.edges[e], copy, self.batch_size).await?;
            }
            push(&mut self.edges[n_edges - 1], r, self.batch_size).await?;
        }
        Ok(())
    }

    /// Sends every partially filled batch.
    pub async fn flush(&mut self) -> Result<()> {
        for edge in &mut self.edges {
            for i in 0..edge.senders.len() {
                edge.send_buffer(i).await?;
            }
        }
        Ok(())
    }

    /// Flushes, then sends a control element (watermark, barrier, end) on every channel.
    pub async fn broadcast(&mut self, make: impl Fn() -> StreamElement<T>) -> Result<()> {
        self.flush().await?;
        for edge in &mut self.edges {
            for s in &edge.senders {
                s.send(make())
                    .await
                    .map_err(|_| Error::ChannelClosed("a downstream subtask stopped".into()))?;
            }
        }
        Ok(())
    }
}
