//! The start-up permission check: before any data flows, verify that the job's principal
//! may do what the job will do (read its input topics and group, write its output topics,
//! use its transactional ids) and report every missing permission in one message, each with
//! the ACL that grants it.
//!
//! Preferred method: DescribeAcls (needs Describe on the Cluster), evaluated locally with
//! Kafka's rules ([`super::acl`]) for the principal `User:<sasl.username>`. When the broker
//! refuses it (CLUSTER_AUTHORIZATION_FAILED), does not support it, or the principal is not
//! known (TLS client certificates), harmless probes decide instead: Metadata's topic
//! authorized operations (KIP-430), DescribeGroups' authorized operations, and
//! FindCoordinator for each transactional id (which proves Describe only: Write is then
//! reported as not verified). Probes also confirm an ACL verdict of "missing" for topics and
//! groups, because super users and `allow.everyone.if.no.acl.found` allow what no ACL names.
//! InitProducerId is never sent: it would abort a pending transaction that two-phase recovery
//! must commit. A broker without an authorizer (DescribeAcls answers SECURITY_DISABLED)
//! passes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DescribeAclsRequest, DescribeGroupsRequest, FindCoordinatorRequest,
    GroupId, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::acl::{evaluate, AclBinding, Action, Operation, PatternType, ResourceType, Verdict};
use super::ClientSecurity;
use crate::kafka::committer::{connect_any, RawClient};
use crate::kafka::metrics as m;
use crate::kafka::{ClientProperties, KafkaError, Result};

/// Kafka error codes the check tells apart.
mod codes {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub const SECURITY_DISABLED: i16 = 54;
}

/// One permission the job needs, and what for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    /// The operation on the resource.
    pub action: Action,
    /// What the job does with it (e.g. "read the input").
    pub why: String,
    /// For transactional ids: the prefix an ACL should name (the job uses several ids).
    pub prefix: Option<String>,
}

impl Need {
    /// `operation` on the resource, for `why`.
    pub fn new(rt: ResourceType, name: &str, operation: Operation, why: &str) -> Need {
        Need {
            action: Action {
                resource_type: rt,
                name: name.to_string(),
                operation,
            },
            why: why.to_string(),
            prefix: None,
        }
    }

    /// Write on the transactional id `id`, one of the ids under `prefix`.
    pub fn transactional_id(id: &str, prefix: &str, why: &str) -> Need {
        Need {
            prefix: Some(prefix.to_string()),
            ..Need::new(ResourceType::TransactionalId, id, Operation::Write, why)
        }
    }
}

/// A permission found missing, and how it was found.
#[derive(Clone, Debug)]
pub struct Missing {
    /// The need.
    pub need: Need,
    /// How the check knows (e.g. "no ACL allows it").
    pub reason: String,
    /// The DENY binding that refuses it, if one does.
    pub denied_by: Option<AclBinding>,
}

/// How the check decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The principal's ACLs from DescribeAcls.
    DescribeAcls,
    /// Metadata, DescribeGroups and FindCoordinator probes.
    Probes,
    /// The broker has no authorizer: everything is allowed.
    NoAuthorizer,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::DescribeAcls => "describe-acls",
            Method::Probes => "probes",
            Method::NoAuthorizer => "no-authorizer",
        }
    }
}

/// What a passed check found.
#[derive(Clone, Debug)]
pub struct Passed {
    /// How it decided.
    pub method: Method,
    /// Needs it could not verify, with the reason (e.g. Write on transactional ids without
    /// DescribeAcls).
    pub unverified: Vec<(Need, String)>,
}

/// The principal as the fix commands name it.
fn principal_for_fix(principal: Option<&str>) -> String {
    principal
        .map(str::to_string)
        .unwrap_or_else(|| "<the principal of the client certificate, e.g. User:CN=...>".into())
}

