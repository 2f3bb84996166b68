//! The persisted per-topic configs (`topics.configs` in the data directory): every config a
//! topic was created with or later given by AlterConfigs, as name/value text, replaced
//! atomically and checked by a CRC-32C line like `topics.registry`.
//!
//! Unlike the registry, this file cannot be rebuilt from anything else, and it is only ever
//! replaced atomically (never torn), so a file that fails to verify refuses the start.

use std::collections::BTreeMap;

use super::topics::validate_topic_name;

/// Name of the file in the data directory.
pub const CONFIG_FILE: &str = "topics.configs";
const HEADER: &str = "onceflow-topic-configs 1";

/// Configs per topic: topic -> (config name -> value).
pub type TopicConfigs = BTreeMap<String, BTreeMap<String, String>>;

/// Serializes `configs`: a header line, one `topic name value` line per config (sorted; the
/// value percent-escaped so it holds no spaces or newlines), and a CRC-32C line over
/// everything before it. Topics without configs are left out.
pub fn encode(configs: &TopicConfigs) -> Vec<u8> {
    let mut out = format!("{HEADER}\n");
    for (topic, entries) in configs {
        for (name, value) in entries {
            out.push_str(&format!("{topic} {} {}\n", escape(name), escape(value)));
        }
    }
    let crc = crate::crc32c(out.as_bytes());
    out.push_str(&format!("crc32c {crc:08x}\n"));
    out.into_bytes()
}

/// Parses a file written by [`encode`]; an error says why it is not trusted.
pub fn decode(bytes: &[u8]) -> Result<TopicConfigs, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let text = text
        .strip_suffix('\n')
        .ok_or("does not end with a newline (the file is incomplete)")?;
    let body_end = text.rfind('\n').ok_or("has no checksum line")? + 1;
    let (body, crc_line) = text.split_at(body_end);
    let stored = crc_line
        .strip_prefix("crc32c ")
        .filter(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("checksum line is malformed")?;
    let computed = crate::crc32c(body.as_bytes());
    if computed != stored {
        return Err(format!(
            "checksum mismatch: stored {stored:08x}, computed {computed:08x}"
        ));
    }
    let mut lines = body.lines();
    if lines.next() != Some(HEADER) {
        return Err("header missing or of an unknown version".into());
    }
    let mut out = TopicConfigs::new();
    for (n, line) in lines.enumerate() {
        let mut parts = line.split(' ');
        let (Some(topic), Some(name), Some(value), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("line {} is malformed", n + 2));
        };
        validate_topic_name(topic).map_err(|e| format!("line {}: {e}", n + 2))?;
        let name = unescape(name).ok_or_else(|| format!("line {}: bad escape", n + 2))?;
        let value = unescape(value).ok_or_else(|| format!("line {}: bad escape", n + 2))?;
        out.entry(topic.to_string())
            .or_default()
            .insert(name, value);
    }
    Ok(out)
}

/// Percent-escapes `%`, spaces, control characters and non-ASCII bytes; the empty string is
/// written as `%` alone so every field has at least one character.
fn escape(s: &str) -> String {
    if s.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    if s == "%" {
        return Some(String::new());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TopicConfigs {
        let mut c = TopicConfigs::new();
        let t = c.entry("orders".to_string()).or_default();
        t.insert("retention.ms".into(), "60000".into());
        t.insert("cleanup.policy".into(), "compact,delete".into());
        t.insert("follower.replication.throttled.replicas".into(), "".into());
        t.insert("message.format.version".into(), "a b%\nü".into());
        c.entry("p.2".to_string())
            .or_default()
            .insert("segment.bytes".into(), "1024".into());
        c
    }

    #[test]
    fn configs_round_trip() {
        let c = sample();
        assert_eq!(decode(&encode(&c)), Ok(c));
        assert_eq!(
            decode(&encode(&TopicConfigs::new())),
            Ok(TopicConfigs::new())
        );
    }

    #[test]
    fn any_damage_is_refused() {
        let bytes = encode(&sample());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "flip at {i} accepted");
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
    }
}
