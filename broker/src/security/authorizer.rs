//! The ACL authorizer: Kafka's `AclAuthorizer` rules over the bindings of `--acl-file` and of
//! CreateAcls/DeleteAcls, persisted next to the durable log.
//!
//! Rules: super users may do everything; otherwise a request is allowed when an ALLOW
//! binding matches (principal or `User:*`, host or `*`, the operation or one implying it,
//! the resource by Literal name, Literal `*` or Prefixed) and no DENY binding matches
//! (`All` and the operation itself). No matching binding: denied.
//!
//! In durable mode the bindings live in `<data-dir>/acls` (format: [`super::acl_store`]),
//! replaced atomically on every change. A file whose checksum does not match refuses the
//! start.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use super::acl::{parse_acl_lines, AclBinding, AclFilter, AclOperation, Permission, ResourceType};
use super::acl_store;
use crate::error::{BrokerError, Result};

/// File name of the persisted bindings in the data directory.
pub const ACLS_FILE: &str = "acls";

/// Decides requests and stores the bindings.
#[derive(Debug)]
pub struct Authorizer {
    super_users: BTreeSet<String>,
    bindings: RwLock<BTreeSet<AclBinding>>,
    store: Option<PathBuf>,
}

impl Authorizer {
    /// Opens the authorizer: the persisted bindings of `data_dir` (if any), plus those of
    /// `acl_file`. A corrupt persisted file or a bad ACL file is a start-up error.
    pub fn open(
        super_users: &[String],
        acl_file: Option<&Path>,
        data_dir: Option<&Path>,
    ) -> Result<Self> {
        for user in super_users {
            if !user.contains(':') {
                return Err(BrokerError::Config(format!(
                    "super user {user:?} is not a principal like User:admin"
                )));
            }
        }
        let mut bindings = BTreeSet::new();
        let store = data_dir.map(|d| d.join(ACLS_FILE));
        let mut outdated_store = false;
        if let Some(path) = &store {
            let stored = acl_store::read(path)?;
            outdated_store = stored.outdated;
            bindings.extend(stored.bindings);
        }
        let mut from_file = 0;
        if let Some(path) = acl_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| BrokerError::Config(format!("acl file {}: {e}", path.display())))?;
            let parsed = parse_acl_lines(&text)
                .map_err(|e| BrokerError::Config(format!("acl file {}: {e}", path.display())))?;
            from_file = parsed.len();
            bindings.extend(parsed);
        }
        let authorizer = Authorizer {
            super_users: super_users.iter().cloned().collect(),
            bindings: RwLock::new(bindings),
            store,
        };
        if from_file > 0 || outdated_store {
            authorizer.persist(&authorizer.bindings.read())?;
        }
        tracing::info!(
            bindings = authorizer.bindings.read().len(),
            from_acl_file = from_file,
            super_users = authorizer.super_users.len(),
            "authorizer enabled"
        );
        Ok(authorizer)
    }

    /// Whether `principal` connected from `host` may perform `operation` on the resource.
    pub fn authorize(
        &self,
        principal: &str,
        host: IpAddr,
        operation: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        if self.super_users.contains(principal) {
            return true;
        }
        let bindings = self.bindings.read();
        let applicable = bindings.iter().filter(|b| {
            b.resource_type == resource_type
                && b.covers(name)
                && (b.principal == principal || b.principal == "User:*")
                && host_matches(&b.host, host)
        });
        let mut allowed = false;
        for b in applicable {
            match b.permission {
                Permission::Deny
                    if b.operation == AclOperation::All || b.operation == operation =>
                {
                    return false
                }
                Permission::Allow if b.operation.allows(operation) => allowed = true,
                _ => {}
            }
        }
        allowed
    }

    /// Kafka's `authorizeByResourceType`: whether `principal` may perform `operation` on
    /// at least one resource of the type (some ALLOW binding not overridden by a DENY that
    /// covers every name it allows).
    pub fn authorize_any(
        &self,
        principal: &str,
        host: IpAddr,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        if self.super_users.contains(principal) {
            return true;
        }
        let bindings = self.bindings.read();
        let applies = |b: &&AclBinding| {
            b.resource_type == resource_type
                && (b.principal == principal || b.principal == "User:*")
                && host_matches(&b.host, host)
        };
        let denies: Vec<&AclBinding> = bindings
            .iter()
            .filter(applies)
            .filter(|b| {
                b.permission == Permission::Deny
                    && (b.operation == AclOperation::All || b.operation == operation)
            })
            .collect();
        bindings
            .iter()
            .filter(applies)
            .filter(|b| b.permission == Permission::Allow && b.operation.allows(operation))
            .any(|allow| {
                !denies.iter().any(|deny| match deny.pattern {
                    super::acl::PatternType::Literal => {
                        deny.name == "*"
                            || (allow.pattern == super::acl::PatternType::Literal
                                && deny.name == allow.name)
                    }
                    _ => allow.name.starts_with(&deny.name) && allow.name != "*",
                })
            })
    }

    /// Kafka's authorized-operations bitfield of the resource for the principal.
    pub fn authorized_operations(
        &self,
        principal: &str,
        host: IpAddr,
        resource_type: ResourceType,
        name: &str,
    ) -> i32 {
        AclOperation::supported_by(resource_type)
            .iter()
            .filter(|op| self.authorize(principal, host, **op, resource_type, name))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }

    /// Adds bindings (already validated) and persists them.
    pub fn create(&self, new: &[AclBinding]) -> Result<()> {
        let mut bindings = self.bindings.write();
        let mut next = bindings.clone();
        next.extend(new.iter().cloned());
        self.persist(&next)?;
        *bindings = next;
        Ok(())
    }

    /// The bindings matching `filter`.
    pub fn describe(&self, filter: &AclFilter) -> Vec<AclBinding> {
        self.bindings
            .read()
            .iter()
            .filter(|b| filter.matches(b))
            .cloned()
            .collect()
    }

    /// Removes the bindings matching each filter; returns them per filter.
    pub fn delete(&self, filters: &[AclFilter]) -> Result<Vec<Vec<AclBinding>>> {
        let mut bindings = self.bindings.write();
        let mut next = bindings.clone();
        let mut out = Vec::with_capacity(filters.len());
        for filter in filters {
            let matched: Vec<AclBinding> = bindings
                .iter()
                .filter(|b| filter.matches(b))
                .cloned()
                .collect();
            for b in &matched {
                next.remove(b);
            }
            out.push(matched);
        }
        self.persist(&next)?;
        *bindings = next;
        Ok(out)
    }

    fn persist(&self, bindings: &BTreeSet<AclBinding>) -> Result<()> {
        match &self.store {
            Some(path) => acl_store::write(path, bindings),
            None => Ok(()),
        }
    }
}