/// The ACL that grants `need` (or, when a DENY binding refuses it, the removal of that), as a
/// `kafka-acls` command.
pub fn kafka_acls_fix(bootstrap: &str, principal: Option<&str>, m: &Missing) -> String {
    let p = principal_for_fix(principal);
    let a = &m.need.action;
    if let Some(deny) = &m.denied_by {
        let pattern = match deny.pattern {
            PatternType::Literal => "literal",
            PatternType::Prefixed => "prefixed",
        };
        return format!(
            "kafka-acls --bootstrap-server {bootstrap} --remove --deny-principal {} --deny-host {} --operation {} {} {} --resource-pattern-type {pattern}",
            deny.principal,
            deny.host,
            deny.operation,
            deny.resource_type.kafka_acls_option(),
            deny.resource_name
        );
    }
    let (name, pattern) = match &m.need.prefix {
        Some(prefix) => (prefix.as_str(), " --resource-pattern-type prefixed"),
        None => (a.name.as_str(), ""),
    };
    format!(
        "kafka-acls --bootstrap-server {bootstrap} --add --allow-principal {p} --operation {} {} {name}{pattern}",
        a.operation,
        a.resource_type.kafka_acls_option()
    )
}

/// The same ALLOW binding as a line of the bundled broker's ACL file (`--acl-file`:
/// `principal host operation permission resource-type pattern name`).
pub fn broker_acl_line(principal: Option<&str>, m: &Missing) -> Option<String> {
    if m.denied_by.is_some() {
        return None;
    }
    let a = &m.need.action;
    let (name, pattern) = match &m.need.prefix {
        Some(prefix) => (prefix.as_str(), "Prefixed"),
        None => (a.name.as_str(), "Literal"),
    };
    // principal host operation permission resource-type pattern name
    Some(format!(
        "{} * {} Allow {} {pattern} {name}",
        principal_for_fix(principal),
        a.operation,
        a.resource_type
    ))
}

/// The one error message listing every missing permission (transactional ids of one prefix
/// folded into one entry) with the fix for each.
pub fn missing_message(bootstrap: &str, principal: Option<&str>, missing: &[Missing]) -> String {
    let mut entries: Vec<&Missing> = Vec::new();
    let mut folded: BTreeMap<(String, Operation), Vec<&str>> = BTreeMap::new();
    for m in missing {
        match (&m.need.prefix, &m.denied_by) {
            (Some(prefix), None) => {
                let ids = folded
                    .entry((prefix.clone(), m.need.action.operation))
                    .or_default();
                if ids.is_empty() {
                    entries.push(m);
                }
                ids.push(&m.need.action.name);
            }
            _ => entries.push(m),
        }
    }
    let who = principal.unwrap_or("the job's principal (its TLS client certificate)");
    let mut msg = format!(
        "{who} lacks {} permission{} this job needs (found before any data flowed):",
        entries.len(),
        if entries.len() == 1 { "" } else { "s" }
    );
    for m in entries {
        let a = &m.need.action;
        let resource = match &m.need.prefix {
            Some(prefix) if m.denied_by.is_none() => {
                let ids = &folded[&(prefix.clone(), a.operation)];
                format!(
                    "{} prefix {prefix} (ids {})",
                    a.resource_type,
                    ids.join(", ")
                )
            }
            _ => format!("{} {}", a.resource_type, a.name),
        };
        msg.push_str(&format!(
            "\n  - {} on {resource}, to {}: {}\n      fix: {}",
            a.operation,
            m.need.why,
            m.reason,
            kafka_acls_fix(bootstrap, principal, m)
        ));
        if let Some(line) = broker_acl_line(principal, m) {
            msg.push_str(&format!(
                "\n      (bundled broker: add `{line}` to its --acl-file)"
            ));
        }
    }
    msg
}

