//! Kafka's ACL model and its authorization rule, evaluated locally on the ACLs DescribeAcls
//! returns: an operation on a resource is allowed for a principal when no matching DENY
//! binding exists and a matching ALLOW binding does. A binding matches when its principal is
//! the principal or `User:*`, its host is the client's address or `*`, its pattern is
//! LITERAL with the resource's name or `*`, or PREFIXED with a prefix of the name, and its
//! operation is the operation or `All`. Describe is also allowed by Read, Write, Delete and
//! Alter (as Kafka's AclAuthorizer does); DENY of those does not deny Describe.

use std::fmt;

/// A resource type (Kafka's `ResourceType` codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    /// A topic.
    Topic,
    /// A consumer group.
    Group,
    /// The cluster.
    Cluster,
    /// A transactional id.
    TransactionalId,
}

impl ResourceType {
    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
        }
    }

    /// The type of a wire code, if it is one of these.
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => ResourceType::Topic,
            3 => ResourceType::Group,
            4 => ResourceType::Cluster,
            5 => ResourceType::TransactionalId,
            _ => return None,
        })
    }

    /// The `kafka-acls` option naming a resource of this type.
    pub fn kafka_acls_option(self) -> &'static str {
        match self {
            ResourceType::Topic => "--topic",
            ResourceType::Group => "--group",
            ResourceType::Cluster => "--cluster",
            ResourceType::TransactionalId => "--transactional-id",
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceType::Topic => "Topic",
            ResourceType::Group => "Group",
            ResourceType::Cluster => "Cluster",
            ResourceType::TransactionalId => "TransactionalId",
        })
    }
}

/// An ACL operation (Kafka's `AclOperation` codes, which are also the bit numbers of the
/// authorized-operations bitfields of Metadata and DescribeGroups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// Every operation.
    All,
    /// Read.
    Read,
    /// Write.
    Write,
    /// Create.
    Create,
    /// Delete.
    Delete,
    /// Alter.
    Alter,
    /// Describe.
    Describe,
    /// Any other operation, by code.
    Other(i8),
}

impl Operation {
    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            Operation::All => 2,
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Alter => 7,
            Operation::Describe => 8,
            Operation::Other(c) => c,
        }
    }

    /// The operation of a wire code.
    pub fn from_code(code: i8) -> Self {
        match code {
            2 => Operation::All,
            3 => Operation::Read,
            4 => Operation::Write,
            5 => Operation::Create,
            6 => Operation::Delete,
            7 => Operation::Alter,
            8 => Operation::Describe,
            c => Operation::Other(c),
        }
    }

    /// Whether the authorized-operations bitfield `bits` holds this operation.
    pub fn in_bitfield(self, bits: i32) -> bool {
        let c = self.code();
        (0..32).contains(&c) && bits & (1 << c) != 0
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operation::All => f.write_str("All"),
            Operation::Read => f.write_str("Read"),
            Operation::Write => f.write_str("Write"),
            Operation::Create => f.write_str("Create"),
            Operation::Delete => f.write_str("Delete"),
            Operation::Alter => f.write_str("Alter"),
            Operation::Describe => f.write_str("Describe"),
            Operation::Other(c) => write!(f, "operation {c}"),
        }
    }
}

/// How a binding's resource name matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternType {
    /// The exact name, or `*` for every resource of the type.
    Literal,
    /// Every name starting with the binding's name.
    Prefixed,
}

impl PatternType {
    /// The pattern type of a wire code (LITERAL 3, PREFIXED 4), if it is one of these.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            3 => Some(PatternType::Literal),
            4 => Some(PatternType::Prefixed),
            _ => None,
        }
    }
}

/// One ACL binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclBinding {
    /// Resource type.
    pub resource_type: ResourceType,
    /// Resource name (or prefix).
    pub resource_name: String,
    /// How the name matches.
    pub pattern: PatternType,
    /// `User:<name>`, or `User:*`.
    pub principal: String,
    /// Client host, or `*`.
    pub host: String,
    /// The operation.
    pub operation: Operation,
    /// ALLOW (`true`) or DENY (`false`).
    pub allow: bool,
}

/// One operation the job needs on one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// Resource type.
    pub resource_type: ResourceType,
    /// Resource name.
    pub name: String,
    /// Operation.
    pub operation: Operation,
}

/// What the ACLs say about an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A matching ALLOW binding and no matching DENY.
    Allowed,
    /// A matching DENY binding (it wins over any ALLOW).
    Denied(AclBinding),
    /// No binding allows it.
    NotAllowed,
}

impl AclBinding {
    fn matches(&self, principal: &str, host: Option<&str>, action: &Action) -> bool {
        if self.resource_type != action.resource_type {
            return false;
        }
        if self.principal != principal && self.principal != "User:*" {
            return false;
        }
        if self.host != "*" && Some(self.host.as_str()) != host {
            return false;
        }
        match self.pattern {
            PatternType::Literal => self.resource_name == "*" || self.resource_name == action.name,
            PatternType::Prefixed => action.name.starts_with(&self.resource_name),
        }
    }
}

