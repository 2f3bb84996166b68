//! ApiVersions, and THE table of advertised API versions that dispatch checks against.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};

use super::RequestContext;
use kafka_protocol::error::ResponseError;

/// Every API this broker implements with its (min, max) version. ApiVersions answers from this
/// table and dispatch refuses anything outside it. Add an API here only with its handler.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    // retention and topic config APIs
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    // transaction APIs
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    // admin APIs: partitions and transactions (KIP-664)
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::WriteTxnMarkers, 1, 1),
    // security: SASL authentication
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    // security: ACL admin APIs
    (ApiKey::CreateAcls, 0, 3),
    (ApiKey::DescribeAcls, 0, 3),
    (ApiKey::DeleteAcls, 0, 3),
];

/// The advertised (min, max) versions of `key`, or None if the API is not implemented.
pub fn supported_range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, min, max)| (min, max))
}

/// Whether `key` at `version` is advertised.
pub fn is_supported(key: ApiKey, version: i16) -> bool {
    supported_range(key).is_some_and(|(min, max)| (min..=max).contains(&version))
}

fn api_keys() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect()
}

/// Answers a supported ApiVersions request.
pub fn handle(ctx: &RequestContext, request: &ApiVersionsRequest) -> ApiVersionsResponse {
    if ctx.version >= 3 {
        tracing::debug!(
            software = %request.client_software_name.as_str(),
            software_version = %request.client_software_version.as_str(),
            "client software"
        );
    }
    ApiVersionsResponse::default().with_api_keys(api_keys())
}

/// KIP-511: an ApiVersions request above the supported range gets UNSUPPORTED_VERSION with
/// the supported ranges, in a v0 body (which every client can parse).
pub fn unsupported_version_response() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_keys())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_within_what_the_codec_knows() {
        for &(key, min, max) in SUPPORTED {
            let known = key.valid_versions();
            assert!(min <= max, "{key:?}");
            assert!(
                known.min <= min && max <= known.max,
                "{key:?} {min}..={max} vs {known:?}"
            );
        }
    }

    #[test]
    fn unsupported_versions_are_refused() {
        assert!(is_supported(ApiKey::Fetch, 12));
        assert!(!is_supported(ApiKey::Fetch, 13));
        assert!(!is_supported(ApiKey::Produce, 2));
    }
}
