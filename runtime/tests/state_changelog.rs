//! A changelog of keyed state (`KeyedStateStore::take_changes`, folded by
//! `snapshots_from_changes`) restores exactly the state that produced it: the basis of keyed
//! state kept in a compacted Kafka topic.

use std::collections::HashMap;

use onceflow_runtime::keygroup::KeyGroupRange;
use onceflow_runtime::state::{
    snapshots_from_changes, KeyedStateStore, ListState, MapState, StateChange, ValueState,
};
use proptest::prelude::*;

const MAX: usize = 16;

fn store() -> KeyedStateStore<String> {
    KeyedStateStore::<String>::new(MAX, KeyGroupRange::for_subtask(MAX, 1, 0)).tracking_changes()
}

/// Everything a store holds, for comparison.
fn contents(s: &mut KeyedStateStore<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for g in 0..s.range().len() {
        for (k, v) in s.table::<u64>("sum").unwrap().group(g) {
            out.push((format!("sum/{k}"), v.to_string()));
        }
        for (k, v) in s.table::<HashMap<String, i32>>("seen").unwrap().group(g) {
            let mut m: Vec<_> = v.iter().collect();
            m.sort();
            out.push((format!("seen/{k}"), format!("{m:?}")));
        }
        for (k, v) in s.table::<Vec<u8>>("log").unwrap().group(g) {
            out.push((format!("log/{k}"), format!("{v:?}")));
        }
    }
    out.sort();
    out
}

fn restored(log: Vec<StateChange>) -> KeyedStateStore<String> {
    let mut s = KeyedStateStore::<String>::new(MAX, KeyGroupRange::for_subtask(MAX, 1, 0));
    s.restore(snapshots_from_changes(log).unwrap()).unwrap();
    s
}

#[derive(Clone, Debug)]
enum Op {
    Set(u8, u64),
    Clear(u8),
    MapInsert(u8, u8, i32),
    MapRemove(u8, u8),
    Push(u8, u8),
    /// Bulk change through `group_mut`: drop every key of the group with an even sum.
    PruneGroupOf(u8),
    /// End of a checkpoint interval: take the changes into the log.
    Checkpoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, any::<u64>()).prop_map(|(k, v)| Op::Set(k, v)),
        2 => (0u8..24).prop_map(Op::Clear),
        3 => (0u8..24, 0u8..4, any::<i32>()).prop_map(|(k, mk, v)| Op::MapInsert(k, mk, v)),
        2 => (0u8..24, 0u8..4).prop_map(|(k, mk)| Op::MapRemove(k, mk)),
        2 => (0u8..24, any::<u8>()).prop_map(|(k, v)| Op::Push(k, v)),
        1 => (0u8..24).prop_map(Op::PruneGroupOf),
        2 => Just(Op::Checkpoint),
    ]
}

fn apply(s: &mut KeyedStateStore<String>, op: &Op) {
    let key = |k: &u8| format!("key-{k}");
    match op {
        Op::Set(k, v) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            ValueState::new(s.table::<u64>("sum").unwrap(), g, &k).set(*v);
        }
        Op::Clear(k) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            ValueState::new(s.table::<u64>("sum").unwrap(), g, &k).clear();
        }
        Op::MapInsert(k, mk, v) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            MapState::new(s.table::<HashMap<String, i32>>("seen").unwrap(), g, &k)
                .insert(mk.to_string(), *v);
        }
        Op::MapRemove(k, mk) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            MapState::new(s.table::<HashMap<String, i32>>("seen").unwrap(), g, &k)
                .remove(&mk.to_string());
        }
        Op::Push(k, v) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            ListState::new(s.table::<Vec<u8>>("log").unwrap(), g, &k).push(*v);
        }
        Op::PruneGroupOf(k) => {
            let k = key(k);
            let g = s.group_index(&k).unwrap();
            s.table::<u64>("sum")
                .unwrap()
                .group_mut(g)
                .retain(|_, v| *v % 2 == 1);
        }
        Op::Checkpoint => {}
    }
}

proptest! {
    /// Whatever the operations and wherever the checkpoints fall, folding every change taken
    /// so far restores the store's contents at the last checkpoint.
    #[test]
    fn changelog_restores_the_state(ops in proptest::collection::vec(op(), 1..120)) {
        let mut live = store();
        let mut log = Vec::new();
        for op in &ops {
            apply(&mut live, op);
            if matches!(op, Op::Checkpoint) {
                log.extend(live.take_changes().unwrap());
                let mut back = restored(log.clone());
                prop_assert_eq!(contents(&mut back), contents(&mut live));
            }
        }
        log.extend(live.take_changes().unwrap());
        let mut back = restored(log);
        prop_assert_eq!(contents(&mut back), contents(&mut live));
    }
}

#[test]
fn only_changed_keys_and_tombstones_are_taken() {
    let mut s = store();
    for i in 0..10u64 {
        apply(&mut s, &Op::Set(i as u8, i));
    }
    assert_eq!(s.take_changes().unwrap().len(), 10);
    assert!(
        s.take_changes().unwrap().is_empty(),
        "nothing changed since"
    );

    apply(&mut s, &Op::Set(3, 33));
    apply(&mut s, &Op::Clear(4));
    let changes = s.take_changes().unwrap();
    assert_eq!(changes.len(), 2);
    let tombstones: Vec<_> = changes.iter().filter(|c| c.value.is_none()).collect();
    assert_eq!(
        tombstones.len(),
        1,
        "the cleared key is a tombstone: {changes:?}"
    );
    assert!(changes.iter().all(|c| c.table == "sum"));
}

#[test]
fn a_bulk_change_of_a_group_logs_its_removed_keys() {
    let mut s = store();
    for i in 0..24u64 {
        apply(&mut s, &Op::Set(i as u8, i));
    }
    let mut log = s.take_changes().unwrap();
    apply(&mut s, &Op::PruneGroupOf(0));
    let changes = s.take_changes().unwrap();
    assert!(
        changes.iter().any(|c| c.value.is_none()),
        "even sums removed through group_mut become tombstones: {changes:?}"
    );
    log.extend(changes);
    assert_eq!(contents(&mut restored(log)), contents(&mut s));
}

#[test]
fn an_untracked_store_and_untouched_restored_tables_have_no_changes() {
    let mut plain = KeyedStateStore::<String>::new(MAX, KeyGroupRange::for_subtask(MAX, 1, 0));
    let k = "k".to_string();
    let g = plain.group_index(&k).unwrap();
    ValueState::new(plain.table::<u64>("sum").unwrap(), g, &k).set(1);
    assert!(plain.take_changes().unwrap().is_empty());

    let mut tracked = store();
    tracked.restore(plain.snapshot().unwrap()).unwrap();
    assert!(tracked.take_changes().unwrap().is_empty());
}
