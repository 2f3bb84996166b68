//! Regression tests from fuzzing the checkpoint readers (`fuzz/fuzz_targets/checkpoint_files.rs`):
//! what a corrupt checkpoint file can make the decoders allocate is bounded by the file's
//! length. An instrumented allocator counts the bytes allocated while each input decodes.

use std::alloc::System;
use std::sync::Mutex;

use onceflow_runtime::checkpoint::metadata::CheckpointMetadata;
use onceflow_runtime::state::format::decode;
use onceflow_runtime::state::SubtaskSnapshot;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Tests share the allocator's counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Bytes allocated (in all, not net) while `f` runs.
fn allocated_by(f: impl FnOnce()) -> usize {
    let region = Region::new(GLOBAL);
    f();
    region.change().bytes_allocated
}

/// The fuzzer's input: a subtask snapshot whose (String, Vec<u8>) names a 5.3 GB string
/// (`oom-2bdc872f...`, found on 2026-12-01). It allocated 5,352,129,283 zeroed bytes before
/// the bounded decoder.
const OOM_5_3_GB_STRING: &[u8] = &[
    0x00, 0x03, 0x03, 0x03, 0x03, 0x03, 0x00, 0x03, 0x02, 0xfd, 0x03, 0x03, 0x03, 0x3f, 0x01, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00,
];

#[test]
fn fuzz_input_naming_a_huge_string_allocates_nothing_big() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let allocated = allocated_by(|| {
        assert!(decode::<SubtaskSnapshot>(OOM_5_3_GB_STRING).is_err());
        assert!(decode::<CheckpointMetadata>(OOM_5_3_GB_STRING).is_err());
    });
    assert!(
        allocated < 1 << 20,
        "decoding a 21-byte input allocated {allocated} bytes"
    );
}

#[test]
fn length_prefixes_of_every_size_stay_within_the_input_bound() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for claimed in [1u64 << 21, 1 << 26, 1 << 31, 1 << 33, u64::MAX / 2] {
        // a Vec<u8> / String claiming `claimed` bytes, followed by 1 KiB of input
        let mut input = vec![253u8];
        input.extend_from_slice(&claimed.to_le_bytes());
        input.extend_from_slice(&[b'a'; 1024]);
        let allocated = allocated_by(|| {
            assert!(decode::<Vec<u8>>(&input).is_err());
            assert!(decode::<String>(&input).is_err());
            assert!(decode::<Vec<(String, Vec<u8>)>>(&input).is_err());
        });
        assert!(
            allocated <= 3 << 20,
            "a claim of {claimed} bytes in a 1 KiB input allocated {allocated} bytes"
        );
    }
}