/// Evaluates `action` for `principal` connecting from `host` (its address as the broker sees
/// it, `None` when unknown: then only `*` host bindings count) on `acls`.
pub fn evaluate(
    acls: &[AclBinding],
    principal: &str,
    host: Option<&str>,
    action: &Action,
) -> Verdict {
    let matching = || acls.iter().filter(|b| b.matches(principal, host, action));
    let op = action.operation;
    if let Some(deny) =
        matching().find(|b| !b.allow && (b.operation == op || b.operation == Operation::All))
    {
        return Verdict::Denied(deny.clone());
    }
    let implied: &[Operation] = if op == Operation::Describe {
        &[
            Operation::Describe,
            Operation::Read,
            Operation::Write,
            Operation::Delete,
            Operation::Alter,
        ]
    } else {
        std::slice::from_ref(&action.operation)
    };
    if matching()
        .any(|b| b.allow && (b.operation == Operation::All || implied.contains(&b.operation)))
    {
        Verdict::Allowed
    } else {
        Verdict::NotAllowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(
        rt: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        allow: bool,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            allow,
        }
    }

    fn act(rt: ResourceType, name: &str, op: Operation) -> Action {
        Action {
            resource_type: rt,
            name: name.into(),
            operation: op,
        }
    }

    use Operation::*;
    use PatternType::*;
    use ResourceType::*;

    #[test]
    fn literal_prefixed_and_wildcard_patterns() {
        let acls = vec![
            b(Topic, "in", Literal, "User:alice", Read, true),
            b(
                TransactionalId,
                "onceflow-etl",
                Prefixed,
                "User:alice",
                Write,
                true,
            ),
            b(Group, "*", Literal, "User:alice", Read, true),
        ];
        let ok = |a: Action| evaluate(&acls, "User:alice", None, &a) == Verdict::Allowed;
        assert!(ok(act(Topic, "in", Read)));
        assert!(!ok(act(Topic, "input", Read)), "literal is exact");
        assert!(!ok(act(Topic, "in", Write)));
        assert!(ok(act(TransactionalId, "onceflow-etl-0-1", Write)));
        assert!(ok(act(TransactionalId, "onceflow-etl", Write)));
        assert!(!ok(act(TransactionalId, "onceflow-et", Write)));
        assert!(!ok(act(Topic, "onceflow-etl-0-1", Write)), "types differ");
        assert!(ok(act(Group, "any-group", Read)), "* literal matches all");
        assert_eq!(
            evaluate(&acls, "User:bob", None, &act(Topic, "in", Read)),
            Verdict::NotAllowed,
            "other principal"
        );
    }

    #[test]
    fn deny_wins_and_wildcard_principal() {
        let acls = vec![
            b(Topic, "*", Literal, "User:*", All, true),
            b(Topic, "secret", Prefixed, "User:bob", Read, false),
        ];
        assert_eq!(
            evaluate(&acls, "User:alice", None, &act(Topic, "secret-1", Read)),
            Verdict::Allowed
        );
        assert!(matches!(
            evaluate(&acls, "User:bob", None, &act(Topic, "secret-1", Read)),
            Verdict::Denied(_)
        ));
        assert_eq!(
            evaluate(&acls, "User:bob", None, &act(Topic, "secret-1", Write)),
            Verdict::Allowed,
            "DENY Read leaves Write"
        );
        // DENY All denies everything, even with ALLOW of the operation
        let acls = vec![
            b(Topic, "t", Literal, "User:bob", Write, true),
            b(Topic, "t", Literal, "User:*", All, false),
        ];
        assert!(matches!(
            evaluate(&acls, "User:bob", None, &act(Topic, "t", Write)),
            Verdict::Denied(_)
        ));
    }

    #[test]
    fn describe_is_implied_but_not_denied_by_read() {
        for op in [Read, Write, Delete, Alter] {
            let acls = vec![b(Topic, "t", Literal, "User:a", op, true)];
            assert_eq!(
                evaluate(&acls, "User:a", None, &act(Topic, "t", Describe)),
                Verdict::Allowed,
                "{op}"
            );
        }
        let acls = vec![b(Topic, "t", Literal, "User:a", Create, true)];
        assert_eq!(
            evaluate(&acls, "User:a", None, &act(Topic, "t", Describe)),
            Verdict::NotAllowed
        );
        let acls = vec![
            b(Topic, "t", Literal, "User:a", Write, true),
            b(Topic, "t", Literal, "User:a", Read, false),
        ];
        assert_eq!(
            evaluate(&acls, "User:a", None, &act(Topic, "t", Describe)),
            Verdict::Allowed
        );
    }

    #[test]
    fn hosts() {
        let mut allow = b(Topic, "t", Literal, "User:a", Read, true);
        allow.host = "10.0.0.1".into();
        let acls = vec![allow];
        let a = act(Topic, "t", Read);
        assert_eq!(
            evaluate(&acls, "User:a", Some("10.0.0.1"), &a),
            Verdict::Allowed
        );
        assert_eq!(
            evaluate(&acls, "User:a", Some("10.0.0.2"), &a),
            Verdict::NotAllowed
        );
        assert_eq!(evaluate(&acls, "User:a", None, &a), Verdict::NotAllowed);
    }

    #[test]
    fn bitfields() {
        let bits = (1 << 3) | (1 << 8);
        assert!(Read.in_bitfield(bits));
        assert!(Describe.in_bitfield(bits));
        assert!(!Write.in_bitfield(bits));
        assert!(!Other(-1).in_bitfield(bits));
        assert!(!Read.in_bitfield(i32::MIN));
    }
}