/// Checks `needs` against the cluster at `bootstrap` with the job's client `properties`.
/// Every missing permission is in the one [`KafkaError::Config`] it returns.
pub async fn check(
    bootstrap: &str,
    properties: &ClientProperties,
    needs: &[Need],
) -> Result<Option<Passed>> {
    if let Some(why) = ClientSecurity::unsupported(properties) {
        tracing::warn!(reason = %why, "start-up permission check skipped: onceflow's own Kafka client cannot connect with these properties; a missing permission shows at its first use");
        metrics::counter!(m::PERMISSION_CHECKS, "outcome" => "skipped", "method" => "none")
            .increment(1);
        return Ok(None);
    }
    let security = ClientSecurity::from_properties(properties, "the start-up permission check")?;
    let principal = security.principal();
    let mut c = connect_any(bootstrap, &security).await?;
    let versions = api_versions(&mut c).await?;
    let host = c.local_ip().map(|ip| ip.to_string());

    let mut acls = None;
    let mut acl_refused = None;
    // DescribeAcls is asked whatever the principal: its SECURITY_DISABLED answer is how a
    // broker without an authorizer (a PLAINTEXT development cluster) says every permission
    // is granted; only the ACLs it returns need a known principal to be evaluated
    if let Some(&(min, max)) = versions.get(&(ApiKey::DescribeAcls as i16)) {
        if min <= 1 && max >= 1 {
            match describe_acls(&mut c).await? {
                // no binding at all: an authorizer without ACLs refuses everyone but super
                // users, a broker without one allows everything; only probes tell which
                Ok(a) if a.is_empty() => acl_refused = Some(codes::NONE),
                Ok(a) if principal.is_some() => acls = Some(a),
                Ok(_) => {}
                Err(codes::SECURITY_DISABLED) => {
                    tracing::info!(principal = %principal.as_deref().unwrap_or(unknown_principal(&security)), "start-up permission check: the broker has no authorizer; every permission is granted");
                    return Ok(Some(passed(Method::NoAuthorizer, Vec::new())));
                }
                Err(code) => acl_refused = Some(code),
            }
        }
    }
    let mut missing = Vec::new();
    let mut unverified = Vec::new();
    let method;
    match acls {
        Some(acls) => {
            method = Method::DescribeAcls;
            let p = principal.as_deref().unwrap_or_default();
            let mut suspects = Vec::new();
            for need in needs {
                match evaluate(&acls, p, host.as_deref(), &need.action) {
                    Verdict::Allowed => {}
                    Verdict::Denied(b) => missing.push(Missing {
                        need: need.clone(),
                        reason: format!(
                            "a DENY ACL refuses it ({} {} {} {:?} for {} from {})",
                            b.operation,
                            b.resource_type,
                            b.resource_name,
                            b.pattern,
                            b.principal,
                            b.host
                        ),
                        denied_by: Some(b),
                    }),
                    Verdict::NotAllowed => suspects.push(need.clone()),
                }
            }
            // super users and allow.everyone.if.no.acl.found allow what no ACL names: the
            // probes have the authorizer's own answer for topics and groups
            let (probe_missing, probe_unverified, authorizer_allows_more) = probe(
                &mut c,
                bootstrap,
                &security,
                &versions,
                &suspects,
                "no ACL allows it",
            )
            .await?;
            missing.extend(probe_missing);
            for (need, why) in probe_unverified {
                if !authorizer_allows_more {
                    missing.push(Missing {
                        need,
                        reason: "no ACL allows it".into(),
                        denied_by: None,
                    });
                } else {
                    unverified.push((need, why));
                }
            }
        }
        None => {
            method = Method::Probes;
            let why = match (&principal, acl_refused) {
                (None, _) => format!(
                    "ACLs cannot be matched to the principal: it is {}",
                    unknown_principal(&security)
                ),
                (Some(_), Some(codes::CLUSTER_AUTHORIZATION_FAILED)) => {
                    "DescribeAcls needs Describe on the Cluster".to_string()
                }
                (Some(_), Some(codes::NONE)) => "DescribeAcls shows no ACL at all".to_string(),
                (Some(_), Some(code)) => format!("DescribeAcls failed with error code {code}"),
                (Some(_), None) => "the broker does not support DescribeAcls".to_string(),
            };
            tracing::info!(reason = %why, "start-up permission check by probes");
            let (probe_missing, probe_unverified, _) =
                probe(&mut c, bootstrap, &security, &versions, needs, "").await?;
            missing.extend(probe_missing);
            unverified.extend(
                probe_unverified
                    .into_iter()
                    .map(|(n, w)| (n, format!("{w} ({why})"))),
            );
        }
    }
    metrics::gauge!(m::PERMISSIONS_MISSING).set(missing.len() as f64);
    if missing.is_empty() {
        for (need, why) in &unverified {
            tracing::info!(operation = %need.action.operation, resource_type = %need.action.resource_type, resource = %need.action.name, reason = %why, "permission not verified at start");
        }
        tracing::info!(
            method = method.label(),
            checked = needs.len(),
            unverified = unverified.len(),
            "start-up permission check passed"
        );
        return Ok(Some(passed(method, unverified)));
    }
    metrics::counter!(m::PERMISSION_CHECKS, "outcome" => "failed", "method" => method.label())
        .increment(1);
    let msg = missing_message(bootstrap, principal.as_deref(), &missing);
    tracing::error!(
        method = method.label(),
        missing = missing.len(),
        "start-up permission check failed"
    );
    Err(KafkaError::Config(msg))
}

