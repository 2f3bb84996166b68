//! Growing a topic's partition count (CreatePartitions): new, empty partitions with the
//! topic's current log settings, made durable in the same order as a new topic so a crash at
//! any point leaves either the old or the new count.
//!
//! Order: (1) remove any stale directory of each new index and open the new partitions,
//! (2) fsync the data directory, (3) rewrite the registry atomically with the new count,
//! (4) publish the partitions in memory. A crash before (3) leaves directories that the
//! trusted registry does not name; the next open removes them. A crash after (3) finds the
//! directories the registry names.

use super::error::{Result, StorageError};
use super::{Store, MAX_PARTITIONS};

impl Store {
    /// Grows `topic` to `new_count` partitions. New partitions start empty with the log
    /// settings of partition 0; the new count is durable when this returns. Fails with
    /// `UnknownTopic`, or `InvalidTopic` when `new_count` is not larger than the current count
    /// or above the store's limit (nothing changes then).
    pub fn add_partitions(&self, topic: &str, new_count: i32) -> Result<()> {
        let inner = &self.inner;
        let mut t = inner.topics.write().unwrap_or_else(|p| p.into_inner());
        let Some(current) = t.get(topic) else {
            return Err(StorageError::UnknownTopic(topic.to_string()));
        };
        let old_count = current.len() as i32;
        if new_count <= old_count || new_count > MAX_PARTITIONS {
            return Err(StorageError::InvalidTopic(format!(
                "{topic}: cannot grow from {old_count} to {new_count} partitions \
                 (must be larger, at most {MAX_PARTITIONS})"
            )));
        }
        let log_config = current
            .first()
            .map_or_else(|| inner.context().log_config, |p| (*p.log_config()).clone());
        let added = (|| {
            let parts = inner.open_new_partitions(topic, old_count..new_count, &log_config)?;
            inner.write_registry(t.iter().map(|(n, p)| {
                let count = if n == topic {
                    new_count
                } else {
                    p.len() as i32
                };
                (n.as_str(), count)
            }))?;
            Ok(parts)
        })();
        match added {
            Ok(parts) => {
                if let Some(list) = t.get_mut(topic) {
                    list.extend(parts);
                }
                tracing::info!(topic, old_count, new_count, "added partitions");
                Ok(())
            }
            Err(e) => {
                for i in old_count..new_count {
                    let _ = inner.backend.remove_dir_all(&inner.partition_dir(topic, i));
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::storage::batch::{encode_batch, BatchSpec, RecordSpec};
    use crate::storage::{MemBackend, StorageConfig};

    fn open(backend: &Arc<MemBackend>) -> Store {
        let config = StorageConfig::default();
        let backend: Arc<dyn crate::storage::StorageBackend> = backend.clone();
        Store::open_with_backend(config, backend, Path::new("/data")).expect("opens")
    }

    #[test]
    fn grown_partitions_are_empty_durable_and_keep_the_topic_config() {
        let backend = Arc::new(MemBackend::new());
        let store = open(&backend);
        let mut config = store.default_log_config();
        config.apply("retention.ms", "1234");
        store.create_topic_with_config("t", 2, config).unwrap();
        let batch = encode_batch(BatchSpec::default(), &[RecordSpec::default()]);
        store
            .partition("t", 0)
            .unwrap()
            .append(batch.freeze())
            .unwrap();

        store.add_partitions("t", 5).unwrap();
        assert_eq!(store.topics(), vec![("t".to_string(), 5)]);
        let p4 = store.partition("t", 4).unwrap();
        assert_eq!(p4.log_end_offset(), 0);
        assert_eq!(
            p4.log_config(),
            store.partition("t", 0).unwrap().log_config()
        );
        assert_ne!(*p4.log_config(), store.default_log_config());
        assert_eq!(store.partition("t", 0).unwrap().log_end_offset(), 1);

        drop(store);
        let reopened = open(&backend);
        assert_eq!(reopened.topics(), vec![("t".to_string(), 5)]);
        assert_eq!(reopened.partition("t", 0).unwrap().log_end_offset(), 1);
    }

    /// A crash at every sync point of a grow leaves the old or the new count, and the new
    /// one whenever the grow returned success; a failed grow changes nothing in memory.
    #[test]
    fn a_crash_anywhere_in_a_grow_leaves_the_old_or_the_new_count() {
        let mut saw_failure = false;
        for syncs in 0..64 {
            let backend = Arc::new(MemBackend::new());
            let store = open(&backend);
            store.create_topic("t", 2).unwrap();
            let batch = encode_batch(BatchSpec::default(), &[RecordSpec::default()]);
            store
                .partition("t", 1)
                .unwrap()
                .append(batch.freeze())
                .unwrap();
            backend.fail_syncs_after(syncs);
            let grew = store.add_partitions("t", 4);
            let in_memory = store.topics();
            let image = Arc::new(backend.crash_image());
            let reopened = open(&image);
            let after_crash = reopened.topics();
            match grew {
                Ok(()) => {
                    assert_eq!(in_memory, vec![("t".to_string(), 4)]);
                    assert_eq!(after_crash, vec![("t".to_string(), 4)], "syncs {syncs}");
                }
                Err(_) => {
                    saw_failure = true;
                    assert_eq!(in_memory, vec![("t".to_string(), 2)], "syncs {syncs}");
                    assert!(
                        after_crash == vec![("t".to_string(), 2)]
                            || after_crash == vec![("t".to_string(), 4)],
                        "syncs {syncs}: {after_crash:?}"
                    );
                }
            }
            assert_eq!(reopened.partition("t", 1).unwrap().log_end_offset(), 1);
            if grew.is_ok() {
                assert!(saw_failure, "no sync point was ever hit");
                return;
            }
        }
        panic!("the grow never succeeded");
    }

    #[test]
    fn bad_counts_and_unknown_topics_change_nothing() {
        let backend = Arc::new(MemBackend::new());
        let store = open(&backend);
        store.create_topic("t", 3).unwrap();
        for bad in [3, 2, 0, -1, MAX_PARTITIONS + 1] {
            assert!(
                matches!(
                    store.add_partitions("t", bad),
                    Err(StorageError::InvalidTopic(_))
                ),
                "{bad} accepted"
            );
        }
        assert!(matches!(
            store.add_partitions("missing", 4),
            Err(StorageError::UnknownTopic(_))
        ));
        assert_eq!(store.topics(), vec![("t".to_string(), 3)]);
        assert!(store.partition("missing", 0).is_none());
    }
}
