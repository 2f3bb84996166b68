//! Settings of the C library's allocator for a broker process.
//!
//! A fetch answer is built from buffers of up to a megabyte per partition (a read that spans
//! several stored pieces is copied into one), and tens of megabytes of them are freed together
//! once the answer is written. With glibc's defaults, allocations that large are mapped fresh
//! from the kernel and freed memory past a few megabytes is handed back to it at once, so the
//! next answer faults in, zeroes and charges every page again: on the project's 2-core VM that
//! was about a third of the broker's CPU while a consumer read 1 KiB records from 128
//! partitions (docs/BENCHMARKS.md, "the C allocator's thresholds"). [`tune`] keeps such
//! buffers in the allocator's heap and keeps up to [`TRIM_THRESHOLD`] of freed memory mapped
//! for the next answer.
//!
//! Only the `onceflow-broker` binary calls it: the settings are global to a process, so an
//! application that embeds the broker (a job, a test) keeps its own allocator's behaviour.

/// Allocations below this come from the allocator's heap rather than a mapping of their own
/// (glibc's largest allowed value on 64-bit targets).
pub const MMAP_THRESHOLD: usize = 32 * 1024 * 1024;

/// Free memory the allocator keeps mapped at the top of a heap before it returns any to the
/// kernel. Measured on a fetch-heavy run: 16 MiB saved about half of what 64 MiB saves
/// against glibc's defaults; 64 MiB and 256 MiB ran alike.
pub const TRIM_THRESHOLD: usize = 64 * 1024 * 1024;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] to glibc's allocator; `true` when both
/// took. Call it before the process starts its threads. Elsewhere (another C library, another
/// target) it does nothing and returns `false`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    // SAFETY: mallopt only changes two numbers the allocator reads on later calls (when to map
    // an allocation of its own, when to give free memory back); it takes no pointers and
    // changes no memory that Rust code holds. glibc serialises it with the allocator's own
    // lock, and both values are within the ranges it documents (M_MMAP_THRESHOLD at most
    // 32 MiB on 64-bit targets), for which it returns 1.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
    }
}

/// Without glibc there is nothing to tune.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}