fn passed(method: Method, unverified: Vec<(Need, String)>) -> Passed {
    metrics::counter!(m::PERMISSION_CHECKS, "outcome" => "passed", "method" => method.label())
        .increment(1);
    Passed { method, unverified }
}

/// Who the broker sees when the properties name no SASL user.
fn unknown_principal(security: &ClientSecurity) -> &'static str {
    if security.uses_tls() {
        "the subject of the TLS client certificate, as the broker maps it"
    } else {
        "User:ANONYMOUS (PLAINTEXT without SASL)"
    }
}

/// How long a probe waits for a coordinator that is loading, moving or not available yet
/// (right after a broker restart) before it reports the permission as not verified.
const COORDINATOR_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// FindCoordinator for `key` (`key_type` 0: group, 1: transactional id), asked again while
/// the answer is a retriable coordinator error, for up to [`COORDINATOR_PATIENCE`].
async fn find_coordinator(
    c: &mut RawClient,
    key: &str,
    key_type: i8,
) -> Result<kafka_protocol::messages::FindCoordinatorResponse> {
    let mut backoff = crate::kafka::retry::Backoff::new(COORDINATOR_PATIENCE);
    loop {
        let fc = c
            .request(
                &FindCoordinatorRequest::default()
                    .with_key(StrBytes::from_string(key.to_string()))
                    .with_key_type(key_type),
                1,
            )
            .await?;
        if !crate::kafka::retry::retriable_code(fc.error_code) {
            return Ok(fc);
        }
        match backoff.next_pause() {
            Some(pause) => {
                tracing::info!(key, error = %crate::kafka::retry::describe_code(fc.error_code), "start-up permission check: waiting for the coordinator");
                tokio::time::sleep(pause).await;
            }
            None => return Ok(fc),
        }
    }
}

/// ApiVersions: key -> (min, max).
async fn api_versions(c: &mut RawClient) -> Result<HashMap<i16, (i16, i16)>> {
    let r = c.request(&ApiVersionsRequest::default(), 0).await?;
    if r.error_code != codes::NONE {
        return Err(KafkaError::Protocol(format!(
            "ApiVersions failed with error code {}",
            r.error_code
        )));
    }
    Ok(r.api_keys
        .iter()
        .map(|k| (k.api_key, (k.min_version, k.max_version)))
        .collect())
}

fn version(
    versions: &HashMap<i16, (i16, i16)>,
    key: ApiKey,
    want: std::ops::RangeInclusive<i16>,
) -> Option<i16> {
    let &(min, max) = versions.get(&(key as i16))?;
    let v = max.min(*want.end());
    (v >= min && v >= *want.start()).then_some(v)
}

