//! Bytes as a checkpoint file: the frame check (magic, version, length, CRC-32C) and the
//! decoders of checkpoint metadata and subtask snapshots, bounded by the input's length, with
//! the frame's CRC fixed up so the decoders see the bytes too. Nothing may panic or allocate
//! beyond what the input can justify.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use onceflow_runtime::checkpoint::metadata::CheckpointMetadata;
use onceflow_runtime::state::format::{decode, frame, unframe, FrameKind};
use onceflow_runtime::state::SubtaskSnapshot;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.chk");
    for kind in [FrameKind::State, FrameKind::Metadata] {
        let _ = unframe(kind, data, path);
    }
    // The payload decoders, reached through a valid frame.
    let framed = frame(FrameKind::Metadata, data);
    if let Ok(payload) = unframe(FrameKind::Metadata, &framed, path) {
        let _ = decode::<CheckpointMetadata>(payload);
    }
    let framed = frame(FrameKind::State, data);
    if let Ok(payload) = unframe(FrameKind::State, &framed, path) {
        // the current layout and the one of formats 2 and 3 (no event times)
        let _ = SubtaskSnapshot::decode_versioned(4, payload);
        let _ = SubtaskSnapshot::decode_versioned(3, payload);
    }
});
