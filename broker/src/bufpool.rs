//! A process-wide pool of large buffers whose pages are already mapped: what the socket reads
//! produce requests into and what the in-memory log keeps its bytes in.
//!
//! An in-memory log keeps every byte it is sent, so it needs fresh memory at the produce
//! rate, and a fresh page costs a trap, the kernel's zeroing and a memory-cgroup charge.
//! Taken on the request's path, that was about half of the broker's CPU per 1 KiB-record
//! produce request. The pool's thread writes each new buffer once ahead of use, off the
//! request's path, and keeps [`READY`] of them ready.
//!
//! A new buffer is placed on 2 MiB boundaries and backed by transparent huge pages where the
//! kernel allows them (`MADV_HUGEPAGE`), and its pages are mapped with one
//! `MADV_POPULATE_WRITE` call instead of a write to every page (a trap, zeroing and a memory
//! charge per 4 KiB page). On this project's 2-core VM that took the thread's CPU per MB an
//! in-memory broker keeps from about 0.7 ms to about 0.3 ms (docs/BENCHMARKS.md, "huge pages
//! for the buffer pool"). Where either advice is not available (an older kernel, huge pages
//! off) a buffer is written once instead.
//!
//! Buffers come back through [`give_back`]: a deleted log file (a segment removed by
//! retention or DeleteRecords) returns the buffers it held, up to [`KEEP`] held in all. A log
//! with a retention bound then appends into memory it has used before, as Kafka's page cache
//! does, instead of fresh pages.

use std::sync::{Condvar, Mutex, OnceLock};

use bytes::BytesMut;

/// Size of every pooled buffer.
pub const BUFFER: usize = 4 * 1024 * 1024;

/// Alignment (and size) of a transparent huge page on x86-64 and aarch64 with 4 KiB pages.
const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// Buffers the pool's thread keeps ready.
const READY: usize = 4;

/// Most buffers the pool holds, counting those given back (256 MiB): enough for a retention
/// pass that deletes several segments at once to feed the appends until the next pass. At
/// 1 GB/s with 100 ms between passes a pass frees about 25 buffers; with room for 32 the pool
/// dropped part of them and made a quarter of its buffers fresh (144-262 fresh buffers per
/// 3 GB of 1 KiB records, 51 with 64: the first fill).
const KEEP: usize = 64;

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
            let buf = fresh();
            metrics::counter!("onceflow_broker_memlog_warm_buffers_total").increment(1);
            self.lock().push(buf);
        }
    }
}

/// A new empty buffer of exactly [`BUFFER`] bytes' capacity, starting on a huge-page boundary,
/// with its pages mapped.
fn fresh() -> BytesMut {
    let mut buf = allocate().unwrap_or_else(|| BytesMut::with_capacity(BUFFER));
    if !map_ahead(&mut buf.spare_capacity_mut()[..BUFFER]) {
        // Writing every byte once makes the kernel map (and zero) the pages now.
        buf.resize(BUFFER, 0);
        buf.clear();
    }
    buf
}

/// A huge-page-aligned buffer of [`BUFFER`] bytes' capacity, its pages not yet mapped. The
/// allocation is a huge page larger so that an aligned buffer fits; the skipped head and the
/// rest after the buffer are never written, so they cost address space, not memory.
fn allocate() -> Option<BytesMut> {
    aligned(BytesMut::with_capacity(BUFFER + HUGE_PAGE))
}

/// The [`BUFFER`] bytes of the empty `buf` that start at its first huge-page boundary, as a
/// buffer of exactly that capacity and the only handle to the allocation; `None` if the
/// allocation does not reach that far.
fn aligned(mut buf: BytesMut) -> Option<BytesMut> {
    let start = buf.as_ptr() as usize;
    let skip = start.next_multiple_of(HUGE_PAGE) - start;
    if !buf.is_empty() || buf.capacity() < skip + BUFFER {
        return None;
    }
    let mut out = buf.split_off(skip);
    drop(buf);
    drop(out.split_off(BUFFER));
    Some(out)
}

