//! Topic names (Kafka's rules) and the persisted topic registry (topic name -> partition count).

use super::error::{Result, StorageError};

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Checks a topic name against Kafka's rules: 1..=249 characters of `[a-zA-Z0-9._-]`, and
/// neither "." nor "..".
pub fn validate_topic_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TOPIC_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidTopic(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        for good in ["a", "orders", "a.b_c-d", "A9", &"x".repeat(249)] {
            assert!(validate_topic_name(good).is_ok(), "{good} refused");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"x".repeat(250), "a\n"] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}

/// Name of the registry file in the data directory.
pub const REGISTRY_FILE: &str = "topics.registry";
const REGISTRY_HEADER: &str = "onceflow-topics 1";

/// Serializes the registry: a header line, `name count` lines sorted by name, and a CRC-32C
/// line over everything before it.
pub fn encode_registry<'a>(topics: impl IntoIterator<Item = (&'a str, i32)>) -> Vec<u8> {
    let mut sorted: Vec<_> = topics.into_iter().collect();
    sorted.sort();
    let mut out = format!("{REGISTRY_HEADER}\n");
    for (name, n) in sorted {
        out.push_str(&format!("{name} {n}\n"));
    }
    let crc = crate::crc32c(out.as_bytes());
    out.push_str(&format!("crc32c {crc:08x}\n"));
    out.into_bytes()
}

/// Parses a registry written by [`encode_registry`]; an error says why it is not trusted.
pub fn decode_registry(
    bytes: &[u8],
    max_partitions: i32,
) -> std::result::Result<Vec<(String, i32)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "registry is not UTF-8".to_string())?;
    let text = text
        .strip_suffix('\n')
        .ok_or("registry does not end with a newline")?;
    let body_end = text.rfind('\n').ok_or("registry has no checksum line")? + 1;
    let (body, crc_line) = text.split_at(body_end);
    let stored = crc_line
        .strip_prefix("crc32c ")
        .filter(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("registry checksum line is malformed")?;
    if crate::crc32c(body.as_bytes()) != stored {
        return Err("registry checksum mismatch".into());
    }
    let mut lines = body.lines();
    if lines.next() != Some(REGISTRY_HEADER) {
        return Err("registry header missing or of an unknown version".into());
    }
    let mut out = Vec::new();
    for line in lines {
        let (name, n) = line.split_once(' ').ok_or("malformed registry line")?;
        validate_topic_name(name).map_err(|e| e.to_string())?;
        let n: i32 = n
            .parse()
            .map_err(|_| format!("bad partition count for {name}"))?;
        if !(1..=max_partitions).contains(&n) {
            return Err(format!("partition count {n} of {name} out of range"));
        }
        out.push((name.to_string(), n));
    }
    Ok(out)
}

/// The directory of a partition: `<topic>-<partition>` as in Kafka.
pub fn partition_dir_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Splits a partition directory name into topic and partition, if it is one.
pub fn parse_partition_dir(name: &str) -> Option<(&str, i32)> {
    let (topic, p) = name.rsplit_once('-')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    validate_topic_name(topic).ok()?;
    Some((topic, p.parse().ok()?))
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[test]
    fn registry_round_trips_and_rejects_damage() {
        let bytes = encode_registry([("b", 3), ("a-1", 1)]);
        assert_eq!(
            decode_registry(&bytes, 10),
            Ok(vec![("a-1".to_string(), 1), ("b".to_string(), 3)])
        );
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode_registry(&bad, 10).is_err(), "flip at {i} accepted");
        }
        assert!(decode_registry(&bytes[..bytes.len() - 3], 10).is_err());
        assert!(decode_registry(b"", 10).is_err());
        assert_eq!(decode_registry(&encode_registry([]), 10), Ok(vec![]));
    }

    #[test]
    fn partition_dirs() {
        assert_eq!(partition_dir_name("a-1", 0), "a-1-0");
        assert_eq!(parse_partition_dir("a-1-0"), Some(("a-1", 0)));
        assert_eq!(parse_partition_dir("a-"), None);
        assert_eq!(parse_partition_dir("topics.registry"), None);
    }
}
