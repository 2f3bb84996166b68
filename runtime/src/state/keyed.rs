//! In-memory keyed state: named, typed tables split by key group, with value, map and list
//! handles. State restored from a checkpoint stays as bytes until first accessed with its
//! type, so an operator only needs to know its state types when it touches them.

use serde::Serialize;
use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::element::{Data, Key};
use crate::keygroup::{key_group_for, KeyGroupRange};
use crate::state::format::{decode, encode};
use crate::state::snapshot::KeyGroupSnapshot;
use crate::{Error, Result};

/// One named state table: a map from key to `V` per key group of the subtask's range.
#[derive(Debug)]
pub struct StateTable<K, V> {
    groups: Vec<HashMap<K, V>>,
    /// Which keys changed since the last [`KeyedStateStore::take_changes`], per key group;
    /// `None` when the store does not track changes.
    changes: Option<Vec<GroupChanges<K>>>,
}

/// The changes of one key group since they were last taken.
#[derive(Debug)]
struct GroupChanges<K> {
    /// Keys opened for writing.
    keys: HashSet<K>,
    /// The group's keys when it was first handed out whole ([`StateTable::group_mut`]): every
    /// key present then or now may have changed.
    whole: Option<HashSet<K>>,
}

impl<K> Default for GroupChanges<K> {
    fn default() -> Self {
        GroupChanges {
            keys: HashSet::new(),
            whole: None,
        }
    }
}

impl<K: Key, V: Data> StateTable<K, V> {
    fn new(groups: usize, track_changes: bool) -> Self {
        StateTable {
            groups: (0..groups).map(|_| HashMap::new()).collect(),
            changes: track_changes.then(|| (0..groups).map(|_| GroupChanges::default()).collect()),
        }
    }

    /// The entries of the key group at `index` (relative to the subtask's range). When the
    /// store tracks changes, every key of the group counts as changed; prefer
    /// [`StateTable::key_mut`] when the change concerns one key.
    pub fn group_mut(&mut self, index: usize) -> &mut HashMap<K, V> {
        if let Some(changes) = &mut self.changes {
            let c = &mut changes[index];
            if c.whole.is_none() {
                c.whole = Some(self.groups[index].keys().cloned().collect());
            }
        }
        &mut self.groups[index]
    }

    /// The entries of the key group at `index`, to change the entry of `key` only (insert,
    /// update or remove it): when the store tracks changes, `key` counts as changed.
    pub fn key_mut(&mut self, index: usize, key: &K) -> &mut HashMap<K, V> {
        if let Some(changes) = &mut self.changes {
            let c = &mut changes[index];
            if c.whole.is_none() && !c.keys.contains(key) {
                c.keys.insert(key.clone());
            }
        }
        &mut self.groups[index]
    }

    /// The entries of the key group at `index` (relative to the subtask's range).
    pub fn group(&self, index: usize) -> &HashMap<K, V> {
        &self.groups[index]
    }

    /// Total entries over all key groups.
    pub fn len(&self) -> usize {
        self.groups.iter().map(HashMap::len).sum()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A changed entry, encoded: (key group index in the range, key, value or `None` when the key
/// was removed).
type EncodedChange = (usize, Vec<u8>, Option<Vec<u8>>);

trait ErasedTable<K>: Send {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn snapshot_group(&self, index: usize) -> Result<Option<Vec<u8>>>;
    fn entries(&self) -> usize;
    /// The changed entries since the last call.
    fn take_changes(&mut self) -> Result<Vec<EncodedChange>>;
}

impl<K: Key, V: Data> ErasedTable<K> for StateTable<K, V> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn snapshot_group(&self, index: usize) -> Result<Option<Vec<u8>>> {
        let g = &self.groups[index];
        if g.is_empty() {
            return Ok(None);
        }
        let entries: Vec<(&K, &V)> = g.iter().collect();
        encode(&entries).map(Some)
    }

    fn entries(&self) -> usize {
        self.len()
    }

    fn take_changes(&mut self) -> Result<Vec<EncodedChange>> {
        let Some(changes) = &mut self.changes else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (index, c) in changes.iter_mut().enumerate() {
            let group = &self.groups[index];
            let mut keys = std::mem::take(&mut c.keys);
            if let Some(whole) = c.whole.take() {
                keys.extend(whole);
                keys.extend(group.keys().cloned());
            }
            for key in keys {
                let value = group.get(&key).map(encode).transpose()?;
                out.push((index, encode(&key)?, value));
            }
        }
        Ok(out)
    }
}

enum Slot<K> {
    Typed(Box<dyn ErasedTable<K>>),
    /// Restored bytes per key group, not yet accessed with a type.
    Raw(Vec<(u16, Vec<u8>)>),
}

/// One changed entry of a keyed state table: what a changelog record carries. The key and
/// value are encoded as in a snapshot (bincode), so [`snapshots_from_changes`] can rebuild
/// key-group snapshots from a sequence of changes without knowing the types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateChange {
    /// State table name.
    pub table: String,
    /// The key's key group.
    pub key_group: u16,
    /// The encoded key.
    pub key: Vec<u8>,
    /// The encoded value, or `None` when the key was removed (a tombstone).
    pub value: Option<Vec<u8>>,
}

/// The keyed state of one operator subtask.
pub struct KeyedStateStore<K> {
    /// Who owns the store, for error messages (`operator` or `operator[subtask]`).
    owner: String,
    max_parallelism: usize,
    range: KeyGroupRange,
    tables: Vec<(String, Slot<K>)>,
    track_changes: bool,
}

impl<K: Key> KeyedStateStore<K> {
    /// An empty store for the key groups of `range`.
    pub fn new(max_parallelism: usize, range: KeyGroupRange) -> Self {
        KeyedStateStore {
            owner: "unnamed operator".to_string(),
            max_parallelism,
            range,
            tables: Vec::new(),
            track_changes: false,
        }
    }

