//! A structural pre-check of request bodies before the kafka-protocol decoder sees them.
//!
//! The decoder reserves `Vec::with_capacity(count)` for every array from the count on the
//! wire, so a 40-byte frame claiming two billion topics would make it reserve hundreds of
//! gigabytes and abort the whole process. This walker follows the (advertised versions of
//! the) request schemas, skipping scalars and strings, and refuses any array whose count
//! cannot fit in the bytes that remain. APIs whose requests have no arrays are not walked.

use kafka_protocol::messages::ApiKey;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// An array claims more elements than the remaining bytes could hold.
    #[error("array of {count} elements at byte {at} cannot fit in {remaining} remaining bytes")]
    ArrayTooLong {
        /// Claimed element count.
        count: u64,
        /// Byte position of the count.
        at: usize,
        /// Bytes left after the count.
        remaining: usize,
    },
    /// The body ends inside a field.
    #[error("body ends inside a field at byte {0}")]
    Truncated(usize),
}

type Result<T> = std::result::Result<T, GuardError>;

struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
    flexible: bool,
}

impl Walker<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn skip(&mut self, n: usize) -> Result<()> {
        if n > self.remaining() {
            return Err(GuardError::Truncated(self.pos));
        }
        self.pos += n;
        Ok(())
    }

    fn int(&mut self, width: usize) -> Result<i64> {
        let bytes = self
            .buf
            .get(self.pos..self.pos + width)
            .ok_or(GuardError::Truncated(self.pos))?;
        self.pos += width;
        Ok(bytes.iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b)))
    }

    fn i16(&mut self) -> Result<i16> {
        Ok(self.int(2)? as u16 as i16)
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(self.int(4)? as u32 as i32)
    }

    fn uvarint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let b = self.int(1)? as u64;
            value |= (b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(GuardError::Truncated(self.pos))
    }

    /// A (nullable) string: compact in flexible versions.
    fn string(&mut self) -> Result<()> {
        let len = if self.flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            u64::try_from(self.i16()?).unwrap_or(0)
        };
        self.skip(usize::try_from(len).unwrap_or(usize::MAX))
    }

    /// (Nullable) bytes: compact in flexible versions.
    fn bytes(&mut self) -> Result<()> {
        let len = if self.flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            u64::try_from(self.i32()?).unwrap_or(0)
        };
        self.skip(usize::try_from(len).unwrap_or(usize::MAX))
    }

    /// A (nullable) array whose elements take at least `min_element` bytes each.
    fn array(
        &mut self,
        min_element: usize,
        mut element: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let at = self.pos;
        let count = if self.flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            u64::try_from(self.i32()?).unwrap_or(0)
        };
        let remaining = self.remaining();
        if count.saturating_mul(min_element as u64) > remaining as u64 {
            return Err(GuardError::ArrayTooLong {
                count,
                at,
                remaining,
            });
        }
        for _ in 0..count {
            element(self)?;
        }
        Ok(())
    }

    /// The tagged-field section that ends every structure in flexible versions.
    fn tags(&mut self) -> Result<()> {
        if !self.flexible {
            return Ok(());
        }
        let at = self.pos;
        let count = self.uvarint()?;
        if count.saturating_mul(2) > self.remaining() as u64 {
            let remaining = self.remaining();
            return Err(GuardError::ArrayTooLong {
                count,
                at,
                remaining,
            });
        }
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(usize::try_from(size).unwrap_or(usize::MAX))?;
        }
        Ok(())
    }
}

/// Smallest encoding of a string, an array or a tag section (compact: 1 byte).
fn min_len(flexible: bool, classic: usize) -> usize {
    if flexible {
        1
    } else {
        classic
    }
}

/// APIs whose request bodies hold no arrays, so the decoder cannot over-reserve.
pub const WITHOUT_ARRAYS: &[ApiKey] = &[
    ApiKey::ApiVersions,
    ApiKey::InitProducerId,
    ApiKey::AddOffsetsToTxn,
    ApiKey::EndTxn,
    ApiKey::Heartbeat,
    // Security: the SASL exchange (a string, a byte string) and DescribeAcls (one filter).
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
    ApiKey::DescribeAcls,
];

