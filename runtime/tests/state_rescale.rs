//! Property test: keyed state snapshotted at one parallelism and restored at any other lands
//! every entry in exactly one subtask, the one that owns its key group, with its value.

use std::collections::HashMap;

use onceflow_runtime::keygroup::{key_group_for, subtask_for_key_group, KeyGroupRange};
use onceflow_runtime::state::{KeyGroupSnapshot, KeyedStateStore, ListState, ValueState};
use proptest::prelude::*;

fn store(max: usize, p: usize, i: usize) -> KeyedStateStore<String> {
    KeyedStateStore::new(max, KeyGroupRange::for_subtask(max, p, i))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn rescaled_state_is_complete_and_owned(
        entries in proptest::collection::hash_map("[a-z]{1,8}", 0i64..1000, 0..200),
        max in 1usize..64,
        from in 1usize..8,
        to in 1usize..8,
    ) {
        let from = from.min(max);
        let to = to.min(max);
        // write at parallelism `from`
        let mut old: Vec<KeyedStateStore<String>> = (0..from).map(|i| store(max, from, i)).collect();
        for (k, v) in &entries {
            let s = subtask_for_key_group(key_group_for(k, max), max, from);
            let st = &mut old[s];
            let g = st.group_index(k).unwrap();
            ValueState::new(st.table::<i64>("v").unwrap(), g, k).set(*v);
            ListState::new(st.table::<Vec<i64>>("l").unwrap(), g, k).push(*v);
        }
        let snaps: Vec<KeyGroupSnapshot> = old.iter().flat_map(|s| s.snapshot().unwrap()).collect();
        // restore at parallelism `to`
        let mut seen: HashMap<String, i64> = HashMap::new();
        for i in 0..to {
            let mut st = store(max, to, i);
            st.restore(snaps.clone()).unwrap();
            let range = st.range();
            let mut values = Vec::new();
            let t = st.table::<i64>("v").unwrap();
            for g in 0..range.len() {
                for (k, v) in t.group(g) {
                    values.push((g, k.clone(), *v));
                }
            }
            let l = st.table::<Vec<i64>>("l").unwrap();
            prop_assert_eq!(l.len(), values.len());
            for (g, k, v) in values {
                prop_assert!(range.contains(key_group_for(&k, max)));
                prop_assert_eq!(l.group(g).get(&k), Some(&vec![v]));
                prop_assert!(seen.insert(k.clone(), v).is_none(), "key {} twice", k);
            }
        }
        prop_assert_eq!(seen, entries);
    }
}