    /// Records which keys change, for [`KeyedStateStore::take_changes`] (a changelog of the
    /// state). Set before the first table is used.
    pub fn tracking_changes(mut self) -> Self {
        self.track_changes = true;
        self
    }

    /// Starts recording which keys change (as [`KeyedStateStore::tracking_changes`]), for a
    /// store already built. Call it before the first table is used: tables used earlier do not
    /// track.
    pub fn track_changes(&mut self) {
        self.track_changes = true;
    }

    /// Names the operator subtask owning the store; errors about its state name it.
    pub fn owned_by(mut self, operator: &str, subtask: usize) -> Self {
        self.owner = format!("{operator}[{subtask}]");
        self
    }

    /// The key-group range this store holds.
    pub fn range(&self) -> KeyGroupRange {
        self.range
    }

    /// The index (relative to the range) of `key`'s key group; an error if another subtask
    /// owns it (a partitioning bug).
    pub fn group_index<Q: Serialize + ?Sized>(&self, key: &Q) -> Result<usize> {
        let kg = key_group_for(key, self.max_parallelism);
        if !self.range.contains(kg) {
            return Err(Error::Internal(format!(
                "key group {kg} routed to a subtask owning {:?}",
                self.range
            )));
        }
        Ok(usize::from(kg - self.range.start))
    }

    /// The table `name` with value type `V`, created empty on first use.
    pub fn table<V: Data>(&mut self, name: &str) -> Result<&mut StateTable<K, V>> {
        let pos = match self.tables.iter().position(|(n, _)| n == name) {
            Some(p) => p,
            None => {
                self.tables.push((
                    name.to_string(),
                    Slot::Typed(Box::new(StateTable::<K, V>::new(
                        self.range.len(),
                        self.track_changes,
                    ))),
                ));
                self.tables.len() - 1
            }
        };
        let range = self.range;
        let slot = &mut self.tables[pos].1;
        if let Slot::Raw(groups) = slot {
            let mut table = StateTable::<K, V>::new(range.len(), self.track_changes);
            for (kg, bytes) in groups.drain(..) {
                let entries: Vec<(K, V)> = decode(&bytes).map_err(|e| Error::StateTypeChanged {
                    operator: self.owner.clone(),
                    state: name.to_string(),
                    key_group: kg,
                    expected: std::any::type_name::<(K, V)>().to_string(),
                    reason: e.to_string(),
                })?;
                table.groups[usize::from(kg - range.start)].extend(entries);
            }
            *slot = Slot::Typed(Box::new(table));
        }
        match slot {
            Slot::Typed(t) => t
                .as_any_mut()
                .downcast_mut::<StateTable<K, V>>()
                .ok_or_else(|| {
                    Error::InvalidJob(format!(
                        "operator `{}`: state `{name}` accessed with two different types",
                        self.owner
                    ))
                }),
            Slot::Raw(_) => Err(Error::Internal("state table left undecoded".into())),
        }
    }