/// Every ACL the broker shows (filters: any), or the error code.
async fn describe_acls(c: &mut RawClient) -> Result<std::result::Result<Vec<AclBinding>, i16>> {
    const ANY: i8 = 1;
    let r = c
        .request(
            // every filter open: the request's defaults are empty strings, which would
            // match only bindings with an empty resource name, principal and host
            &DescribeAclsRequest::default()
                .with_resource_type_filter(ANY)
                .with_resource_name_filter(None)
                .with_pattern_type_filter(ANY)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(ANY)
                .with_permission_type(ANY),
            1,
        )
        .await?;
    if r.error_code != codes::NONE {
        return Ok(Err(r.error_code));
    }
    let mut out = Vec::new();
    for res in &r.resources {
        let (Some(rt), Some(pattern)) = (
            ResourceType::from_code(res.resource_type),
            PatternType::from_code(res.pattern_type),
        ) else {
            continue;
        };
        for a in &res.acls {
            out.push(AclBinding {
                resource_type: rt,
                resource_name: res.resource_name.as_str().to_string(),
                pattern,
                principal: a.principal.as_str().to_string(),
                host: a.host.as_str().to_string(),
                operation: Operation::from_code(a.operation),
                // DENY 2, ALLOW 3
                allow: a.permission_type == 3,
            });
        }
    }
    Ok(Ok(out))
}

/// The probes for `needs`: (missing, unverified with the reason, whether a probe allowed
/// something) . `acl_reason` prefixes the reason of a need the ACLs did not allow either.
async fn probe(
    c: &mut RawClient,
    bootstrap: &str,
    security: &ClientSecurity,
    versions: &HashMap<i16, (i16, i16)>,
    needs: &[Need],
    acl_reason: &str,
) -> Result<(Vec<Missing>, Vec<(Need, String)>, bool)> {
    let mut missing = Vec::new();
    let mut unverified = Vec::new();
    let mut allowed_any = false;
    let reason = |r: &str| {
        if acl_reason.is_empty() {
            r.to_string()
        } else {
            format!("{acl_reason}, and {r}")
        }
    };
    let topics: BTreeSet<&str> = needs
        .iter()
        .filter(|n| n.action.resource_type == ResourceType::Topic)
        .map(|n| n.action.name.as_str())
        .collect();
    let topic_ops = if topics.is_empty() {
        HashMap::new()
    } else {
        topic_operations(c, versions, &topics).await?
    };
    let groups: BTreeSet<&str> = needs
        .iter()
        .filter(|n| n.action.resource_type == ResourceType::Group)
        .map(|n| n.action.name.as_str())
        .collect();
    let mut group_ops = HashMap::new();
    for g in groups {
        group_ops.insert(
            g,
            group_operations(c, bootstrap, security, versions, g).await?,
        );
    }
    let mut txn_describe: HashMap<&str, i16> = HashMap::new();
    for need in needs {
        let a = &need.action;
        let answer = match a.resource_type {
            ResourceType::Topic => {
                topic_ops
                    .get(a.name.as_str())
                    .cloned()
                    .unwrap_or(Probe::Unknown(
                        "the broker did not describe the topic".into(),
                    ))
            }
            ResourceType::Group => {
                group_ops
                    .get(a.name.as_str())
                    .cloned()
                    .unwrap_or(Probe::Unknown(
                        "the broker did not describe the group".into(),
                    ))
            }
            ResourceType::TransactionalId => {
                let code = match txn_describe.get(a.name.as_str()) {
                    Some(c) => *c,
                    None => {
                        let fc = find_coordinator(c, &a.name, 1).await?;
                        txn_describe.insert(&a.name, fc.error_code);
                        fc.error_code
                    }
                };
                if code == codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED {
                    Probe::Refused("FindCoordinator answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED (not even Describe)".into())
                } else if code != codes::NONE {
                    Probe::Unknown(format!(
                        "FindCoordinator answered {} (waited {COORDINATOR_PATIENCE:?})",
                        crate::kafka::retry::describe_code(code)
                    ))
                } else {
                    Probe::Unknown("Describe is allowed (FindCoordinator), Write cannot be verified without DescribeAcls".into())
                }
            }
            ResourceType::Cluster => Probe::Unknown("cluster permissions are not probed".into()),
        };
        match answer {
            Probe::Ops(bits) if a.operation.in_bitfield(bits) => allowed_any = true,
            Probe::Ops(_) => missing.push(Missing {
                need: need.clone(),
                reason: reason(&format!(
                    "the broker's authorized operations for the {} leave it out",
                    a.resource_type.to_string().to_lowercase()
                )),
                denied_by: None,
            }),
            Probe::Refused(r) => missing.push(Missing {
                need: need.clone(),
                reason: reason(&r),
                denied_by: None,
            }),
            Probe::Unknown(r) => unverified.push((need.clone(), r)),
        }
    }
    Ok((missing, unverified, allowed_any))
}

