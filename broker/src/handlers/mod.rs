//! Request dispatch: checks the advertised version table, decodes the body, runs the API's
//! handler (one module per API) and encodes the response frame.

pub mod acls;
pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_configs;
pub mod api_versions;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_producers;
pub mod describe_transactions;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod list_transactions;
pub mod metadata;
pub mod offset_commit;
pub mod offset_fetch;
pub mod produce;
pub mod sasl;
pub mod sync_group;
pub mod topic_configs;
pub mod txn_offset_commit;
pub mod write_txn_markers;

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, TxnOffsetCommitRequest,
};
use kafka_protocol::messages::{
    AlterConfigsRequest, DeleteRecordsRequest, IncrementalAlterConfigsRequest,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    FetchRequest, InitProducerIdRequest, ListOffsetsRequest, MetadataRequest, ProduceRequest,
};
use kafka_protocol::messages::{
    CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::messages::{
    CreatePartitionsRequest, DescribeProducersRequest, DescribeTransactionsRequest,
    ListTransactionsRequest, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::{
    DescribeGroupsRequest, FindCoordinatorRequest, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::codec::{self, CodecError, ResponseFrame};
use crate::security::{AclOperation, ResourceType, Session};
use crate::state::BrokerState;

/// What a handler knows about the request besides its body.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The API.
    pub api_key: ApiKey,
    /// The request's version (within the advertised range).
    pub version: i16,
    /// Echoed in the response header.
    pub correlation_id: i32,
    /// The client id from the request header, if any.
    pub client_id: Option<String>,
    /// The connection's listener and principal.
    pub session: Arc<Session>,
}

impl RequestContext {
    /// The connection's principal (`User:ANONYMOUS` before authentication, which only the
    /// SASL APIs see).
    pub fn principal(&self) -> &str {
        self.session
            .principal()
            .unwrap_or(crate::security::ANONYMOUS)
    }

    /// Whether the connection's principal may perform `operation` on the resource; always
    /// true without an authorizer. A refusal is logged at debug level and counted.
    pub fn authorized(
        &self,
        state: &BrokerState,
        operation: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        let Some(authorizer) = &state.security.authorizer else {
            return true;
        };
        let allowed = authorizer.authorize(
            self.principal(),
            self.session.peer.ip(),
            operation,
            resource_type,
            name,
        );
        if !allowed {
            tracing::debug!(principal = self.principal(), %operation, %resource_type, name, "authorization denied");
            crate::security::record_denied(resource_type, operation);
        }
        allowed
    }

    /// Whether the principal may perform `operation` on some resource of the type (Kafka's
    /// `authorizeByResourceType`); always true without an authorizer.
    pub fn authorized_on_any(
        &self,
        state: &BrokerState,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        state.security.authorizer.as_ref().is_none_or(|a| {
            a.authorize_any(
                self.principal(),
                self.session.peer.ip(),
                operation,
                resource_type,
            )
        })
    }

    /// Whether the principal may perform `operation` on the cluster.
    pub fn authorized_on_cluster(&self, state: &BrokerState, operation: AclOperation) -> bool {
        self.authorized(
            state,
            operation,
            ResourceType::Cluster,
            crate::security::acl::CLUSTER_NAME,
        )
    }

    /// Kafka's authorized-operations bitfield of a resource for the principal (every
    /// supported operation without an authorizer).
    pub fn authorized_operations(
        &self,
        state: &BrokerState,
        resource_type: ResourceType,
        name: &str,
    ) -> i32 {
        match &state.security.authorizer {
            Some(a) => a.authorized_operations(
                self.principal(),
                self.session.peer.ip(),
                resource_type,
                name,
            ),
            None => AclOperation::supported_by(resource_type)
                .iter()
                .fold(0, |bits, op| bits | (1 << op.code())),
        }
    }
}

/// Why a request got no response; the connection is closed after logging it.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The frame, header or body was malformed.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The API key or version is not advertised (Kafka closes the connection too).
    #[error("unsupported request {api:?} v{version}")]
    Unsupported {
        /// The API.
        api: ApiKey,
        /// The requested version.
        version: i16,
    },
    /// A request other than ApiVersions or the SASL APIs before SASL authentication
    /// completed (Kafka closes the connection too).
    #[error("{api:?} before SASL authentication")]
    Unauthenticated {
        /// The API.
        api: ApiKey,
    },
    /// A SASL exchange over bare frames (SaslHandshake v0) failed; the connection closes.
    #[error("SASL authentication failed")]
    SaslFailed,
}

/// A handled request: its context and the encoded response frame (None when the protocol
/// sends no response, as for Produce with acks=0).
#[derive(Debug)]
pub struct Handled {
    /// The decoded request header.
    pub ctx: RequestContext,
    /// The response frame, size prefix included.
    pub response: Option<ResponseFrame>,
}

/// Decodes and handles one request frame (size prefix removed) outside any connection, as
/// `User:ANONYMOUS` on a PLAINTEXT listener advertising the broker's first listener.
pub async fn dispatch(state: &Arc<BrokerState>, frame: Bytes) -> Result<Handled, DispatchError> {
    let session = Arc::new(Session::internal(
        &state.advertised_host,
        state.advertised_port,
    ));
    dispatch_in_session(state, &session, frame).await
}

/// Decodes and handles one request frame (size prefix removed) of a connection's session.
pub async fn dispatch_in_session(
    state: &Arc<BrokerState>,
    session: &Arc<Session>,
    frame: Bytes,
) -> Result<Handled, DispatchError> {
    if session.expects_raw_token() {
        return sasl::raw_token(state, session, frame).await;
    }
    let prefix = codec::peek_prefix(&frame)?;
    let api_key =
        ApiKey::try_from(prefix.api_key).map_err(|()| CodecError::UnknownApiKey(prefix.api_key))?;
    let version = prefix.api_version;
    if api_key == ApiKey::ApiVersions
        && !api_versions::is_supported(api_key, version)
        && version > 0
    {
        // KIP-511: answer with our ranges in a v0 body (v0 response header) without parsing
        // the rest of a header/body we may not understand.
        tracing::info!(
            version,
            "ApiVersions above the supported range: answering UNSUPPORTED_VERSION"
        );
        let body = api_versions::unsupported_version_response();
        let response = codec::encode_response_with_header_version(
            api_key,
            0,
            0,
            prefix.correlation_id,
            &body,
        )?;
        let ctx = RequestContext {
            api_key,
            version,
            correlation_id: prefix.correlation_id,
            client_id: None,
            session: Arc::clone(session),
        };
        return Ok(Handled {
            ctx,
            response: Some(response.into()),
        });
    }
    if !api_versions::is_supported(api_key, version) {
        return Err(DispatchError::Unsupported {
            api: api_key,
            version,
        });
    }
    if !session.is_authenticated()
        && !matches!(
            api_key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        return Err(DispatchError::Unauthenticated { api: api_key });
    }
    let (header, body) = codec::decode_header(api_key, frame)?;
    let ctx = RequestContext {
        api_key,
        version,
        correlation_id: header.correlation_id,
        client_id: header.client_id.as_ref().map(|c| c.as_str().to_string()),
        session: Arc::clone(session),
    };
    let span = tracing::Span::current();
    span.record("correlation_id", ctx.correlation_id);
    if let Some(client) = &ctx.client_id {
        span.record("client_id", client.as_str());
    }
    let response = match api_key {
        ApiKey::ApiVersions => {
            let req: ApiVersionsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &api_versions::handle(&ctx, &req))?)
        }
        ApiKey::SaslHandshake => {
            let req: SaslHandshakeRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &sasl::handshake(state, &ctx, req))?)
        }
        ApiKey::SaslAuthenticate => {
            let req: SaslAuthenticateRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &sasl::authenticate(state, &ctx, req).await)?)
        }
        ApiKey::CreateAcls => {
            let req: CreateAclsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &acls::create(state, &ctx, req))?)
        }
        ApiKey::DescribeAcls => {
            let req: DescribeAclsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &acls::describe(state, &ctx, req))?)
        }
        ApiKey::DeleteAcls => {
            let req: DeleteAclsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &acls::delete(state, &ctx, req))?)
        }
        ApiKey::Metadata => {
            let req: MetadataRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &metadata::handle(state, &ctx, req))?)
        }
        ApiKey::CreateTopics => {
            let req: CreateTopicsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &create_topics::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::DeleteTopics => {
            let req: DeleteTopicsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &delete_topics::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::Produce => {
            let req: ProduceRequest = decode(&ctx, body)?;
            let acks = req.acks;
            let resp = produce::handle(state, &ctx, req).await;
            if acks == 0 {
                None
            } else {
                Some(encode(&ctx, &resp)?)
            }
        }
        ApiKey::Fetch => {
            let req: FetchRequest = decode(&ctx, body)?;
            let resp = fetch::handle(state, &ctx, req).await;
            Some(fetch::encode_response(
                ctx.version,
                ctx.correlation_id,
                &resp,
            )?)
        }
        ApiKey::ListOffsets => {
            let req: ListOffsetsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &list_offsets::handle(state, &ctx, req))?)
        }
        ApiKey::InitProducerId => {
            let req: InitProducerIdRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &init_producer_id::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::DescribeConfigs => {
            let req: DescribeConfigsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &describe_configs::handle(state, &ctx, req))?)
        }
        // retention and topic config APIs
        ApiKey::DeleteRecords => {
            let req: DeleteRecordsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &delete_records::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::AlterConfigs => {
            let req: AlterConfigsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &alter_configs::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::IncrementalAlterConfigs => {
            let req: IncrementalAlterConfigsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &incremental_alter_configs::handle(state, &ctx, req).await,
            )?)
        }
        // transaction APIs
        ApiKey::AddPartitionsToTxn => {
            let req: AddPartitionsToTxnRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &add_partitions_to_txn::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::AddOffsetsToTxn => {
            let req: AddOffsetsToTxnRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &add_offsets_to_txn::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::EndTxn => {
            let req: EndTxnRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &end_txn::handle(state, &ctx, req).await)?)
        }
        ApiKey::TxnOffsetCommit => {
            let req: TxnOffsetCommitRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &txn_offset_commit::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::FindCoordinator => {
            let req: FindCoordinatorRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &find_coordinator::handle(state, &ctx, req))?)
        }
        ApiKey::JoinGroup => {
            let req: JoinGroupRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &join_group::handle(state, &ctx, req).await)?)
        }
        ApiKey::SyncGroup => {
            let req: SyncGroupRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &sync_group::handle(state, &ctx, req).await)?)
        }
        ApiKey::Heartbeat => {
            let req: HeartbeatRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &heartbeat::handle(state, &ctx, req))?)
        }
        ApiKey::LeaveGroup => {
            let req: LeaveGroupRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &leave_group::handle(state, &ctx, req))?)
        }
        ApiKey::OffsetCommit => {
            let req: OffsetCommitRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &offset_commit::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::OffsetFetch => {
            let req: OffsetFetchRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &offset_fetch::handle(state, &ctx, req))?)
        }
        ApiKey::DescribeGroups => {
            let req: DescribeGroupsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &describe_groups::handle(state, &ctx, req))?)
        }
        ApiKey::ListGroups => {
            let req: ListGroupsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &list_groups::handle(state, &ctx, req))?)
        }
        // admin APIs: partitions and transactions (KIP-664)
        ApiKey::CreatePartitions => {
            let req: CreatePartitionsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &create_partitions::handle(state, &ctx, req).await,
            )?)
        }
        ApiKey::DescribeProducers => {
            let req: DescribeProducersRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &describe_producers::handle(state, &ctx, req))?)
        }
        ApiKey::ListTransactions => {
            let req: ListTransactionsRequest = decode(&ctx, body)?;
            Some(encode(&ctx, &list_transactions::handle(state, &ctx, req))?)
        }
        ApiKey::DescribeTransactions => {
            let req: DescribeTransactionsRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &describe_transactions::handle(state, &ctx, req),
            )?)
        }
        ApiKey::WriteTxnMarkers => {
            let req: WriteTxnMarkersRequest = decode(&ctx, body)?;
            Some(encode(
                &ctx,
                &write_txn_markers::handle(state, &ctx, req).await,
            )?)
        }
        other => {
            return Err(DispatchError::Unsupported {
                api: other,
                version,
            })
        }
    };
    Ok(Handled { ctx, response })
}

