//! A process-wide pool of large buffers whose pages are already mapped: what the socket reads
//! produce requests into and what the in-memory log keeps its bytes in.
//!
//! An in-memory log keeps every byte it is sent, so it needs fresh memory at the produce
//! rate, and a fresh page costs a trap, the kernel's zeroing and a memory-cgroup charge.
//! Taken on the request's path, that was about half of the broker's CPU per 1 KiB-record
//! produce request. The pool's thread writes each new buffer once ahead of use, off the
//! request's path, and keeps [`READY`] of them ready.
//!
//! Buffers come back through [`give_back`]: a deleted log file (a segment removed by
//! retention or DeleteRecords) returns the buffers it held, up to [`KEEP`] held in all. A log
//! with a retention bound then appends into memory it has used before, as Kafka's page cache
//! does, instead of fresh pages.

use std::sync::{Condvar, Mutex, OnceLock};

use bytes::BytesMut;

/// Size of every pooled buffer.
pub const BUFFER: usize = 4 * 1024 * 1024;

/// Buffers the pool's thread keeps ready.
const READY: usize = 4;

/// Most buffers the pool holds, counting those given back: enough for a retention pass that
/// deletes several segments at once to feed the appends after it.
const KEEP: usize = 32;

struct Pool {
    ready: Mutex<Vec<BytesMut>>,
    taken: Condvar,
}

impl Pool {
    /// The process's pool, started on first use; `None` if its thread cannot be started.
    fn shared() -> Option<&'static Pool> {
        static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
        *POOL.get_or_init(|| {
            let pool: &'static Pool = Box::leak(Box::new(Pool {
                ready: Mutex::new(Vec::with_capacity(KEEP)),
                taken: Condvar::new(),
            }));
            match std::thread::Builder::new()
                .name("memlog-warm".into())
                .spawn(move || pool.fill())
            {
                Ok(_) => Some(pool),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the buffer pool's thread");
                    None
                }
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<BytesMut>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `READY` touched buffers ready, for the life of the process.
    fn fill(&self) {
        loop {
            {
                let mut ready = self.lock();
                while ready.len() >= READY {
                    ready = self.taken.wait(ready).unwrap_or_else(|p| p.into_inner());
                }
            }
            let mut buf = BytesMut::with_capacity(BUFFER);
            // Writing every byte once makes the kernel map (and zero) the pages now.
            buf.resize(BUFFER, 0);
            buf.clear();
            metrics::counter!("onceflow_broker_memlog_warm_buffers_total").increment(1);
            self.lock().push(buf);
        }
    }
}

/// An empty buffer of [`BUFFER`] bytes' capacity: a ready one, or a fresh one when the pool
/// has none ready (or its thread is not running).
pub fn take() -> BytesMut {
    let ready = Pool::shared().and_then(|pool| {
        let buf = pool.lock().pop();
        pool.taken.notify_one();
        buf
    });
    ready.unwrap_or_else(|| {
        metrics::counter!("onceflow_broker_memlog_cold_buffers_total").increment(1);
        BytesMut::with_capacity(BUFFER)
    })
}

/// Keeps `buf` for a later [`take`] if it can hold a whole buffer again and the pool has
/// room; otherwise frees it.
pub fn give_back(buf: BytesMut) {
    let Some(buf) = reusable(buf) else {
        return;
    };
    if let Some(pool) = Pool::shared() {
        let mut ready = pool.lock();
        if ready.len() < KEEP {
            ready.push(buf);
            metrics::counter!("onceflow_broker_memlog_reused_buffers_total").increment(1);
        }
    }
}

/// `buf` emptied and grown back to its whole allocation, if that is a whole buffer and `buf`
/// is its only handle.
pub fn reusable(mut buf: BytesMut) -> Option<BytesMut> {
    buf.clear();
    // Reclaims the allocation's full capacity when `buf` is its only handle (no copy: it is
    // empty).
    (buf.try_reclaim(BUFFER) && buf.capacity() >= BUFFER).then_some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_only_when_no_other_handle_shares_it() {
        let mut back = take();
        assert!(back.is_empty() && back.capacity() >= BUFFER);
        back.extend_from_slice(&[7u8; 1000]);
        let start = back.as_ptr() as usize;
        let front = back.split_to(600).freeze();
        // `front` still shares the allocation: `back` is not reusable.
        assert!(reusable(back).is_none());
        // Now `front` is the only handle: the whole buffer comes back, at its start.
        let whole = reusable(front.try_into_mut().expect("unique")).expect("the only handle");
        assert_eq!(whole.as_ptr() as usize, start);
        assert!(whole.is_empty() && whole.capacity() >= BUFFER);
        // A small buffer is never pooled.
        assert!(reusable(BytesMut::with_capacity(1024)).is_none());
    }
}
