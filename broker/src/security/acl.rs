//! ACL bindings and their wire codes (Kafka's `AclOperation`, `ResourceType`,
//! `PatternType`, `AclPermissionType`), the binding filters of DescribeAcls/DeleteAcls, and
//! the ACL file format.
//!
//! ACL file (`--acl-file FILE`): one binding per line, fields separated by whitespace,
//! `#` starts a comment line:
//!
//! ```text
//! # principal     host  operation  permission  resource        pattern   name
//! User:alice      *     Write      Allow       Topic           Literal   orders
//! User:alice      *     Read       Allow       Group           Prefixed  etl-
//! User:*          *     Describe   Allow       Topic           Literal   *
//! User:mallory    *     All        Deny        Topic           Literal   *
//! User:alice      *     Write      Allow       TransactionalId Prefixed  etl-
//! User:alice      *     IdempotentWrite Allow  Cluster         Literal   kafka-cluster
//! ```
//!
//! Names are case-insensitive (`READ`, `read`, `Read`; `TRANSACTIONAL_ID` or
//! `TransactionalId`). The name `*` with pattern `Literal` matches every resource of the type.

use std::fmt;

/// The Cluster resource's only name.
pub const CLUSTER_NAME: &str = "kafka-cluster";

macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $code:expr, $text:expr, $alt:expr;)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// The wire code.
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code,)* }
            }

            /// The value of a wire code (`None` for unknown codes).
            pub fn from_code(code: i8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// Kafka's display name.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// Parses Kafka's names, case-insensitively, with or without underscores.
            pub fn parse(s: &str) -> Option<Self> {
                let wanted = s.replace('_', "").to_ascii_lowercase();
                $(if wanted == $text.replace('_', "").to_ascii_lowercase() || wanted == $alt { return Some($name::$variant); })*
                None
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

wire_enum!(
    /// Kafka's `AclOperation`.
    AclOperation {
        /// Matches any operation (filters only).
        Any = 1, "Any", "any";
        /// Every operation.
        All = 2, "All", "all";
        /// Read.
        Read = 3, "Read", "read";
        /// Write.
        Write = 4, "Write", "write";
        /// Create.
        Create = 5, "Create", "create";
        /// Delete.
        Delete = 6, "Delete", "delete";
        /// Alter.
        Alter = 7, "Alter", "alter";
        /// Describe (implied by Read, Write, Delete and Alter).
        Describe = 8, "Describe", "describe";
        /// ClusterAction.
        ClusterAction = 9, "ClusterAction", "clusteraction";
        /// DescribeConfigs (implied by AlterConfigs).
        DescribeConfigs = 10, "DescribeConfigs", "describeconfigs";
        /// AlterConfigs.
        AlterConfigs = 11, "AlterConfigs", "alterconfigs";
        /// IdempotentWrite.
        IdempotentWrite = 12, "IdempotentWrite", "idempotentwrite";
        /// CreateTokens.
        CreateTokens = 13, "CreateTokens", "createtokens";
        /// DescribeTokens.
        DescribeTokens = 14, "DescribeTokens", "describetokens";
    }
);

wire_enum!(
    /// Kafka's `ResourceType`.
    ResourceType {
        /// Matches any type (filters only).
        Any = 1, "Any", "any";
        /// A topic.
        Topic = 2, "Topic", "topic";
        /// A consumer group.
        Group = 3, "Group", "group";
        /// The cluster (name `kafka-cluster`).
        Cluster = 4, "Cluster", "cluster";
        /// A transactional id.
        TransactionalId = 5, "TransactionalId", "transactional_id";
        /// A delegation token.
        DelegationToken = 6, "DelegationToken", "delegation_token";
        /// A user.
        User = 7, "User", "user";
    }
);

wire_enum!(
    /// Kafka's `PatternType`.
    PatternType {
        /// Any pattern type, the name matched exactly (filters only).
        Any = 1, "Any", "any";
        /// Every binding that would apply to the named resource (filters only).
        Match = 2, "Match", "match";
        /// The exact name, or `*` for every resource.
        Literal = 3, "Literal", "literal";
        /// Every resource whose name starts with the name.
        Prefixed = 4, "Prefixed", "prefixed";
    }
);

wire_enum!(
    /// Kafka's `AclPermissionType`.
    Permission {
        /// Any (filters only).
        Any = 1, "Any", "any";
        /// Deny: wins over any Allow.
        Deny = 2, "Deny", "deny";
        /// Allow.
        Allow = 3, "Allow", "allow";
    }
);

impl AclOperation {
    /// The operations that can be granted on a resource type, as Kafka's
    /// `AclEntry.supportedOperations` (the bits of an authorized-operations field).
    pub fn supported_by(resource: ResourceType) -> &'static [AclOperation] {
        use AclOperation::*;
        match resource {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Describe,
                Delete,
                Alter,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Describe, Delete],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
            ],
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
            ResourceType::Any => &[],
        }
    }

    /// Whether an ALLOW binding for `self` also allows `wanted` (All allows everything;
    /// Read, Write, Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs).
    pub fn allows(self, wanted: AclOperation) -> bool {
        use AclOperation::*;
        self == All
            || self == wanted
            || (wanted == Describe && matches!(self, Read | Write | Delete | Alter))
            || (wanted == DescribeConfigs && self == AlterConfigs)
    }
}