/// Whether a binding's host (`*` or an address) covers a peer. Addresses are compared as
/// parsed addresses, an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how a dual-stack
/// listener sees an IPv4 peer) as its IPv4 address, so no spelling of one address escapes a
/// host-based DENY; a host that does not parse is compared as text.
fn host_matches(binding_host: &str, peer: IpAddr) -> bool {
    if binding_host == "*" {
        return true;
    }
    let peer = peer.to_canonical();
    match binding_host.parse::<IpAddr>() {
        Ok(bound) => bound.to_canonical() == peer,
        Err(_) => binding_host == peer.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn authorizer(lines: &str) -> Authorizer {
        let a = Authorizer::open(&["User:admin".into()], None, None).unwrap();
        a.create(&parse_acl_lines(lines).unwrap()).unwrap();
        a
    }

    #[test]
    fn kafka_rules() {
        let a = authorizer(
            "User:alice * Read Allow Topic Prefixed ord\n\
             User:alice * Write Allow Topic Literal orders\n\
             User:alice * All Deny Topic Literal orders-secret\n\
             User:* * Describe Allow Group Literal *\n",
        );
        use AclOperation::*;
        use ResourceType::*;
        assert!(a.authorize("User:alice", HOST, Read, Topic, "orders"));
        assert!(a.authorize("User:alice", HOST, Describe, Topic, "orders-x"));
        assert!(!a.authorize("User:alice", HOST, Read, Topic, "orders-secret"));
        assert!(!a.authorize("User:alice", HOST, Write, Topic, "orders-x"));
        assert!(!a.authorize("User:bob", HOST, Read, Topic, "orders"));
        assert!(a.authorize("User:bob", HOST, Describe, Group, "g"));
        assert!(!a.authorize("User:bob", HOST, Read, Group, "g"));
        assert!(a.authorize("User:admin", HOST, Alter, Cluster, "kafka-cluster"));
        assert!(a.authorize_any("User:alice", HOST, Write, Topic));
        assert!(!a.authorize_any("User:bob", HOST, Write, Topic));
        let bits = a.authorized_operations("User:alice", HOST, Topic, "orders");
        assert_eq!(bits, (1 << 3) | (1 << 4) | (1 << 8));
    }

    #[test]
    fn an_ipv4_mapped_peer_is_its_ipv4_address_for_host_bindings() {
        use std::net::Ipv6Addr;
        let a = authorizer(
            "User:alice * Read Allow Topic Literal t\n\
             User:alice 10.0.0.1 Read Deny Topic Literal t\n\
             User:bob ::ffff:10.0.0.2 Read Allow Topic Literal t\n\
             User:carol 2001:DB8::1 Read Allow Topic Literal t\n",
        );
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        let read = |who, host| a.authorize(who, host, AclOperation::Read, ResourceType::Topic, "t");
        assert!(!read("User:alice", v4));
        assert!(
            !read("User:alice", mapped),
            "the mapped address escaped the DENY"
        );
        assert!(read("User:alice", HOST));
        assert!(read("User:bob", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))));
        let v6: IpAddr = "2001:db8::1".parse::<Ipv6Addr>().unwrap().into();
        assert!(
            read("User:carol", v6),
            "addresses compare parsed, not as text"
        );
    }

    #[test]
    fn persisted_store_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let a = Authorizer::open(&[], None, Some(dir.path())).unwrap();
        a.create(&parse_acl_lines("User:a * Read Allow Topic Literal t").unwrap())
            .unwrap();
        drop(a);
        let a = Authorizer::open(&[], None, Some(dir.path())).unwrap();
        assert!(a.authorize("User:a", HOST, AclOperation::Read, ResourceType::Topic, "t"));
        let path = dir.path().join(ACLS_FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text = text.replace("User:a", "User:b");
        std::fs::write(&path, text).unwrap();
        let err = Authorizer::open(&[], None, Some(dir.path())).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