    /// Loads restored key groups (those outside the range are ignored).
    pub fn restore(&mut self, groups: Vec<KeyGroupSnapshot>) -> Result<()> {
        for g in groups {
            if !self.range.contains(g.key_group) {
                continue;
            }
            for (name, bytes) in g.tables {
                let pos = match self.tables.iter().position(|(n, _)| *n == name) {
                    Some(p) => p,
                    None => {
                        self.tables.push((name.clone(), Slot::Raw(Vec::new())));
                        self.tables.len() - 1
                    }
                };
                match &mut self.tables[pos].1 {
                    Slot::Raw(v) => v.push((g.key_group, bytes)),
                    Slot::Typed(_) => {
                        return Err(Error::Internal(format!(
                            "restore into state `{name}` after it was used"
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Serializes every non-empty key group.
    pub fn snapshot(&self) -> Result<Vec<KeyGroupSnapshot>> {
        let mut out = Vec::new();
        for (i, kg) in self.range.iter().enumerate() {
            let mut tables = Vec::new();
            for (name, slot) in &self.tables {
                match slot {
                    Slot::Typed(t) => {
                        if let Some(bytes) = t.snapshot_group(i)? {
                            tables.push((name.clone(), bytes));
                        }
                    }
                    Slot::Raw(groups) => {
                        if let Some((_, b)) = groups.iter().find(|(g, _)| *g == kg) {
                            tables.push((name.clone(), b.clone()));
                        }
                    }
                }
            }
            if !tables.is_empty() {
                out.push(KeyGroupSnapshot {
                    key_group: kg,
                    tables,
                });
            }
        }
        Ok(out)
    }

    /// The entries changed since the last call (every key opened for writing, and a tombstone
    /// for each removed one), in a stable order: by table, key group, key. Empty unless the
    /// store was made [`KeyedStateStore::tracking_changes`]. Restored tables that were not
    /// used since have no changes.
    pub fn take_changes(&mut self) -> Result<Vec<StateChange>> {
        let mut out = Vec::new();
        for (name, slot) in &mut self.tables {
            let Slot::Typed(t) = slot else { continue };
            for (index, key, value) in t.take_changes()? {
                out.push(StateChange {
                    table: name.clone(),
                    key_group: self.range.start + index as u16,
                    key,
                    value,
                });
            }
        }
        out.sort_by(|a, b| (&a.table, a.key_group, &a.key).cmp(&(&b.table, b.key_group, &b.key)));
        Ok(out)
    }

    /// Number of entries over all typed tables (restored, untouched tables are not counted).
    pub fn entries(&self) -> usize {
        self.tables
            .iter()
            .map(|(_, s)| match s {
                Slot::Typed(t) => t.entries(),
                Slot::Raw(_) => 0,
            })
            .sum()
    }
}

/// Folds a changelog (oldest change first) into key-group snapshots that
/// [`KeyedStateStore::restore`] loads: the last change of each (table, key) wins and a
/// tombstone removes the key. The entries are spliced from their encoded key and value
/// bytes (bincode encodes a sequence as its length followed by its elements, and a pair as
/// its two halves), so no type is needed until the operator reads its state.
pub fn snapshots_from_changes(
    changes: impl IntoIterator<Item = StateChange>,
) -> Result<Vec<KeyGroupSnapshot>> {
    let mut latest: BTreeMap<(u16, String), BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for c in changes {
        let entries = latest.entry((c.key_group, c.table)).or_default();
        match c.value {
            Some(v) => {
                entries.insert(c.key, v);
            }
            None => {
                entries.remove(&c.key);
            }
        }
    }
    let mut out: Vec<KeyGroupSnapshot> = Vec::new();
    for ((key_group, table), entries) in latest {
        if entries.is_empty() {
            continue;
        }
        let mut bytes = encode(&(entries.len() as u64))?;
        for (k, v) in entries {
            bytes.extend_from_slice(&k);
            bytes.extend_from_slice(&v);
        }
        match out.last_mut() {
            Some(last) if last.key_group == key_group => last.tables.push((table, bytes)),
            _ => out.push(KeyGroupSnapshot {
                key_group,
                tables: vec![(table, bytes)],
            }),
        }
    }
    Ok(out)
}

/// A single value per key.
pub struct ValueState<'a, K, V> {
    map: &'a mut HashMap<K, V>,
    key: &'a K,
}

impl<'a, K: Key, V: Data> ValueState<'a, K, V> {
    /// Handle on `key`'s entry in `table` (group index from [`KeyedStateStore::group_index`]).
    pub fn new(table: &'a mut StateTable<K, V>, group: usize, key: &'a K) -> Self {
        ValueState {
            map: table.key_mut(group, key),
            key,
        }
    }

    /// The current value.
    pub fn get(&self) -> Option<&V> {
        self.map.get(self.key)
    }

    /// Replaces the value. The key is cloned only when it has no entry yet.
    pub fn set(&mut self, v: V) {
        match self.map.get_mut(self.key) {
            Some(slot) => *slot = v,
            None => {
                self.map.insert(self.key.clone(), v);
            }
        }
    }

    /// Removes and returns the value.
    pub fn take(&mut self) -> Option<V> {
        self.map.remove(self.key)
    }

    /// Removes the value.
    pub fn clear(&mut self) {
        self.map.remove(self.key);
    }

    /// Mutable access to the value, inserting `default()` first if absent.
    pub fn get_or_insert_with(&mut self, default: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(self.key) {
            self.map.insert(self.key.clone(), default());
        }
        self.map
            .get_mut(self.key)
            .expect("value present: inserted just above")
    }
}

/// A map per key.
pub struct MapState<'a, K, MK, MV> {
    map: &'a mut HashMap<K, HashMap<MK, MV>>,
    key: &'a K,
}

impl<'a, K: Key, MK: Key, MV: Data> MapState<'a, K, MK, MV> {
    /// Handle on `key`'s map in `table`.
    pub fn new(table: &'a mut StateTable<K, HashMap<MK, MV>>, group: usize, key: &'a K) -> Self {
        MapState {
            map: table.key_mut(group, key),
            key,
        }
    }

    /// Value of `k`.
    pub fn get(&self, k: &MK) -> Option<&MV> {
        self.map.get(self.key).and_then(|m| m.get(k))
    }

    /// Inserts `k -> v`, returning the previous value.
    pub fn insert(&mut self, k: MK, v: MV) -> Option<MV> {
        self.map.entry(self.key.clone()).or_default().insert(k, v)
    }

    /// Removes `k`.
    pub fn remove(&mut self, k: &MK) -> Option<MV> {
        let m = self.map.get_mut(self.key)?;
        let v = m.remove(k);
        if m.is_empty() {
            self.map.remove(self.key);
        }
        v
    }

    /// Whether `k` is present.
    pub fn contains(&self, k: &MK) -> bool {
        self.get(k).is_some()
    }

    /// Iterates the entries (arbitrary order).
    pub fn iter(&self) -> impl Iterator<Item = (&MK, &MV)> {
        self.map.get(self.key).into_iter().flat_map(|m| m.iter())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.get(self.key).map_or(0, HashMap::len)
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.map.remove(self.key);
    }
}

/// A list per key.
pub struct ListState<'a, K, V> {
    map: &'a mut HashMap<K, Vec<V>>,
    key: &'a K,
}

impl<'a, K: Key, V: Data> ListState<'a, K, V> {
    /// Handle on `key`'s list in `table`.
    pub fn new(table: &'a mut StateTable<K, Vec<V>>, group: usize, key: &'a K) -> Self {
        ListState {
            map: table.key_mut(group, key),
            key,
        }
    }

    /// Appends `v`.
    pub fn push(&mut self, v: V) {
        self.map.entry(self.key.clone()).or_default().push(v);
    }

    /// The list (empty if none).
    pub fn get(&self) -> &[V] {
        self.map.get(self.key).map_or(&[], Vec::as_slice)
    }

    /// Removes and returns the list.
    pub fn take(&mut self) -> Vec<V> {
        self.map.remove(self.key).unwrap_or_default()
    }

    /// Removes the list.
    pub fn clear(&mut self) {
        self.map.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_restores_at_other_ranges() {
        let max = 16;
        let mut a = KeyedStateStore::<String>::new(max, KeyGroupRange::for_subtask(max, 1, 0));
        for i in 0..100 {
            let k = format!("k{i}");
            let g = a.group_index(&k).unwrap();
            ValueState::new(a.table::<u64>("sum").unwrap(), g, &k).set(i);
        }
        let snap = a.snapshot().unwrap();
        let mut seen = 0;
        for s in 0..3 {
            let range = KeyGroupRange::for_subtask(max, 3, s);
            let mut b = KeyedStateStore::<String>::new(max, range);
            b.restore(snap.clone()).unwrap();
            let t = b.table::<u64>("sum").unwrap();
            seen += t.len();
        }
        assert_eq!(seen, 100);
        let mut c = KeyedStateStore::<String>::new(max, KeyGroupRange::for_subtask(max, 1, 0));
        c.restore(snap).unwrap();
        assert!(c.table::<String>("sum").is_err());
    }

    #[test]
    fn a_state_whose_type_changed_names_the_operator_and_the_state() {
        let max = 4;
        let range = KeyGroupRange::for_subtask(max, 1, 0);
        let mut a = KeyedStateStore::<String>::new(max, range).owned_by("totals", 0);
        let k = "key".to_string();
        let g = a.group_index(&k).unwrap();
        ValueState::new(a.table::<(String, String)>("sum").unwrap(), g, &k)
            .set(("a".into(), "b".into()));
        let mut b = KeyedStateStore::<String>::new(max, range).owned_by("totals", 0);
        b.restore(a.snapshot().unwrap()).unwrap();
        let Err(err) = b.table::<Vec<u64>>("sum") else {
            panic!("a type change must be detected");
        };
        assert!(
            matches!(&err, Error::StateTypeChanged { operator, state, .. }
                if operator == "totals[0]" && state == "sum"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("operator `totals[0]`")
                && message.contains("state `sum`")
                && message.contains("Vec<u64>"),
            "{message}"
        );
        assert_eq!(err.fault(), crate::error::Fault::User);
    }
}