/// One ACL binding: `principal` from `host` may (Allow) or may not (Deny) perform
/// `operation` on resources of `resource_type` named by `pattern` + `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    /// The resource type (never Any).
    pub resource_type: ResourceType,
    /// Literal or Prefixed.
    pub pattern: PatternType,
    /// The resource name or prefix (`*` with Literal: every resource).
    pub name: String,
    /// `User:<name>` or `User:*`.
    pub principal: String,
    /// `*` or an IP address.
    pub host: String,
    /// The operation (never Any).
    pub operation: AclOperation,
    /// Allow or Deny.
    pub permission: Permission,
}

impl AclBinding {
    /// Checks the binding is concrete and well formed (a binding to create, not a filter).
    pub fn validate(&self) -> Result<(), String> {
        if matches!(self.resource_type, ResourceType::Any) {
            return Err("resource type Any is only for filters".into());
        }
        if !matches!(self.pattern, PatternType::Literal | PatternType::Prefixed) {
            return Err(format!(
                "pattern type {} is only for filters (use Literal or Prefixed)",
                self.pattern
            ));
        }
        if self.operation == AclOperation::Any {
            return Err("operation Any is only for filters".into());
        }
        if self.permission == Permission::Any {
            return Err("permission Any is only for filters".into());
        }
        if self.name.is_empty() {
            return Err("empty resource name".into());
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER_NAME {
            return Err(format!("the Cluster resource is named {CLUSTER_NAME}"));
        }
        if self.pattern == PatternType::Prefixed && self.name == "*" {
            return Err("a Prefixed pattern cannot be `*`; use Literal `*`".into());
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => return Err(format!("principal {:?} is not TYPE:NAME", self.principal)),
        }
        if self.host.is_empty() || self.host.contains(char::is_whitespace) {
            return Err(format!("host {:?} is not `*` or an address", self.host));
        }
        if !AclOperation::supported_by(self.resource_type).contains(&self.operation)
            && self.operation != AclOperation::All
        {
            return Err(format!(
                "operation {} does not apply to {}",
                self.operation, self.resource_type
            ));
        }
        Ok(())
    }

    /// Whether the binding's resource pattern covers the resource `name`.
    pub fn covers(&self, name: &str) -> bool {
        match self.pattern {
            PatternType::Literal => self.name == name || self.name == "*",
            PatternType::Prefixed => name.starts_with(&self.name),
            _ => false,
        }
    }

    /// The ACL-file line of the binding.
    pub fn to_line(&self) -> String {
        format!(
            "{} {} {} {} {} {} {}",
            self.principal,
            self.host,
            self.operation,
            self.permission,
            self.resource_type,
            self.pattern,
            self.name
        )
    }

    /// Parses one ACL-file line.
    pub fn parse_line(line: &str) -> Result<Self, String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [principal, host, operation, permission, resource, pattern, name] = fields[..] else {
            return Err(format!(
                "expected 7 fields (principal host operation permission resource pattern name), got {}",
                fields.len()
            ));
        };
        let binding = AclBinding {
            principal: principal.to_string(),
            host: host.to_string(),
            operation: AclOperation::parse(operation)
                .ok_or_else(|| format!("unknown operation {operation:?}"))?,
            permission: Permission::parse(permission)
                .ok_or_else(|| format!("unknown permission {permission:?}"))?,
            resource_type: ResourceType::parse(resource)
                .ok_or_else(|| format!("unknown resource type {resource:?}"))?,
            pattern: PatternType::parse(pattern)
                .ok_or_else(|| format!("unknown pattern type {pattern:?}"))?,
            name: name.to_string(),
        };
        binding.validate()?;
        Ok(binding)
    }
}