/// A probe's answer for one resource.
#[derive(Clone, Debug)]
enum Probe {
    /// The authorized-operations bitfield.
    Ops(i32),
    /// The broker refused to describe it: no Describe, so no other operation either.
    Refused(String),
    /// The probe cannot tell, and why.
    Unknown(String),
}

fn bits_or_unknown(bits: i32, what: &str) -> Probe {
    if bits == i32::MIN {
        Probe::Unknown(format!(
            "the broker does not report authorized operations for {what}"
        ))
    } else {
        Probe::Ops(bits)
    }
}

async fn topic_operations<'a>(
    c: &mut RawClient,
    versions: &HashMap<i16, (i16, i16)>,
    topics: &BTreeSet<&'a str>,
) -> Result<HashMap<&'a str, Probe>> {
    let Some(v) = version(versions, ApiKey::Metadata, 8..=12) else {
        return Ok(topics
            .iter()
            .map(|t| {
                (
                    *t,
                    Probe::Unknown("the broker does not support Metadata v8+".into()),
                )
            })
            .collect());
    };
    let req = MetadataRequest::default()
        .with_topics(Some(
            topics
                .iter()
                .map(|t| {
                    MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
                })
                .collect(),
        ))
        .with_allow_auto_topic_creation(false)
        .with_include_topic_authorized_operations(true);
    let r = c.request(&req, v).await?;
    let mut out = HashMap::new();
    for t in &r.topics {
        let Some(name) = t.name.as_ref().map(|n| n.0.as_str()) else {
            continue;
        };
        let Some(key) = topics.get(name) else {
            continue;
        };
        let probe = match t.error_code {
            codes::NONE => bits_or_unknown(t.topic_authorized_operations, "topics"),
            codes::TOPIC_AUTHORIZATION_FAILED => {
                Probe::Refused("Metadata answered TOPIC_AUTHORIZATION_FAILED".into())
            }
            codes::UNKNOWN_TOPIC_OR_PARTITION => {
                Probe::Unknown("the topic does not exist (yet)".into())
            }
            code => Probe::Unknown(format!("Metadata answered error code {code}")),
        };
        out.insert(*key, probe);
    }
    Ok(out)
}

