//! Key groups (Flink's scheme): a key hashes to one of `max_parallelism` key groups, and
//! each subtask owns a contiguous range of key groups, so keyed state can be split or merged
//! when a job restores at another parallelism.

use std::hash::{Hash, Hasher};

/// A stable 64-bit FNV-1a hasher: the same key hashes the same in every process and run.
#[derive(Debug, Clone)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        // murmur3 fmix64 to spread FNV's low bits
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        h
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The key group of `key` among `max_parallelism` groups.
pub fn key_group_for<K: Hash + ?Sized>(key: &K, max_parallelism: usize) -> u16 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    (h.finish() % max_parallelism as u64) as u16
}

/// The subtask (of `parallelism`) that owns `key_group`.
pub fn subtask_for_key_group(key_group: u16, max_parallelism: usize, parallelism: usize) -> usize {
    usize::from(key_group) * parallelism / max_parallelism
}

/// A contiguous, half-open range of key groups `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u16,
    /// One past the last key group.
    pub end: u16,
}

impl KeyGroupRange {
    /// The range owned by `subtask` of `parallelism` with `max_parallelism` key groups.
    pub fn for_subtask(max_parallelism: usize, parallelism: usize, subtask: usize) -> Self {
        let start = (subtask * max_parallelism).div_ceil(parallelism);
        let end = ((subtask + 1) * max_parallelism).div_ceil(parallelism);
        KeyGroupRange {
            start: start as u16,
            end: end as u16,
        }
    }

    /// Number of key groups.
    pub fn len(&self) -> usize {
        usize::from(self.end - self.start)
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Whether `kg` lies in the range.
    pub fn contains(&self, kg: u16) -> bool {
        kg >= self.start && kg < self.end
    }

    /// Iterates the key groups.
    pub fn iter(&self) -> impl Iterator<Item = u16> {
        self.start..self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_partition_all_groups_and_match_assignment() {
        for max in [1usize, 7, 128] {
            for p in 1..=max.min(9) {
                let mut next = 0u16;
                for s in 0..p {
                    let r = KeyGroupRange::for_subtask(max, p, s);
                    assert_eq!(r.start, next);
                    for kg in r.iter() {
                        assert_eq!(subtask_for_key_group(kg, max, p), s);
                    }
                    next = r.end;
                }
                assert_eq!(usize::from(next), max);
            }
        }
    }

    #[test]
    fn hashing_is_stable() {
        assert_eq!(
            key_group_for("word", 128),
            key_group_for(&"word".to_string(), 128)
        );
        assert_eq!(key_group_for(&42u64, 128), key_group_for(&42u64, 128));
    }
}
