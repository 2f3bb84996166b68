//! CreateAcls, DescribeAcls and DeleteAcls: the authorizer's bindings over the wire
//! (Alter on the cluster to change them, Describe to list them).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::security::acl::{
    AclBinding, AclFilter, AclOperation, PatternType, Permission, ResourceType,
};
use crate::state::BrokerState;

/// SECURITY_DISABLED: no authorizer is configured.
const SECURITY_DISABLED: i16 = 54;

fn message(text: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(text.into()))
}

fn disabled_message() -> Option<StrBytes> {
    message("No Authorizer is configured on the broker (--acl-file, --super-user or --authorizer)")
}

/// Answers CreateAcls.
pub fn create(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: CreateAclsRequest,
) -> CreateAclsResponse {
    let refuse = |code: i16, text: Option<StrBytes>| {
        CreateAclsResponse::default().with_results(
            req.creations
                .iter()
                .map(|_| {
                    AclCreationResult::default()
                        .with_error_code(code)
                        .with_error_message(text.clone())
                })
                .collect(),
        )
    };
    let Some(authorizer) = &state.security.authorizer else {
        return refuse(SECURITY_DISABLED, disabled_message());
    };
    if !ctx.authorized_on_cluster(state, AclOperation::Alter) {
        return refuse(ResponseError::ClusterAuthorizationFailed.code(), None);
    }
    let mut results = Vec::with_capacity(req.creations.len());
    let mut valid = Vec::new();
    for c in &req.creations {
        let pattern = if ctx.version == 0 {
            PatternType::Literal.code()
        } else {
            c.resource_pattern_type
        };
        let binding = (|| -> Result<AclBinding, String> {
            let binding = AclBinding {
                resource_type: ResourceType::from_code(c.resource_type)
                    .ok_or_else(|| format!("unknown resource type {}", c.resource_type))?,
                pattern: PatternType::from_code(pattern)
                    .ok_or_else(|| format!("unknown pattern type {pattern}"))?,
                name: c.resource_name.to_string(),
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: AclOperation::from_code(c.operation)
                    .ok_or_else(|| format!("unknown operation {}", c.operation))?,
                permission: Permission::from_code(c.permission_type)
                    .ok_or_else(|| format!("unknown permission {}", c.permission_type))?,
            };
            binding.validate()?;
            Ok(binding)
        })();
        match binding {
            Ok(b) => {
                valid.push(b);
                results.push(AclCreationResult::default());
            }
            Err(e) => results.push(
                AclCreationResult::default()
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(message(e)),
            ),
        }
    }
    if let Err(e) = authorizer.create(&valid) {
        tracing::error!(error = %e, "persisting ACLs failed");
        for r in results.iter_mut().filter(|r| r.error_code == 0) {
            r.error_code = ResponseError::UnknownServerError.code();
            r.error_message = message(format!("persisting ACLs failed: {e}"));
        }
    } else if !valid.is_empty() {
        for b in &valid {
            tracing::info!(principal = ctx.principal(), acl = ?b.to_line(), "ACL created");
        }
    }
    CreateAclsResponse::default().with_results(results)
}

fn filter(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    AclFilter::from_wire(
        resource_type,
        name.map(|n| n.as_str()),
        pattern,
        principal.map(|p| p.as_str()),
        host.map(|h| h.as_str()),
        operation,
        permission,
    )
}

/// Answers DescribeAcls: matching bindings grouped by resource pattern.
pub fn describe(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let Some(authorizer) = &state.security.authorizer else {
        return DescribeAclsResponse::default()
            .with_error_code(SECURITY_DISABLED)
            .with_error_message(disabled_message());
    };
    if !ctx.authorized_on_cluster(state, AclOperation::Describe) {
        return DescribeAclsResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let pattern = if ctx.version == 0 {
        PatternType::Literal.code()
    } else {
        req.pattern_type_filter
    };
    let f = match filter(
        req.resource_type_filter,
        req.resource_name_filter.as_ref(),
        pattern,
        req.principal_filter.as_ref(),
        req.host_filter.as_ref(),
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(e) => {
            return DescribeAclsResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(message(e))
        }
    };
    let mut grouped: BTreeMap<(ResourceType, String, PatternType), Vec<AclDescription>> =
        BTreeMap::new();
    for b in authorizer.describe(&f) {
        grouped
            .entry((b.resource_type, b.name.clone(), b.pattern))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(StrBytes::from_string(b.principal))
                    .with_host(StrBytes::from_string(b.host))
                    .with_operation(b.operation.code())
                    .with_permission_type(b.permission.code()),
            );
    }
    DescribeAclsResponse::default().with_resources(
        grouped
            .into_iter()
            .map(|((rt, name, pattern), acls)| {
                DescribeAclsResource::default()
                    .with_resource_type(rt.code())
                    .with_resource_name(StrBytes::from_string(name))
                    .with_pattern_type(pattern.code())
                    .with_acls(acls)
            })
            .collect(),
    )
}

/// Answers DeleteAcls: per filter, the bindings it removed.
pub fn delete(
    state: &Arc<BrokerState>,
    ctx: &RequestContext,
    req: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let refuse = |code: i16, text: Option<StrBytes>| {
        DeleteAclsResponse::default().with_filter_results(
            req.filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(code)
                        .with_error_message(text.clone())
                })
                .collect(),
        )
    };
    let Some(authorizer) = &state.security.authorizer else {
        return refuse(SECURITY_DISABLED, disabled_message());
    };
    if !ctx.authorized_on_cluster(state, AclOperation::Alter) {
        return refuse(ResponseError::ClusterAuthorizationFailed.code(), None);
    }
    let parsed: Vec<Result<AclFilter, String>> = req
        .filters
        .iter()
        .map(|f| {
            let pattern = if ctx.version == 0 {
                PatternType::Literal.code()
            } else {
                f.pattern_type_filter
            };
            filter(
                f.resource_type_filter,
                f.resource_name_filter.as_ref(),
                pattern,
                f.principal_filter.as_ref(),
                f.host_filter.as_ref(),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = parsed.iter().filter_map(|f| f.clone().ok()).collect();
    let deleted = match authorizer.delete(&valid) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "persisting ACLs failed");
            return refuse(
                ResponseError::UnknownServerError.code(),
                message(format!("persisting ACLs failed: {e}")),
            );
        }
    };
    let mut deleted = deleted.into_iter();
    let results = parsed
        .into_iter()
        .map(|f| match f {
            Err(e) => DeleteAclsFilterResult::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(message(e)),
            Ok(_) => DeleteAclsFilterResult::default().with_matching_acls(
                deleted
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| {
                        tracing::info!(principal = ctx.principal(), acl = ?b.to_line(), "ACL deleted");
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type.code())
                            .with_resource_name(StrBytes::from_string(b.name))
                            .with_pattern_type(b.pattern.code())
                            .with_principal(StrBytes::from_string(b.principal))
                            .with_host(StrBytes::from_string(b.host))
                            .with_operation(b.operation.code())
                            .with_permission_type(b.permission.code())
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
