//! Bytes as one of the broker's durable files, chosen by the first byte: a partition segment,
//! its offset index, a producer-state snapshot, the aborted-transaction index, the topic
//! registry, the group offsets log or the transaction log. Opening must either refuse with an
//! error or recover; a store that opens serves only whole batches whose CRC holds.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use onceflow_broker::group::OffsetStore;
use onceflow_broker::storage::batch::validate_batch;
use onceflow_broker::storage::{FsyncPolicy, MemBackend, StorageBackend, StorageConfig, Store};
use onceflow_broker::txn::log::TxnLog;

const ROOT: &str = "/fuzz";

fn open(backend: &MemBackend, repair: bool) -> Option<Store> {
    let config = StorageConfig {
        data_dir: None,
        segment_bytes: 4096,
        fsync: FsyncPolicy::EveryBatch,
        repair_corrupt_logs: repair,
        // no retention or cleaner threads: one store per input would leave thousands asleep
        retention_check_interval: None,
        cleaner_interval: None,
        ..StorageConfig::default()
    };
    Store::open_with_backend(config, Arc::new(backend.clone()), Path::new(ROOT)).ok()
}

/// Reads the partition from its start to its high watermark; every batch must validate.
fn serve_everything(store: &Store) {
    let Some(p) = store.partition("t", 0) else {
        return;
    };
    let mut offset = p.log_start_offset();
    let end = p.high_watermark();
    while offset < end {
        let Ok(bytes) = p.read(offset, 1 << 20) else {
            return;
        };
        if bytes.is_empty() {
            return;
        }
        let mut rest = &bytes[..];
        let before = offset;
        while rest.len() >= 12 {
            let len = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
            let size = 12 + usize::try_from(len).expect("served batch length is positive");
            let header = validate_batch(&rest[..size]).expect("served batch must validate");
            offset = offset.max(header.last_offset() + 1);
            rest = &rest[size..];
        }
        if offset <= before {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 7 {
        kind @ 0..=4 => {
            let backend = MemBackend::new();
            {
                let Some(store) = open(&backend, false) else {
                    return;
                };
                store.create_topic("t", 1).expect("create");
                store.flush_all().expect("flush");
            }
            let file = match kind {
                0 => "t-0/00000000000000000000.log",
                1 => "t-0/00000000000000000000.index",
                2 => "t-0/00000000000000000000.snapshot",
                3 => "t-0/aborted.txnindex",
                _ => "topics.registry",
            };
            backend
                .write_file_atomic(&Path::new(ROOT).join(file), body)
                .expect("write");
            for repair in [false, true] {
                if let Some(store) = open(&backend, repair) {
                    serve_everything(&store);
                }
            }
        }
        5 => {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(dir.path().join("offsets.log"), body).expect("write");
            for repair in [false, true] {
                let _ = OffsetStore::open_with_repair(dir.path(), false, repair);
            }
        }
        _ => {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(dir.path().join("transactions.log"), body).expect("write");
            for repair in [false, true] {
                let _ = TxnLog::open(dir.path(), repair);
            }
        }
    }
});