/// Parses ACL-file text (comments and blank lines skipped); errors name the line.
pub fn parse_acl_lines(text: &str) -> Result<Vec<AclBinding>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(AclBinding::parse_line(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

/// A DescribeAcls/DeleteAcls filter: `None` fields and `Any` values match everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    /// Resource type or Any.
    pub resource_type: ResourceType,
    /// The name to match (None: any).
    pub name: Option<String>,
    /// Any, Match, Literal or Prefixed.
    pub pattern: PatternType,
    /// The principal to match (None: any).
    pub principal: Option<String>,
    /// The host to match (None: any).
    pub host: Option<String>,
    /// Operation or Any.
    pub operation: AclOperation,
    /// Permission or Any.
    pub permission: Permission,
}

impl AclFilter {
    /// Builds a filter from wire codes; unknown codes are INVALID_REQUEST.
    pub fn from_wire(
        resource_type: i8,
        name: Option<&str>,
        pattern: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission: i8,
    ) -> Result<Self, String> {
        Ok(AclFilter {
            resource_type: ResourceType::from_code(resource_type)
                .ok_or_else(|| format!("unknown resource type code {resource_type}"))?,
            name: name.map(str::to_string),
            pattern: PatternType::from_code(pattern)
                .ok_or_else(|| format!("unknown pattern type code {pattern}"))?,
            principal: principal.map(str::to_string),
            host: host.map(str::to_string),
            operation: AclOperation::from_code(operation)
                .ok_or_else(|| format!("unknown operation code {operation}"))?,
            permission: Permission::from_code(permission)
                .ok_or_else(|| format!("unknown permission code {permission}"))?,
        })
    }

    /// Whether the binding matches, with Kafka's `AclBindingFilter` semantics.
    pub fn matches(&self, b: &AclBinding) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != b.resource_type {
            return false;
        }
        let pattern_ok = match (self.pattern, &self.name) {
            (PatternType::Any, None) => true,
            (PatternType::Any, Some(name)) => &b.name == name,
            (PatternType::Match, None) => true,
            (PatternType::Match, Some(name)) => b.covers(name),
            (p, None) => p == b.pattern,
            (p, Some(name)) => p == b.pattern && &b.name == name,
        };
        pattern_ok
            && self.principal.as_ref().is_none_or(|p| p == &b.principal)
            && self.host.as_ref().is_none_or(|h| h == &b.host)
            && (self.operation == AclOperation::Any || self.operation == b.operation)
            && (self.permission == Permission::Any || self.permission == b.permission)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_lines_round_trip() {
        let text = "# c\nUser:alice * Write Allow Topic Literal orders\nUser:* * READ allow TRANSACTIONAL_ID prefixed etl-\n";
        let acls = parse_acl_lines(text).unwrap();
        assert_eq!(acls.len(), 2);
        assert_eq!(acls[1].resource_type, ResourceType::TransactionalId);
        for a in &acls {
            assert_eq!(&AclBinding::parse_line(&a.to_line()).unwrap(), a);
        }
        assert!(parse_acl_lines("User:a * Write Allow Topic Match x").is_err());
        assert!(parse_acl_lines("User:a * Write Allow Cluster Literal x").is_err());
        assert!(parse_acl_lines("alice * Write Allow Topic Literal x").is_err());
        assert!(parse_acl_lines("User:a * Write Allow Topic Literal").is_err());
    }

    #[test]
    fn filters() {
        let b = AclBinding::parse_line("User:a * Read Allow Topic Prefixed ord").unwrap();
        let f = |pattern, name: Option<&str>| AclFilter {
            resource_type: ResourceType::Any,
            name: name.map(str::to_string),
            pattern,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission: Permission::Any,
        };
        assert!(f(PatternType::Any, None).matches(&b));
        assert!(f(PatternType::Match, Some("orders")).matches(&b));
        assert!(!f(PatternType::Literal, Some("ord")).matches(&b));
        assert!(f(PatternType::Prefixed, Some("ord")).matches(&b));
        assert!(f(PatternType::Any, Some("ord")).matches(&b));
        assert!(!f(PatternType::Any, Some("orders")).matches(&b));
    }
}
