//! The timer service of keyed operators: event-time and processing-time timers per key.
//!
//! A timer is `(key, timestamp)`; registering the same one twice keeps one (deduplicated).
//! The set of timers of each key lives in keyed state (tables [`EVENT_TIMERS`] and
//! [`PROCESSING_TIMERS`]), so pending timers are part of every checkpoint and move with
//! their key group when a job is restored at another parallelism. An in-memory queue ordered
//! by timestamp is rebuilt from that state on restore; timers fire in timestamp order (ties:
//! registration order). Deleting a timer removes it from state; its queue entry is skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onceflow_runtime::state::KeyedStateStore;
use onceflow_runtime::{Key, Result};

/// Keyed-state table holding each key's pending event-time timers.
pub const EVENT_TIMERS: &str = "__onceflow_timers_event";
/// Keyed-state table holding each key's pending processing-time timers.
pub const PROCESSING_TIMERS: &str = "__onceflow_timers_processing";

/// Which clock a timer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the watermark reaches the timestamp.
    EventTime,
    /// Fires when the wall clock (ms since the Unix epoch) reaches the timestamp.
    ProcessingTime,
}

impl TimeDomain {
    fn table(self) -> &'static str {
        match self {
            TimeDomain::EventTime => EVENT_TIMERS,
            TimeDomain::ProcessingTime => PROCESSING_TIMERS,
        }
    }
}