/// APIs this module walks. Every API added to the advertised table must be here (with a walk
/// below) or in [`WITHOUT_ARRAYS`]; a unit test enforces it.
pub const WALKED: &[ApiKey] = &[
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
    ApiKey::Metadata,
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::DescribeConfigs,
    // Retention and topic config APIs.
    ApiKey::DeleteRecords,
    ApiKey::AlterConfigs,
    ApiKey::IncrementalAlterConfigs,
    // Transaction and group coordinator APIs (all versions the crate knows up to those
    // listed in `coordinator_versions`).
    ApiKey::AddPartitionsToTxn,
    ApiKey::TxnOffsetCommit,
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::DescribeGroups,
    ApiKey::ListGroups,
    // Admin APIs: partitions and transactions (KIP-664).
    ApiKey::CreatePartitions,
    ApiKey::DescribeProducers,
    ApiKey::ListTransactions,
    ApiKey::DescribeTransactions,
    ApiKey::WriteTxnMarkers,
    // Security: ACL admin APIs.
    ApiKey::CreateAcls,
    ApiKey::DeleteAcls,
];

/// Highest version walked for each coordinator API in [`WALKED`] (their schemas change
/// beyond these); higher versions pass unchecked and must not be advertised unwalked.
pub const COORDINATOR_MAX_VERSIONS: &[(ApiKey, i16)] = &[
    (ApiKey::AddPartitionsToTxn, 5),
    (ApiKey::TxnOffsetCommit, 5),
    (ApiKey::FindCoordinator, 6),
    (ApiKey::JoinGroup, 9),
    (ApiKey::SyncGroup, 5),
    (ApiKey::LeaveGroup, 5),
    (ApiKey::OffsetCommit, 9),
    (ApiKey::OffsetFetch, 9),
    (ApiKey::DescribeGroups, 6),
    (ApiKey::ListGroups, 5),
];

/// Walks a request body of `api` at `version` (whose header has been consumed). APIs not in
/// [`WALKED`] pass unchecked.
pub fn check(api: ApiKey, version: i16, body: &[u8]) -> Result<()> {
    walk(api, version, body).map(|_| ())
}