async fn group_operations(
    c: &mut RawClient,
    _bootstrap: &str,
    security: &ClientSecurity,
    versions: &HashMap<i16, (i16, i16)>,
    group: &str,
) -> Result<Probe> {
    let fc = find_coordinator(c, group, 0).await?;
    match fc.error_code {
        codes::NONE => {}
        codes::GROUP_AUTHORIZATION_FAILED => {
            return Ok(Probe::Refused(
                "FindCoordinator answered GROUP_AUTHORIZATION_FAILED".into(),
            ))
        }
        code => {
            return Ok(Probe::Unknown(format!(
                "FindCoordinator answered {} (waited {COORDINATOR_PATIENCE:?})",
                crate::kafka::retry::describe_code(code)
            )))
        }
    }
    let Some(v) = version(versions, ApiKey::DescribeGroups, 3..=5) else {
        return Ok(Probe::Unknown(
            "the broker does not support DescribeGroups v3+".into(),
        ));
    };
    let addr = format!("{}:{}", fc.host.as_str(), fc.port);
    let mut coord = RawClient::connect(&addr, security).await?;
    let mut backoff = crate::kafka::retry::Backoff::new(COORDINATOR_PATIENCE);
    let g = loop {
        let r = coord
            .request(
                &DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(StrBytes::from_string(group.to_string()))])
                    .with_include_authorized_operations(true),
                v,
            )
            .await?;
        let Some(g) = r.groups.into_iter().next() else {
            return Ok(Probe::Unknown("DescribeGroups answered no group".into()));
        };
        if !crate::kafka::retry::retriable_code(g.error_code) {
            break g;
        }
        match backoff.next_pause() {
            Some(pause) => {
                tracing::info!(group, error = %crate::kafka::retry::describe_code(g.error_code), "start-up permission check: waiting for the group coordinator");
                tokio::time::sleep(pause).await;
            }
            None => break g,
        }
    };
    Ok(match g.error_code {
        codes::NONE => bits_or_unknown(g.authorized_operations, "groups"),
        codes::GROUP_AUTHORIZATION_FAILED => {
            Probe::Refused("DescribeGroups answered GROUP_AUTHORIZATION_FAILED".into())
        }
        codes::UNSUPPORTED_VERSION => {
            Probe::Unknown("DescribeGroups answered UNSUPPORTED_VERSION".into())
        }
        code => Probe::Unknown(format!(
            "DescribeGroups answered {}",
            crate::kafka::retry::describe_code(code)
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_names_every_missing_permission_with_its_fix() {
        let missing = vec![
            Missing {
                need: Need::new(ResourceType::Topic, "in", Operation::Read, "read the input"),
                reason: "no ACL allows it".into(),
                denied_by: None,
            },
            Missing {
                need: Need::transactional_id(
                    "onceflow-etl-0-0",
                    "onceflow-etl",
                    "write output in transactions",
                ),
                reason: "no ACL allows it".into(),
                denied_by: None,
            },
            Missing {
                need: Need::transactional_id(
                    "onceflow-etl-checkpoints",
                    "onceflow-etl",
                    "write output in transactions",
                ),
                reason: "no ACL allows it".into(),
                denied_by: None,
            },
        ];
        let msg = missing_message("b:9094", Some("User:alice"), &missing);
        assert!(msg.starts_with("User:alice lacks 2 permissions"), "{msg}");
        assert!(msg.contains("kafka-acls --bootstrap-server b:9094 --add --allow-principal User:alice --operation Read --topic in"), "{msg}");
        assert!(msg.contains("kafka-acls --bootstrap-server b:9094 --add --allow-principal User:alice --operation Write --transactional-id onceflow-etl --resource-pattern-type prefixed"), "{msg}");
        assert!(
            msg.contains("ids onceflow-etl-0-0, onceflow-etl-checkpoints"),
            "{msg}"
        );
        assert_eq!(msg.matches("--transactional-id").count(), 1, "{msg}");
        assert!(
            msg.contains("`User:alice * Write Allow TransactionalId Prefixed onceflow-etl`"),
            "{msg}"
        );
    }

    #[test]
    fn a_deny_is_removed_not_outvoted() {
        let deny = AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: "out".into(),
            pattern: PatternType::Literal,
            principal: "User:*".into(),
            host: "*".into(),
            operation: Operation::Write,
            allow: false,
        };
        let m = Missing {
            need: Need::new(
                ResourceType::Topic,
                "out",
                Operation::Write,
                "write the output",
            ),
            reason: "denied".into(),
            denied_by: Some(deny),
        };
        let fix = kafka_acls_fix("b:1", None, &m);
        assert!(
            fix.contains(
                "--remove --deny-principal User:* --deny-host * --operation Write --topic out"
            ),
            "{fix}"
        );
        assert!(broker_acl_line(None, &m).is_none());
        let msg = missing_message("b:1", None, &[m]);
        assert!(msg.contains("TLS client certificate"), "{msg}");
    }
}
