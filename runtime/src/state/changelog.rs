//! The seam through which keyed operators hand their state changes to a changelog outside the
//! runtime (a compacted Kafka topic per operator, `docs/SCALE-OUT.md`). When a job has a
//! [`ChangelogWriter`], every keyed operator subtask tracks the keys it changes and, at each
//! aligned barrier, after its snapshot and before it acknowledges the barrier, hands the
//! changes since the previous barrier to the writer for that checkpoint. The writer makes them
//! durable together with the checkpoint (in the same transaction as its output and offsets).

use crate::element::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::state::{KeyGroupSnapshot, StateChange};
use crate::Result;

/// Receives the state changes of each keyed operator subtask per checkpoint.
pub trait ChangelogWriter: Send + Sync + 'static {
    /// The changes of subtask `subtask` of operator node `node_uid` since its previous barrier,
    /// released by barrier `checkpoint` (in a stable order: table, key group, key). They
    /// belong to checkpoint `checkpoint`: durable when it commits, gone if it never does. An
    /// error fails the checkpoint.
    fn write_for_checkpoint(
        &self,
        checkpoint: CheckpointId,
        node_uid: &str,
        subtask: usize,
        changes: Vec<StateChange>,
    ) -> Result<()>;

    /// The keyed state of operator node `node_uid` in the key groups of `range` (of
    /// `max_parallelism`), read back from the changelog, when a subtask is set up. `None`:
    /// the changelog restores nothing and the subtask keeps what its checkpoint restored.
    /// `Some` replaces the checkpoint's keyed state: the changelog is the truth. Blocking (it
    /// reads from outside the process); the runtime calls it off the async workers.
    fn restore(
        &self,
        _node_uid: &str,
        _range: KeyGroupRange,
        _max_parallelism: usize,
    ) -> Result<Option<Vec<KeyGroupSnapshot>>> {
        Ok(None)
    }
}

/// The key of a changelog record: bincode 2 of `(node_uid, table, key)`, written as the
/// encoded pair followed by the already encoded key (bincode encodes a tuple as its fields in
/// order, so this is the encoding of the triple).
pub fn changelog_key(node_uid: &str, change: &StateChange) -> Result<Vec<u8>> {
    let mut out = crate::state::format::encode(&(node_uid, change.table.as_str()))?;
    out.extend_from_slice(&change.key);
    Ok(out)
}

/// Reads a changelog record back into the operator's node uid and the change it carries;
/// `value` `None` is a tombstone. The key group is recomputed from the encoded key among
/// `max_parallelism` groups (it is the hash of exactly those bytes).
pub fn change_from_record(
    record_key: &[u8],
    value: Option<&[u8]>,
    max_parallelism: usize,
) -> Result<(String, StateChange)> {
    let config = crate::state::format::bincode_config().with_limit::<{ 1 << 20 }>();
    let ((node_uid, table), used): ((String, String), usize) =
        bincode::serde::decode_from_slice(record_key, config)
            .map_err(|e| crate::Error::Serialization(format!("changelog record key: {e}")))?;
    let key = record_key[used..].to_vec();
    if key.is_empty() {
        return Err(crate::Error::Serialization(
            "changelog record key has no state key after the operator and table".into(),
        ));
    }
    let key_group = crate::keygroup::key_group_of_encoded(&key, max_parallelism);
    Ok((
        node_uid,
        StateChange {
            table,
            key_group,
            key,
            value: value.map(<[u8]>::to_vec),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keygroup::key_group_for;
    use crate::state::format::encode;

    #[test]
    fn changelog_key_round_trips_and_keeps_the_key_group() {
        let key = "user-17".to_string();
        let change = StateChange {
            table: "reduce".into(),
            key_group: key_group_for(&key, 128),
            key: encode(&key).unwrap(),
            value: Some(encode(&5u64).unwrap()),
        };
        let record_key = changelog_key("n02-reduce", &change).unwrap();
        assert_eq!(
            record_key,
            encode(&("n02-reduce", "reduce", key.as_str())).unwrap()
        );
        let (uid, back) = change_from_record(&record_key, change.value.as_deref(), 128).unwrap();
        assert_eq!(uid, "n02-reduce");
        assert_eq!(back, change);
    }

    #[test]
    fn a_key_without_a_state_key_is_an_error() {
        let bare = encode(&("n02-reduce", "reduce")).unwrap();
        assert!(change_from_record(&bare, None, 128).is_err());
        assert!(change_from_record(&[0xff, 0xff], None, 128).is_err());
    }
}