/// Wall-clock time in ms since the Unix epoch (the processing-time clock).
pub fn processing_time_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Pending timers of one keyed operator subtask (queues; the timers themselves are in the
/// keyed state store passed to each call).
pub struct TimerService<K> {
    event: BTreeMap<i64, Vec<K>>,
    processing: BTreeMap<i64, Vec<K>>,
}

impl<K: Key> Default for TimerService<K> {
    fn default() -> Self {
        TimerService {
            event: BTreeMap::new(),
            processing: BTreeMap::new(),
        }
    }
}

impl<K: Key> TimerService<K> {
    /// An empty service.
    pub fn new() -> Self {
        Self::default()
    }

    fn queue(&mut self, domain: TimeDomain) -> &mut BTreeMap<i64, Vec<K>> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Rebuilds the queues from restored keyed state (call after `store.restore`).
    pub fn restore(&mut self, store: &mut KeyedStateStore<K>) -> Result<()> {
        for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            let groups = store.range().len();
            let table = store.table::<BTreeSet<i64>>(domain.table())?;
            let mut q: BTreeMap<i64, Vec<K>> = BTreeMap::new();
            for g in 0..groups {
                for (k, set) in table.group(g) {
                    for ts in set {
                        q.entry(*ts).or_default().push(k.clone());
                    }
                }
            }
            *self.queue(domain) = q;
        }
        Ok(())
    }

    /// Registers a timer for `key` (a no-op if it already exists).
    pub fn register(
        &mut self,
        store: &mut KeyedStateStore<K>,
        domain: TimeDomain,
        key: &K,
        timestamp: i64,
    ) -> Result<()> {
        let g = store.group_index(key)?;
        let table = store.table::<BTreeSet<i64>>(domain.table())?;
        let set = table.key_mut(g, key).entry(key.clone()).or_default();
        if set.insert(timestamp) {
            self.queue(domain)
                .entry(timestamp)
                .or_default()
                .push(key.clone());
        }
        Ok(())
    }

    /// Deletes a timer of `key` (a no-op if absent).
    pub fn delete(
        &mut self,
        store: &mut KeyedStateStore<K>,
        domain: TimeDomain,
        key: &K,
        timestamp: i64,
    ) -> Result<()> {
        let g = store.group_index(key)?;
        let map = store
            .table::<BTreeSet<i64>>(domain.table())?
            .key_mut(g, key);
        if let Some(set) = map.get_mut(key) {
            set.remove(&timestamp);
            if set.is_empty() {
                map.remove(key);
            }
        }
        Ok(())
    }

    /// Removes and returns the earliest pending timer with timestamp `<= up_to`, if any.
    /// Call repeatedly: a timer registered while firing is seen by the next call.
    pub fn pop_due(
        &mut self,
        store: &mut KeyedStateStore<K>,
        domain: TimeDomain,
        up_to: i64,
    ) -> Result<Option<(K, i64)>> {
        loop {
            let Some(mut entry) = self.queue(domain).first_entry() else {
                return Ok(None);
            };
            let ts = *entry.key();
            if ts > up_to {
                return Ok(None);
            }
            let key = entry.get_mut().remove(0);
            if entry.get().is_empty() {
                entry.remove();
            }
            let g = store.group_index(&key)?;
            let map = store
                .table::<BTreeSet<i64>>(domain.table())?
                .key_mut(g, &key);
            let Some(set) = map.get_mut(&key) else {
                continue; // deleted
            };
            if !set.remove(&ts) {
                continue; // deleted
            }
            if set.is_empty() {
                map.remove(&key);
            }
            return Ok(Some((key, ts)));
        }
    }

    /// The earliest queued timestamp of `domain` (possibly a deleted timer).
    pub fn next_timestamp(&self, domain: TimeDomain) -> Option<i64> {
        match domain {
            TimeDomain::EventTime => self.event.keys().next().copied(),
            TimeDomain::ProcessingTime => self.processing.keys().next().copied(),
        }
    }

    /// When the earliest processing-time timer is due, as an [`Instant`].
    pub fn processing_deadline(&self) -> Option<Instant> {
        let ts = self.next_timestamp(TimeDomain::ProcessingTime)?;
        let wait = ts.saturating_sub(processing_time_ms()).max(0);
        Some(Instant::now() + Duration::from_millis(u64::try_from(wait).unwrap_or(0)))
    }

    /// Number of queued timers (including deleted ones not yet skipped).
    pub fn queued(&self) -> usize {
        self.event.values().map(Vec::len).sum::<usize>()
            + self.processing.values().map(Vec::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onceflow_runtime::keygroup::KeyGroupRange;

    fn store() -> KeyedStateStore<String> {
        KeyedStateStore::new(8, KeyGroupRange::for_subtask(8, 1, 0))
    }

    #[test]
    fn timers_fire_in_order_once_and_survive_a_snapshot() {
        let mut s = store();
        let mut t = TimerService::new();
        let (a, b) = ("a".to_string(), "b".to_string());
        t.register(&mut s, TimeDomain::EventTime, &a, 30).unwrap();
        t.register(&mut s, TimeDomain::EventTime, &b, 10).unwrap();
        t.register(&mut s, TimeDomain::EventTime, &a, 10).unwrap();
        t.register(&mut s, TimeDomain::EventTime, &a, 10).unwrap(); // duplicate
        t.register(&mut s, TimeDomain::EventTime, &b, 20).unwrap();
        t.delete(&mut s, TimeDomain::EventTime, &b, 20).unwrap();
        let snap = s.snapshot().unwrap();
        let mut s2 = store();
        s2.restore(snap).unwrap();
        let mut t2 = TimerService::new();
        t2.restore(&mut s2).unwrap();
        for (s, t) in [(&mut s, &mut t), (&mut s2, &mut t2)] {
            let mut fired = Vec::new();
            while let Some(x) = t.pop_due(s, TimeDomain::EventTime, 25).unwrap() {
                fired.push(x);
            }
            fired.sort();
            assert_eq!(fired, vec![(a.clone(), 10), (b.clone(), 10)]);
            assert_eq!(
                t.pop_due(s, TimeDomain::EventTime, 100).unwrap(),
                Some((a.clone(), 30))
            );
            assert_eq!(t.pop_due(s, TimeDomain::EventTime, i64::MAX).unwrap(), None);
        }
    }
}
