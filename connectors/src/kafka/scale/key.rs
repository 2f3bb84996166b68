//! Keys as Kafka sees them. A scaled-out job routes a key to the task (partition) that Kafka's
//! default partitioner would pick for the same key bytes: `murmur2(bytes) & 0x7fffffff % n`.
//! That is what lets a job whose input is already partitioned by its key skip the repartition
//! topic, and what makes the repartition topic readable by any Kafka client.

/// A key's bytes as Kafka's standard serializers write them: UTF-8 for strings, the bytes
/// themselves for byte arrays, big-endian two's complement for integers
/// (`ShortSerializer`, `IntegerSerializer`, `LongSerializer`).
pub trait KafkaKey {
    /// Appends the key's bytes to `out`.
    fn write_key_bytes(&self, out: &mut Vec<u8>);

    /// The key's bytes.
    fn key_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_key_bytes(&mut out);
        out
    }
}

impl KafkaKey for str {
    fn write_key_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KafkaKey for String {
    fn write_key_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KafkaKey for [u8] {
    fn write_key_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl KafkaKey for Vec<u8> {
    fn write_key_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl<T: KafkaKey + ?Sized> KafkaKey for &T {
    fn write_key_bytes(&self, out: &mut Vec<u8>) {
        (**self).write_key_bytes(out);
    }
}

macro_rules! big_endian_key {
    ($($t:ty),*) => {$(
        impl KafkaKey for $t {
            fn write_key_bytes(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
        }
    )*};
}
big_endian_key!(i16, i32, i64);

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`, also librdkafka's
/// `murmur2` partitioner): 32-bit MurmurHash2 with seed `0x9747b28c`, little-endian words.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    let mut h = SEED ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition (task) Kafka's default partitioner picks for a record with these key bytes
/// among `partitions` partitions. `partitions` must be positive.
pub fn task_of(key_bytes: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key_bytes) as u32 & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own vectors (clients UtilsTest) and librdkafka's (rdmurmur2.c).
    #[test]
    fn murmur2_matches_kafka() {
        let cases: &[(&str, i32)] = &[
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
            ("1", -1_993_445_489),
            ("12", 126_087_238),
            ("123", -267_702_483),
            ("1234", -1_614_185_708),
            ("12345", -1_188_365_604),
            ("kafka", 0xd067_cf64_u32 as i32),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input.as_bytes()), *want, "murmur2({input:?})");
        }
    }

    /// Pinned: these keys must stay on these tasks, or state written by one release would be
    /// looked up on another task by the next.
    #[test]
    fn golden_tasks() {
        let keys = ["user-1", "user-2", "user-3", "", "k", "😀"];
        let got: Vec<u32> = keys.iter().map(|k| task_of(&k.key_bytes(), 6)).collect();
        assert_eq!(got, vec![2, 2, 5, 3, 2, 3]);
    }

    #[test]
    fn integers_are_big_endian_like_kafka_serializers() {
        assert_eq!(1i32.key_bytes(), vec![0, 0, 0, 1]);
        assert_eq!((-1i64).key_bytes(), vec![0xff; 8]);
        assert_eq!(258i16.key_bytes(), vec![1, 2]);
        assert_eq!("é".key_bytes(), "é".as_bytes().to_vec());
        assert_eq!(vec![1u8, 2].key_bytes(), vec![1, 2]);
    }
}
