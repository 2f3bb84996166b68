//! Key groups (Flink's scheme): a key hashes to one of `max_parallelism` key groups, and
//! each subtask owns a contiguous range of key groups, so keyed state can be split or merged
//! when a job restores at another parallelism.
//!
//! The key group of a key is part of every checkpoint: state is stored per key group, and a
//! restored key must land in the group its state was saved under. So the hash has a fixed
//! definition that no toolchain or platform change moves: XXH3-64 (seed 0) over the key's
//! bincode 2 `standard()` encoding (little endian, varint integers and lengths; a `String` and
//! a `&str` encode alike), modulo `max_parallelism`. The std `Hash` stream is not used: Rust
//! does not promise it stable across releases. `tests::golden_key_groups` pins the mapping;
//! changing it is a checkpoint format change (`state::format::FORMAT_VERSION`).

use std::cell::RefCell;

use serde::Serialize;

thread_local! {
    /// Reused encoding buffer: hashing a key allocates nothing after the first call.
    static KEY_BYTES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The stable 64-bit hash of `key`: XXH3-64 of its bincode `standard()` encoding.
///
/// A key whose `Serialize` fails (a custom impl returning an error) hashes the bytes encoded
/// up to the failure; that is still deterministic.
pub fn stable_key_hash<K: Serialize + ?Sized>(key: &K) -> u64 {
    KEY_BYTES.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        let _ = bincode::serde::encode_into_std_write(key, &mut *buf, bincode::config::standard());
        xxhash_rust::xxh3::xxh3_64(&buf)
    })
}

/// The key group of a key given as its bincode `standard()` encoding (what a changelog
/// record carries) among `max_parallelism` groups: the same group as [`key_group_for`] of the
/// key itself.
pub fn key_group_of_encoded(encoded: &[u8], max_parallelism: usize) -> u16 {
    (xxhash_rust::xxh3::xxh3_64(encoded) % max_parallelism as u64) as u16
}

/// The key group of `key` among `max_parallelism` groups.
pub fn key_group_for<K: Serialize + ?Sized>(key: &K, max_parallelism: usize) -> u16 {
    (stable_key_hash(key) % max_parallelism as u64) as u16
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
    fn borrowed_and_owned_keys_share_a_group() {
        assert_eq!(
            key_group_for("word", 128),
            key_group_for(&"word".to_string(), 128)
        );
        assert_eq!(
            key_group_for(&[1u8, 2][..], 128),
            key_group_for(&vec![1u8, 2], 128)
        );
    }

    #[derive(Serialize)]
    struct Composite {
        tenant: String,
        id: u64,
    }

    /// The mapping is part of the checkpoint format: if this table changes, keys restored
    /// from an older checkpoint would land in other key groups than their state. Change it
    /// only together with `state::format::FORMAT_VERSION`.
    #[test]
    fn golden_key_groups() {
        let got: Vec<(String, u64, u16)> = vec![
            ("0u64", stable_key_hash(&0u64), key_group_for(&0u64, 128)),
            ("42u64", stable_key_hash(&42u64), key_group_for(&42u64, 128)),
            (
                "u64::MAX",
                stable_key_hash(&u64::MAX),
                key_group_for(&u64::MAX, 128),
            ),
            ("-7i32", stable_key_hash(&-7i32), key_group_for(&-7i32, 128)),
            ("\"\"", stable_key_hash(""), key_group_for("", 128)),
            (
                "\"word\"",
                stable_key_hash("word"),
                key_group_for("word", 128),
            ),
            (
                "\"user-17\"",
                stable_key_hash("user-17"),
                key_group_for("user-17", 32768),
            ),
            (
                "(\"a\", 1u32)",
                stable_key_hash(&("a", 1u32)),
                key_group_for(&("a", 1u32), 128),
            ),
            (
                "Composite",
                stable_key_hash(&Composite {
                    tenant: "t1".into(),
                    id: 9,
                }),
                key_group_for(
                    &Composite {
                        tenant: "t1".into(),
                        id: 9,
                    },
                    128,
                ),
            ),
        ]
        .into_iter()
        .map(|(k, h, g)| (k.to_string(), h, g))
        .collect();
        let want: Vec<(&str, u64, u16)> = GOLDEN.to_vec();
        let got_ref: Vec<(&str, u64, u16)> =
            got.iter().map(|(k, h, g)| (k.as_str(), *h, *g)).collect();
        assert_eq!(
            got_ref, want,
            "the key-group hash changed: see the module docs"
        );
    }

    /// Keys, their stable hash and their key group (max_parallelism 128, or 32768 for
    /// `"user-17"`). `0u64` and `""` both encode as the single byte 0.
    const GOLDEN: &[(&str, u64, u16)] = &[
        ("0u64", 14144645293874801883, 91),
        ("42u64", 8777568547874204941, 13),
        ("u64::MAX", 7535929292795741013, 85),
        ("-7i32", 9953473643821969856, 64),
        ("\"\"", 14144645293874801883, 91),
        ("\"word\"", 10950200382094629398, 22),
        ("\"user-17\"", 8252118878546310503, 13671),
        ("(\"a\", 1u32)", 10861928266174487580, 28),
        ("Composite", 2846789076060575957, 85),
    ];

    /// The definition, checked against published values rather than this code's own output:
    /// the encoding is bincode's standard one, and XXH3-64 of the empty input is the
    /// reference implementation's test vector.
    #[test]
    fn hash_is_xxh3_of_the_standard_encoding() {
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        let word = bincode::serde::encode_to_vec("word", bincode::config::standard()).unwrap();
        assert_eq!(word, b"\x04word");
        assert_eq!(
            stable_key_hash("word"),
            xxhash_rust::xxh3::xxh3_64(b"\x04word")
        );
        assert_eq!(
            stable_key_hash(&300u64),
            xxhash_rust::xxh3::xxh3_64(&[251, 0x2c, 0x01])
        );
    }
}