fn decode<T: Decodable>(ctx: &RequestContext, body: Bytes) -> Result<T, CodecError> {
    codec::decode_body(ctx.api_key, ctx.version, body)
}

fn encode<T: Encodable>(ctx: &RequestContext, body: &T) -> Result<ResponseFrame, CodecError> {
    codec::encode_response(ctx.api_key, ctx.version, ctx.correlation_id, body).map(Into::into)
}

/// Metric/log label of an API.
pub fn api_name(key: ApiKey) -> &'static str {
    match key {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::DeleteRecords => "DeleteRecords",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::AddPartitionsToTxn => "AddPartitionsToTxn",
        ApiKey::AddOffsetsToTxn => "AddOffsetsToTxn",
        ApiKey::EndTxn => "EndTxn",
        ApiKey::TxnOffsetCommit => "TxnOffsetCommit",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::DescribeProducers => "DescribeProducers",
        ApiKey::ListTransactions => "ListTransactions",
        ApiKey::DescribeTransactions => "DescribeTransactions",
        ApiKey::WriteTxnMarkers => "WriteTxnMarkers",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        ApiKey::CreateAcls => "CreateAcls",
        ApiKey::DescribeAcls => "DescribeAcls",
        ApiKey::DeleteAcls => "DeleteAcls",
        _ => "other",
    }
}
