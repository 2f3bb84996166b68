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
