//! The cleaner on a whole store over `MemBackend`: a pass keeps the latest record per key at
//! its offset, the cleaned log survives a crash image and reopen (gaps in offsets), every
//! intermediate swap state is finished or rolled back by recovery, and reads skip gaps.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

use super::swap;
use crate::storage::backend::StorageBackend;
use crate::storage::batch::parse_header;
use crate::storage::batch::{encode_batch, BatchSpec, RecordSpec};
use crate::storage::{LogConfig, MemBackend, StorageConfig, Store};

const ROOT: &str = "/mem";

fn open(backend: &MemBackend) -> Store {
    let config = StorageConfig {
        segment_bytes: 1024,
        cleaner_interval: None,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new(ROOT)).unwrap()
}

fn compact(store: &Store) {
    let mut lc = LogConfig::with_segment_bytes(1024);
    assert!(lc.apply("cleanup.policy", "compact"));
    store.set_topic_log_config("t", lc).unwrap();
}

/// Appends `n` single-record batches: key `k{i % keys}`, value `v{i}`.
fn fill(store: &Store, n: usize, keys: usize) {
    let p = store.partition("t", 0).unwrap();
    for i in 0..n {
        let key = format!("k{}", i % keys);
        let value = format!("v{i}");
        let rec = RecordSpec {
            timestamp: 1,
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
            headers: Vec::new(),
        };
        p.append(encode_batch(BatchSpec::default(), &[rec]).freeze())
            .unwrap();
    }
}

/// Every record from offset 0 as (offset, value), reading batch after batch.
fn contents(store: &Store) -> Vec<(i64, String)> {
    let p = store.partition("t", 0).unwrap();
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < p.high_watermark() {
        let bytes: Bytes = p.read(offset, 1 << 20).unwrap();
        assert!(!bytes.is_empty(), "read at {offset} returned nothing");
        let mut pos = 0;
        while let Ok(h) = parse_header(&bytes[pos..]) {
            let mut one = bytes.slice(pos..pos + h.size);
            for r in RecordBatchDecoder::decode(&mut one).unwrap().records {
                if r.offset >= offset {
                    let v = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default());
                    out.push((r.offset, v.into_owned()));
                }
            }
            offset = offset.max(h.last_offset() + 1);
            pos += h.size;
            if pos >= bytes.len() {
                break;
            }
        }
    }
    out
}

#[test]
fn a_pass_keeps_the_latest_value_per_key_and_survives_a_crash_image() {
    let backend = MemBackend::new();
    let store = open(&backend);
    store.create_topic("t", 1).unwrap();
    compact(&store);
    fill(&store, 400, 10);
    let before = contents(&store);
    assert_eq!(before.len(), 400);
    let r = store
        .clean_now("t", 0)
        .unwrap()
        .expect("cleanable segments");
    assert!(
        r.segments_rewritten > 0 && r.stats.records_removed > 0,
        "{r:?}"
    );
    let end = r.cleaned_up_to as usize;
    let after = contents(&store);
    // Below the cleaned range only each key's latest record in that range or later stays.
    let want: Vec<(i64, String)> = before
        .iter()
        .filter(|(o, _)| *o as usize >= end || *o as usize + 10 >= end)
        .cloned()
        .collect();
    assert_eq!(after, want);
    // A second pass without new data finds nothing to do (fillers are written back as they
    // are, not rewritten every pass).
    let again = store.clean_now("t", 0).unwrap().expect("cleanable");
    assert_eq!(
        (again.segments_rewritten, again.stats.records_removed),
        (0, 0),
        "{again:?}"
    );
    // The cleaned log (offset gaps included) is what a crash leaves, and it reopens intact.
    let image = backend.crash_image();
    drop(store);
    let reopened = open(&image);
    assert_eq!(contents(&reopened), want);
    assert_eq!(reopened.partition("t", 0).unwrap().high_watermark(), 400);
}

#[test]
fn recovery_finishes_or_rolls_back_each_swap_state() {
    let dir = Path::new(ROOT).join("t-0");
    for state in ["cleaned", "swap", "swap-no-index", "swap-orphan"] {
        let backend = MemBackend::new();
        let store = open(&backend);
        store.create_topic("t", 1).unwrap();
        compact(&store);
        fill(&store, 400, 10);
        let before = contents(&store);
        let p = store.partition("t", 0).unwrap();
        // The cleaned copy of the first segment, as a pass would write it.
        let (base, cleaned) = {
            let st = p.lock_state();
            let s = &st.segments[0];
            (s.base_offset, s.log.read_at(0, s.size() as usize).unwrap())
        };
        let mut copy = cleaned.to_vec();
        copy.truncate(copy.len() / 2 + 1);
        // Only whole batches: cut at the first batch boundary past the middle.
        let mut pos = 0;
        while pos < copy.len() {
            let h = parse_header(&cleaned[pos..]).unwrap();
            pos += h.size;
        }
        let copy = cleaned[..pos].to_vec();
        let b: &dyn StorageBackend = &backend;
        swap::write_cleaned(b, &dir, base, &copy).unwrap();
        match state {
            "cleaned" => {}
            "swap" => swap::promote(b, &dir, base).unwrap(),
            "swap-no-index" => {
                swap::promote(b, &dir, base).unwrap();
                b.remove_file(&dir.join(crate::storage::segment::file_name(base, "index")))
                    .unwrap();
                b.sync_dir(&dir).unwrap();
            }
            _ => {
                swap::promote(b, &dir, base).unwrap();
                let seg = crate::storage::segment::file_name(base, "log");
                b.remove_file(&dir.join(seg)).unwrap();
                b.sync_dir(&dir).unwrap();
            }
        }
        drop(p);
        drop(store);
        let image = backend.crash_image();
        if state == "swap-orphan" {
            // A segment deleted meanwhile: recovery drops the swap file (and, here, the log
            // no longer starts at 0, which recovery handles as usual).
            let names = image.list(&dir).unwrap();
            assert!(names.iter().any(|e| e.name.ends_with(".swap")));
            let _ = swap::finish_interrupted(&image, &dir).unwrap();
            assert!(!image
                .list(&dir)
                .unwrap()
                .iter()
                .any(|e| e.name.ends_with(".swap")));
            continue;
        }
        let reopened = open(&image);
        let names: Vec<String> = image
            .list(&dir)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with(".cleaned") || n.ends_with(".swap")),
            "{state}: {names:?}"
        );
        let got = contents(&reopened);
        if state == "cleaned" {
            assert_eq!(got, before, "rolled back");
        } else {
            // The (here: truncated by the test) copy replaced the segment: what it holds is
            // served, nothing else of that segment.
            assert!(got.len() < before.len(), "{state}: swap completed");
            assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}
