//! The file the authorizer persists its bindings in (`<data-dir>/acls`).
//!
//! Format v2: a header line `onceflow-acls v2 crc32c=XXXXXXXX` (CRC-32C of the rest), then
//! one binding per line, seven space-separated fields
//! (`principal host operation permission resource-type pattern-type name`) in which every
//! `%`, whitespace and control character is percent-escaped byte by byte (`%20` for a space,
//! `%0A` for a newline, `%25` for `%`). A field therefore never holds the separator or a line
//! end, so any principal (`User:CN=John Smith,O=Acme`) and any resource name round-trips
//! exactly, and no name can add a binding of its own.
//!
//! Format v1 (written by older brokers) had the same header with `v1` and unescaped fields
//! split on whitespace. It is still read: a v1 file can only hold bindings without
//! whitespace in any field (those with it made the old broker refuse to start), which read
//! back the same. The file is rewritten as v2 when it is opened.
//!
//! The file is replaced atomically (temporary file, fsync, rename, fsync of the directory).
//! A file whose checksum does not match refuses the start.

use std::path::Path;

use super::acl::{
    parse_acl_lines, AclBinding, AclOperation, PatternType, Permission, ResourceType,
};
use crate::error::{BrokerError, Result};

const HEADER_V1: &str = "onceflow-acls v1 crc32c=";
const HEADER_V2: &str = "onceflow-acls v2 crc32c=";

/// What [`read`] found.
#[derive(Debug, Default)]
pub struct Stored {
    /// The bindings.
    pub bindings: Vec<AclBinding>,
    /// Whether the file is in an older format and should be rewritten.
    pub outdated: bool,
}

/// Reads the store; a missing file is an empty store.
pub fn read(path: &Path) -> Result<Stored> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Stored::default()),
        Err(source) => {
            return Err(BrokerError::Io {
                context: format!("reading ACLs from {}", path.display()),
                source,
            })
        }
    };
    let corrupt = |why: &str| {
        BrokerError::Config(format!(
            "ACL store {} is corrupt ({why}); restore it from a backup or remove it and recreate the ACLs",
            path.display()
        ))
    };
    let text = String::from_utf8(bytes).map_err(|_| corrupt("not UTF-8"))?;
    let (header, body) = text.split_once('\n').ok_or_else(|| corrupt("no header"))?;
    let (version, hex) = if let Some(hex) = header.strip_prefix(HEADER_V2) {
        (2, hex)
    } else if let Some(hex) = header.strip_prefix(HEADER_V1) {
        (1, hex)
    } else {
        return Err(corrupt("bad header"));
    };
    let crc = u32::from_str_radix(hex, 16).map_err(|_| corrupt("bad header"))?;
    if crate::crc32c(body.as_bytes()) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    let bindings = if version == 1 {
        parse_acl_lines(body).map_err(|e| corrupt(&e))?
    } else {
        body.lines()
            .enumerate()
            .map(|(i, line)| parse_line(line).map_err(|e| corrupt(&format!("line {}: {e}", i + 2))))
            .collect::<Result<_>>()?
    };
    Ok(Stored {
        bindings,
        outdated: version == 1,
    })
}

/// Replaces the store with `bindings`, atomically.
pub fn write<'a>(path: &Path, bindings: impl IntoIterator<Item = &'a AclBinding>) -> Result<()> {
    let body: String = bindings.into_iter().map(|b| to_line(b) + "\n").collect();
    let text = format!("{HEADER_V2}{:08x}\n{body}", crate::crc32c(body.as_bytes()));
    write_atomically(path, text.as_bytes()).map_err(|source| BrokerError::Io {
        context: format!("writing ACLs to {}", path.display()),
        source,
    })
}

/// The store line of a binding: its seven fields, each escaped.
fn to_line(b: &AclBinding) -> String {
    [
        escape(&b.principal),
        escape(&b.host),
        b.operation.name().to_string(),
        b.permission.name().to_string(),
        b.resource_type.name().to_string(),
        b.pattern.name().to_string(),
        escape(&b.name),
    ]
    .join(" ")
}

fn parse_line(line: &str) -> std::result::Result<AclBinding, String> {
    let fields: Vec<&str> = line.split(' ').collect();
    let [principal, host, operation, permission, resource, pattern, name] = fields[..] else {
        return Err(format!("expected 7 fields, got {}", fields.len()));
    };
    let binding = AclBinding {
        principal: unescape(principal)?,
        host: unescape(host)?,
        operation: AclOperation::parse(operation)
            .ok_or_else(|| format!("unknown operation {operation:?}"))?,
        permission: Permission::parse(permission)
            .ok_or_else(|| format!("unknown permission {permission:?}"))?,
        resource_type: ResourceType::parse(resource)
            .ok_or_else(|| format!("unknown resource type {resource:?}"))?,
        pattern: PatternType::parse(pattern)
            .ok_or_else(|| format!("unknown pattern type {pattern:?}"))?,
        name: unescape(name)?,
    };
    binding.validate()?;
    Ok(binding)
}

/// Percent-escapes `%`, whitespace and control characters (each UTF-8 byte as `%XX`).
fn escape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    for c in field.chars() {
        if c == '%' || c.is_whitespace() || c.is_control() {
            let mut utf8 = [0u8; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reverses [`escape`]; a malformed escape or a result that is not UTF-8 is an error.
fn unescape(field: &str) -> std::result::Result<String, String> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = field
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("bad escape at byte {i} of {field:?}"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{field:?} does not unescape to UTF-8"))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(principal: &str, name: &str) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Group,
            pattern: PatternType::Literal,
            name: name.into(),
            principal: principal.into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission: Permission::Allow,
        }
    }

    #[test]
    fn escaped_fields_round_trip() {
        for field in [
            "plain",
            "a b",
            "a\nb\r\tc",
            "100%",
            "%20",
            "é ü\u{2028}x",
            "\u{0}",
        ] {
            let escaped = escape(field);
            assert!(!escaped.contains(char::is_whitespace), "{escaped:?}");
            assert_eq!(unescape(&escaped).unwrap(), field);
        }
        assert!(unescape("%2").is_err());
        assert!(unescape("%zz").is_err());
        assert!(unescape("%FF").is_err());
        assert!(unescape("%é").is_err());
    }

    #[test]
    fn v2_store_round_trip_and_v1_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acls");
        let bindings = [
            binding("User:CN=John Smith,O=Acme", "g 1"),
            binding("User:a", "x\nUser:b * All Allow Topic Literal *"),
        ];
        write(&path, &bindings).unwrap();
        let stored = read(&path).unwrap();
        assert_eq!(stored.bindings, bindings);
        assert!(!stored.outdated);

        let body = "User:a * Read Allow Topic Literal t\n";
        let v1 = format!("{HEADER_V1}{:08x}\n{body}", crate::crc32c(body.as_bytes()));
        std::fs::write(&path, v1).unwrap();
        let stored = read(&path).unwrap();
        assert!(stored.outdated);
        assert_eq!(stored.bindings[0].name, "t");
    }
}
