//! The broker binary's C allocator settings (`onceflow_broker::allocator::tune`): buffers of
//! the size a fetch answer is built from, freed together, are used again without the kernel
//! mapping their pages anew. Alone in its test binary because the settings are process-wide.
//! glibc on Linux only: elsewhere there is nothing to tune, and no /proc/thread-self.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

/// Page faults this thread has taken (minflt of /proc/thread-self/stat).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
    // the command name (field 2) may hold spaces: count fields after its closing parenthesis
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after
        .split(' ')
        .nth(7)
        .and_then(|f| f.parse().ok())
        .expect("minflt")
}

/// Allocates and writes 8 buffers of 4 MiB (32 MiB, the size of a large fetch answer's
/// reads), then frees them together; returns the page faults that took.
fn one_answer() -> u64 {
    let before = minor_faults();
    let buffers: Vec<Vec<u8>> = (0..8).map(|_| vec![1u8; 4 << 20]).collect();
    assert!(buffers.iter().all(|b| b[(4 << 20) - 1] == 1));
    drop(buffers);
    minor_faults() - before
}

#[test]
fn buffers_freed_together_are_reused_without_new_page_faults() {
    assert!(
        onceflow_broker::allocator::tune(),
        "glibc took both settings"
    );
    // the first answers map the memory; later ones should find it mapped
    let first = one_answer();
    one_answer();
    let later = one_answer();
    // 32 MiB is 8192 pages of 4 KiB; the untuned allocator faults on all of them every time
    assert!(
        first >= 1024,
        "the first answer maps fresh pages ({first} faults)"
    );
    assert!(
        later < first / 16,
        "freed buffers were mapped anew: {later} faults in a later answer, {first} in the first"
    );
}