/// Asks the kernel to back `region` with huge pages where it can and to map all of its pages
/// now; `false` if the mapping could not be done this way (the caller then writes the pages).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn map_ahead(region: &mut [std::mem::MaybeUninit<u8>]) -> bool {
    // Only whole pages inside the region are advised: the pages around its ends may hold other
    // allocations.
    const PAGE: usize = 4096;
    let start = (region.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (region.as_ptr() as usize + region.len()) & !(PAGE - 1);
    if end <= start {
        return false;
    }
    let (addr, len) = (start as *mut libc::c_void, end - start);
    // SAFETY: [addr, addr + len) lies inside `region`, memory this function holds exclusively
    // (a `&mut` borrow) and that stays allocated for the call. Neither advice changes what the
    // range holds or whether it is mapped: MADV_HUGEPAGE only lets the kernel use huge pages
    // for it, and MADV_POPULATE_WRITE faults its pages in as a write would, without writing.
    // No Rust reference observes a change, and the bytes stay uninitialized to the caller.
    unsafe {
        // Refused if the kernel has no transparent huge pages; the mapping still works.
        libc::madvise(addr, len, libc::MADV_HUGEPAGE);
        libc::madvise(addr, len, libc::MADV_POPULATE_WRITE) == 0
    }
}

/// Without Linux's advice calls, the caller writes the pages.
#[cfg(not(target_os = "linux"))]
fn map_ahead(_region: &mut [std::mem::MaybeUninit<u8>]) -> bool {
    false
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

/// `buf` emptied and made a whole buffer again (a pool buffer: its aligned, mapped
/// [`BUFFER`] bytes), if its allocation holds one and `buf` is its only handle.
pub fn reusable(mut buf: BytesMut) -> Option<BytesMut> {
    buf.clear();
    // A pool buffer's allocation is a huge page larger than the buffer. Asking for all of it
    // moves the view back to the allocation's start (no copy: it is empty), wherever in the
    // buffer the handle was, and the mapped BUFFER bytes are found from there.
    if buf.try_reclaim(BUFFER + HUGE_PAGE) {
        return aligned(buf);
    }
    // Any other allocation of a whole buffer's size, when `buf` is its only handle.
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

    #[test]
    fn a_fresh_buffer_is_aligned_whole_and_comes_back_in_place() {
        let mut buf = fresh();
        let start = buf.as_ptr() as usize;
        assert_eq!(start % HUGE_PAGE, 0);
        // Exactly the mapped bytes: an append past them goes on in the next buffer.
        assert!(buf.is_empty() && buf.capacity() == BUFFER);
        // Every byte can be written and read back.
        let pattern: Vec<u8> = (0..BUFFER).map(|i| (i % 251) as u8).collect();
        buf.extend_from_slice(&pattern);
        assert_eq!(&buf[..], &pattern[..]);
        let frame = buf.split_to(1000).freeze();
        drop(buf);
        let back = reusable(frame.try_into_mut().expect("unique")).expect("the only handle");
        assert_eq!(back.as_ptr() as usize, start);
        assert_eq!(back.capacity(), BUFFER);
        // Through a handle that starts inside the buffer (a log's tail after its first
        // pieces), it comes back at its start as well.
        let mut buf = back;
        buf.extend_from_slice(&pattern[..1000]);
        drop(buf.split_to(1000));
        let back = reusable(buf).expect("the only handle");
        assert_eq!(back.as_ptr() as usize, start);
        assert_eq!(back.capacity(), BUFFER);
    }

    /// The size and resident size, in KiB, of the mapping that holds `addr`, from
    /// /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn resident_kib(addr: usize) -> Option<(u64, u64)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut lines = smaps.lines();
        lines.find(|l| {
            let range = l.split_whitespace().next().unwrap_or("");
            let Some((from, to)) = range.split_once('-') else {
                return false;
            };
            let from = usize::from_str_radix(from, 16).unwrap_or(usize::MAX);
            let to = usize::from_str_radix(to, 16).unwrap_or(0);
            (from..to).contains(&addr)
        })?;
        let mut field = |name: &str| -> Option<u64> {
            let line = lines.find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        let size = field("Size:")?;
        let rss = field("Rss:")?;
        Some((size, rss))
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn map_ahead_maps_every_page_without_writing_them() {
        let mut buf = allocate().expect("room");
        let addr = buf.as_ptr() as usize;
        assert!(
            map_ahead(&mut buf.spare_capacity_mut()[..BUFFER]),
            "kernel >= 5.14 assumed"
        );
        // The huge-page advice made the advised range a mapping of its own (its flags differ
        // from the rest of the allocation's), and all of it is resident.
        let (size, rss) = resident_kib(addr).expect("a mapping holding the buffer");
        assert!(size >= (BUFFER / 1024) as u64, "{size} KiB");
        assert_eq!(rss, size, "every page of the buffer is mapped");
    }
}