/// [`check`], returning how many bytes the walk consumed (all of them for a well-formed body).
fn walk(api: ApiKey, version: i16, body: &[u8]) -> Result<usize> {
    let beyond_walked = COORDINATOR_MAX_VERSIONS
        .iter()
        .any(|&(key, max)| key == api && version > max);
    if beyond_walked {
        return Ok(body.len());
    }
    let flexible = match api {
        ApiKey::Produce => version >= 9,
        ApiKey::Fetch => version >= 12,
        ApiKey::ListOffsets => version >= 6,
        ApiKey::Metadata => version >= 9,
        ApiKey::CreateTopics => version >= 5,
        ApiKey::DeleteTopics => version >= 4,
        ApiKey::DescribeConfigs => version >= 4,
        ApiKey::DeleteRecords => version >= 2,
        ApiKey::AlterConfigs => version >= 2,
        ApiKey::IncrementalAlterConfigs => version >= 1,
        ApiKey::AddPartitionsToTxn => version >= 3,
        ApiKey::TxnOffsetCommit => version >= 3,
        ApiKey::FindCoordinator => version >= 3,
        ApiKey::JoinGroup => version >= 6,
        ApiKey::SyncGroup => version >= 4,
        ApiKey::LeaveGroup => version >= 4,
        ApiKey::OffsetCommit => version >= 8,
        ApiKey::OffsetFetch => version >= 6,
        ApiKey::DescribeGroups => version >= 5,
        ApiKey::ListGroups => version >= 3,
        ApiKey::CreatePartitions => version >= 2,
        ApiKey::CreateAcls | ApiKey::DeleteAcls => version >= 2,
        ApiKey::DescribeProducers
        | ApiKey::ListTransactions
        | ApiKey::DescribeTransactions
        | ApiKey::WriteTxnMarkers => true,
        _ => return Ok(body.len()),
    };
    let w = &mut Walker {
        buf: body,
        pos: 0,
        flexible,
    };
    let s = min_len(flexible, 2); // string
    let a = min_len(flexible, 4); // array
    let t = usize::from(flexible); // tag section
    match api {
        ApiKey::Produce => {
            w.string()?; // transactional_id
            w.skip(2 + 4)?; // acks, timeout_ms
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(4 + min_len(flexible, 4) + t, |w| {
                    w.skip(4)?; // index
                    w.bytes()?; // records
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::Fetch => {
            w.skip(4 + 4 + 4 + 4 + 1)?; // replica_id, max_wait, min_bytes, max_bytes, isolation
            if version >= 7 {
                w.skip(4 + 4)?; // session_id, session_epoch
            }
            let partition = 4
                + if version >= 9 { 4 } else { 0 }
                + 8
                + if version >= 12 { 4 } else { 0 }
                + if version >= 5 { 8 } else { 0 }
                + 4;
            w.array(s + a + t, |w| {
                w.string()?; // topic
                w.array(partition + t, |w| {
                    w.skip(partition)?;
                    w.tags()
                })?;
                w.tags()
            })?;
            if version >= 7 {
                w.array(s + a + t, |w| {
                    w.string()?; // topic
                    w.array(4, |w| w.skip(4))?;
                    w.tags()
                })?;
            }
            if version >= 11 {
                w.string()?; // rack_id
            }
        }
        ApiKey::ListOffsets => {
            w.skip(4)?; // replica_id
            if version >= 2 {
                w.skip(1)?; // isolation_level
            }
            let partition = 4 + if version >= 4 { 4 } else { 0 } + 8;
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(partition + t, |w| {
                    w.skip(partition)?;
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::Metadata => {
            let topic = if version >= 10 { 16 } else { 0 } + s + t;
            w.array(topic, |w| {
                if version >= 10 {
                    w.skip(16)?; // topic_id
                }
                w.string()?; // name
                w.tags()
            })?;
            if version >= 4 {
                w.skip(1)?; // allow_auto_topic_creation
            }
            if (8..=10).contains(&version) {
                w.skip(1)?; // include_cluster_authorized_operations
            }
            if version >= 8 {
                w.skip(1)?; // include_topic_authorized_operations
            }
        }
        ApiKey::CreateTopics => {
            w.array(s + 4 + 2 + a + a + t, |w| {
                w.string()?; // name
                w.skip(4 + 2)?; // num_partitions, replication_factor
                w.array(4 + a + t, |w| {
                    w.skip(4)?; // partition_index
                    w.array(4, |w| w.skip(4))?; // broker_ids
                    w.tags()
                })?;
                w.array(s + s + t, |w| {
                    w.string()?; // name
                    w.string()?; // value
                    w.tags()
                })?;
                w.tags()
            })?;
            w.skip(4 + 1)?; // timeout_ms, validate_only
        }
        ApiKey::DeleteTopics => {
            w.array(s, |w| w.string())?; // topic_names
            w.skip(4)?; // timeout_ms
        }
        ApiKey::DeleteRecords => {
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(4 + 8 + t, |w| {
                    w.skip(4 + 8)?; // partition_index, offset
                    w.tags()
                })?;
                w.tags()
            })?;
            w.skip(4)?; // timeout_ms
        }
        ApiKey::AlterConfigs | ApiKey::IncrementalAlterConfigs => {
            let incremental = api == ApiKey::IncrementalAlterConfigs;
            let op = usize::from(incremental);
            w.array(1 + s + a + t, |w| {
                w.skip(1)?; // resource_type
                w.string()?; // resource_name
                w.array(s + op + s + t, |w| {
                    w.string()?; // name
                    w.skip(op)?; // config_operation (incremental)
                    w.string()?; // value
                    w.tags()
                })?;
                w.tags()
            })?;
            w.skip(1)?; // validate_only
        }
        ApiKey::DescribeConfigs => {
            w.array(1 + s + a + t, |w| {
                w.skip(1)?; // resource_type
                w.string()?; // resource_name
                w.array(s, |w| w.string())?; // configuration_keys
                w.tags()
            })?;
            w.skip(1)?; // include_synonyms
            if version >= 3 {
                w.skip(1)?; // include_documentation
            }
        }
        ApiKey::CreatePartitions
        | ApiKey::DescribeProducers
        | ApiKey::ListTransactions
        | ApiKey::DescribeTransactions
        | ApiKey::WriteTxnMarkers
        | ApiKey::CreateAcls
        | ApiKey::DeleteAcls => walk_admin(w, api, version)?,
        _ => walk_coordinator(w, api, version)?,
    }
    w.tags()?;
    Ok(w.pos)
}

/// The transaction and group coordinator requests (body fields before the final tags).
fn walk_coordinator(w: &mut Walker<'_>, api: ApiKey, version: i16) -> Result<()> {
    let flexible = w.flexible;
    let s = min_len(flexible, 2); // string
    let a = min_len(flexible, 4); // array
    let b = min_len(flexible, 4); // bytes
    let t = usize::from(flexible); // tag section
                                   // A topic with an array of i32 partitions (AddPartitionsToTxn, OffsetFetch).
    let topic_with_partition_ids = |w: &mut Walker<'_>| -> Result<()> {
        w.string()?; // name
        w.array(4, |w| w.skip(4))?;
        w.tags()
    };
    match api {
        ApiKey::AddPartitionsToTxn if version >= 4 => {
            w.array(s + 8 + 2 + 1 + a + t, |w| {
                w.string()?; // transactional_id
                w.skip(8 + 2 + 1)?; // producer_id, producer_epoch, verify_only
                w.array(s + a + t, topic_with_partition_ids)?;
                w.tags()
            })?;
        }
        ApiKey::AddPartitionsToTxn => {
            w.string()?; // transactional_id
            w.skip(8 + 2)?; // producer_id, producer_epoch
            w.array(s + a + t, topic_with_partition_ids)?;
        }
        ApiKey::TxnOffsetCommit => {
            w.string()?; // transactional_id
            w.string()?; // group_id
            w.skip(8 + 2)?; // producer_id, producer_epoch
            if version >= 3 {
                w.skip(4)?; // generation_id
                w.string()?; // member_id
                w.string()?; // group_instance_id
            }
            let partition = 4 + 8 + if version >= 2 { 4 } else { 0 };
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(partition + s + t, |w| {
                    w.skip(partition)?; // index, offset, leader epoch
                    w.string()?; // metadata
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::FindCoordinator => {
            if version <= 3 {
                w.string()?; // key
            }
            if version >= 1 {
                w.skip(1)?; // key_type
            }
            if version >= 4 {
                w.array(s, |w| w.string())?; // coordinator_keys
            }
        }
        ApiKey::JoinGroup => {
            w.string()?; // group_id
            w.skip(4)?; // session_timeout_ms
            if version >= 1 {
                w.skip(4)?; // rebalance_timeout_ms
            }
            w.string()?; // member_id
            if version >= 5 {
                w.string()?; // group_instance_id
            }
            w.string()?; // protocol_type
            w.array(s + b + t, |w| {
                w.string()?; // name
                w.bytes()?; // metadata
                w.tags()
            })?;
            if version >= 8 {
                w.string()?; // reason
            }
        }
        ApiKey::SyncGroup => {
            w.string()?; // group_id
            w.skip(4)?; // generation_id
            w.string()?; // member_id
            if version >= 3 {
                w.string()?; // group_instance_id
            }
            if version >= 5 {
                w.string()?; // protocol_type
                w.string()?; // protocol_name
            }
            w.array(s + b + t, |w| {
                w.string()?; // member_id
                w.bytes()?; // assignment
                w.tags()
            })?;
        }
        ApiKey::LeaveGroup => {
            w.string()?; // group_id
            if version <= 2 {
                w.string()?; // member_id
            } else {
                let reason = if version >= 5 { s } else { 0 };
                w.array(s + s + reason + t, |w| {
                    w.string()?; // member_id
                    w.string()?; // group_instance_id
                    if version >= 5 {
                        w.string()?; // reason
                    }
                    w.tags()
                })?;
            }
        }
        ApiKey::OffsetCommit => {
            w.string()?; // group_id
            w.skip(4)?; // generation_id_or_member_epoch
            w.string()?; // member_id
            if version >= 7 {
                w.string()?; // group_instance_id
            }
            if version <= 4 {
                w.skip(8)?; // retention_time_ms
            }
            let partition = 4 + 8 + if version >= 6 { 4 } else { 0 };
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(partition + s + t, |w| {
                    w.skip(partition)?; // index, offset, leader epoch
                    w.string()?; // metadata
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::OffsetFetch if version >= 8 => {
            let member = if version >= 9 { s + 4 } else { 0 };
            w.array(s + member + a + t, |w| {
                w.string()?; // group_id
                if version >= 9 {
                    w.string()?; // member_id
                    w.skip(4)?; // member_epoch
                }
                w.array(s + a + t, topic_with_partition_ids)?;
                w.tags()
            })?;
            w.skip(1)?; // require_stable
        }
        ApiKey::OffsetFetch => {
            w.string()?; // group_id
            w.array(s + a + t, topic_with_partition_ids)?;
            if version >= 7 {
                w.skip(1)?; // require_stable
            }
        }
        ApiKey::DescribeGroups => {
            w.array(s, |w| w.string())?; // groups
            if version >= 3 {
                w.skip(1)?; // include_authorized_operations
            }
        }
        ApiKey::ListGroups => {
            if version >= 4 {
                w.array(s, |w| w.string())?; // states_filter
            }
            if version >= 5 {
                w.array(s, |w| w.string())?; // types_filter
            }
        }
        _ => {}
    }
    Ok(())
}

/// The admin requests: CreatePartitions and KIP-664's transaction APIs (body fields before
/// the final tags).
fn walk_admin(w: &mut Walker<'_>, api: ApiKey, version: i16) -> Result<()> {
    let flexible = w.flexible;
    let s = min_len(flexible, 2); // string
    let a = min_len(flexible, 4); // array
    let t = usize::from(flexible); // tag section
                                   // A topic with an array of i32 partitions (DescribeProducers, WriteTxnMarkers).
    let topic_with_partition_ids = |w: &mut Walker<'_>| -> Result<()> {
        w.string()?; // name
        w.array(4, |w| w.skip(4))?;
        w.tags()
    };
    match api {
        ApiKey::CreatePartitions => {
            w.array(s + 4 + a + t, |w| {
                w.string()?; // name
                w.skip(4)?; // count
                w.array(a + t, |w| {
                    w.array(4, |w| w.skip(4))?; // broker_ids
                    w.tags()
                })?; // assignments (nullable)
                w.tags()
            })?;
            w.skip(4 + 1)?; // timeout_ms, validate_only
        }
        ApiKey::DescribeProducers => {
            w.array(s + a + t, topic_with_partition_ids)?;
        }
        ApiKey::ListTransactions => {
            w.array(s, |w| w.string())?; // state_filters
            w.array(8, |w| w.skip(8))?; // producer_id_filters
            if version >= 1 {
                w.skip(8)?; // duration_filter
            }
        }
        ApiKey::DescribeTransactions => {
            w.array(s, |w| w.string())?; // transactional_ids
        }
        ApiKey::CreateAcls => {
            // resource type, name, pattern type, principal, host, operation, permission
            w.array(1 + s + 1 + s + s + 1 + 1 + t, |w| {
                w.skip(1)?;
                w.string()?;
                w.skip(1)?;
                w.string()?;
                w.string()?;
                w.skip(2)?;
                w.tags()
            })?;
        }
        ApiKey::DeleteAcls => {
            // the same fields as filters (the strings nullable)
            w.array(1 + s + 1 + s + s + 1 + 1 + t, |w| {
                w.skip(1)?;
                w.string()?;
                w.skip(1)?;
                w.string()?;
                w.string()?;
                w.skip(2)?;
                w.tags()
            })?;
        }
        ApiKey::WriteTxnMarkers => {
            w.array(8 + 2 + 1 + a + 4 + t, |w| {
                w.skip(8 + 2 + 1)?; // producer_id, producer_epoch, transaction_result
                w.array(s + a + t, topic_with_partition_ids)?;
                w.skip(4)?; // coordinator_epoch
                w.tags()
            })?;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
#[path = "request_guard_tests.rs"]
mod tests;
