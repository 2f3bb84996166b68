//! The request guard's walkers for the consumer group APIs (FindCoordinator, JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups):
//! arrays whose count cannot fit in the remaining bytes are refused before the decoder
//! reserves memory for them.

use kafka_protocol::messages::ApiKey;

use super::{min_len, Result, Walker};

/// Walks a group API request body; `Ok(None)` for APIs that are not group APIs.
pub(super) fn walk(api: ApiKey, version: i16, body: &[u8]) -> Result<Option<usize>> {
    let flexible = match api {
        ApiKey::FindCoordinator => version >= 3,
        ApiKey::JoinGroup => version >= 6,
        ApiKey::SyncGroup => version >= 4,
        ApiKey::Heartbeat => version >= 4,
        ApiKey::LeaveGroup => version >= 4,
        ApiKey::OffsetCommit => version >= 8,
        ApiKey::OffsetFetch => version >= 6,
        ApiKey::DescribeGroups => version >= 5,
        ApiKey::ListGroups => version >= 3,
        _ => return Ok(None),
    };
    let w = &mut Walker {
        buf: body,
        pos: 0,
        flexible,
    };
    let s = min_len(flexible, 2); // string
    let a = min_len(flexible, 4); // array
    let b = min_len(flexible, 4); // bytes
    let t = usize::from(flexible); // tag section
    match api {
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
        ApiKey::Heartbeat => {
            w.string()?; // group_id
            w.skip(4)?; // generation_id
            w.string()?; // member_id
            if version >= 3 {
                w.string()?; // group_instance_id
            }
        }
        ApiKey::LeaveGroup => {
            w.string()?; // group_id
            if version <= 2 {
                w.string()?; // member_id
            } else {
                let member = s + s + if version >= 5 { s } else { 0 } + t;
                w.array(member, |w| {
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
            if version >= 1 {
                w.skip(4)?; // generation_id_or_member_epoch
                w.string()?; // member_id
            }
            if version >= 7 {
                w.string()?; // group_instance_id
            }
            if (2..=4).contains(&version) {
                w.skip(8)?; // retention_time_ms
            }
            let fixed = 4 + 8 + if version >= 6 { 4 } else { 0 } + if version == 1 { 8 } else { 0 };
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(fixed + s + t, |w| {
                    w.skip(fixed)?; // partition_index, committed_offset, epoch, timestamp
                    w.string()?; // committed_metadata
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::OffsetFetch => {
            let topics = |w: &mut Walker<'_>| {
                w.array(s + a + t, |w| {
                    w.string()?; // name
                    w.array(4, |w| w.skip(4))?; // partition_indexes
                    w.tags()
                })
            };
            if version <= 7 {
                w.string()?; // group_id
                topics(w)?;
            } else {
                let group = s + if version >= 9 { s + 4 } else { 0 } + a + t;
                w.array(group, |w| {
                    w.string()?; // group_id
                    if version >= 9 {
                        w.string()?; // member_id
                        w.skip(4)?; // member_epoch
                    }
                    topics(w)?;
                    w.tags()
                })?;
            }
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
    w.tags()?;
    Ok(Some(w.pos))
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::super::GuardError;
    use super::walk;
    use crate::handlers::api_versions::SUPPORTED;

    fn st(s: &'static str) -> StrBytes {
        StrBytes::from_static_str(s)
    }

    fn encoded<T: Encodable>(body: &T, version: i16) -> Vec<u8> {
        let mut buf = BytesMut::new();
        body.encode(&mut buf, version).expect("encodes");
        buf.to_vec()
    }

    fn sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
        let group = || GroupId(st("group"));
        Some(match api {
            ApiKey::FindCoordinator => {
                let mut req = FindCoordinatorRequest::default();
                if version >= 4 {
                    req = req.with_coordinator_keys(vec![st("a"), st("bb")]);
                } else {
                    req = req.with_key(st("key"));
                }
                if version >= 1 {
                    req = req.with_key_type(1);
                }
                encoded(&req, version)
            }
            ApiKey::JoinGroup => encoded(
                &JoinGroupRequest::default()
                    .with_group_id(group())
                    .with_session_timeout_ms(6_000)
                    .with_rebalance_timeout_ms(9_000)
                    .with_member_id(st("m-1"))
                    .with_group_instance_id((version >= 5).then(|| st("inst")))
                    .with_protocol_type(st("consumer"))
                    .with_protocols(vec![
                        JoinGroupRequestProtocol::default()
                            .with_name(st("range"))
                            .with_metadata(Bytes::from_static(b"meta")),
                        JoinGroupRequestProtocol::default()
                            .with_name(st("roundrobin"))
                            .with_metadata(Bytes::from_static(b"")),
                    ])
                    .with_reason((version >= 8).then(|| st("why"))),
                version,
            ),
            ApiKey::SyncGroup => encoded(
                &SyncGroupRequest::default()
                    .with_group_id(group())
                    .with_generation_id(3)
                    .with_member_id(st("m-1"))
                    .with_group_instance_id((version >= 3).then(|| st("inst")))
                    .with_protocol_type((version >= 5).then(|| st("consumer")))
                    .with_protocol_name((version >= 5).then(|| st("range")))
                    .with_assignments(vec![SyncGroupRequestAssignment::default()
                        .with_member_id(st("m-1"))
                        .with_assignment(Bytes::from_static(b"assignment"))]),
                version,
            ),
            ApiKey::Heartbeat => encoded(
                &HeartbeatRequest::default()
                    .with_group_id(group())
                    .with_generation_id(3)
                    .with_member_id(st("m-1"))
                    .with_group_instance_id((version >= 3).then(|| st("inst"))),
                version,
            ),
            ApiKey::LeaveGroup => {
                let req = LeaveGroupRequest::default().with_group_id(group());
                let req = if version <= 2 {
                    req.with_member_id(st("m-1"))
                } else {
                    req.with_members(vec![
                        MemberIdentity::default()
                            .with_member_id(st("m-1"))
                            .with_reason((version >= 5).then(|| st("bye"))),
                        MemberIdentity::default()
                            .with_member_id(st("m-2"))
                            .with_group_instance_id(Some(st("i"))),
                    ])
                };
                encoded(&req, version)
            }
            ApiKey::OffsetCommit => {
                let partition = |i| {
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(i)
                        .with_committed_offset(42)
                        .with_committed_leader_epoch(if version >= 6 { 5 } else { -1 })
                        .with_committed_metadata(Some(st("md")))
                };
                encoded(
                    &OffsetCommitRequest::default()
                        .with_group_id(group())
                        .with_generation_id_or_member_epoch(3)
                        .with_member_id(st("m-1"))
                        .with_group_instance_id((version >= 7).then(|| st("inst")))
                        .with_retention_time_ms(if (2..=4).contains(&version) { 1000 } else { -1 })
                        .with_topics(vec![OffsetCommitRequestTopic::default()
                            .with_name(TopicName(st("t")))
                            .with_partitions(vec![partition(0), partition(1)])]),
                    version,
                )
            }
            ApiKey::OffsetFetch => {
                let req = if version <= 7 {
                    OffsetFetchRequest::default()
                        .with_group_id(group())
                        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                            .with_name(TopicName(st("t")))
                            .with_partition_indexes(vec![0, 1, 2])]))
                } else {
                    OffsetFetchRequest::default().with_groups(vec![
                        OffsetFetchRequestGroup::default()
                            .with_group_id(group())
                            .with_member_id((version >= 9).then(|| st("m")))
                            .with_member_epoch(if version >= 9 { 4 } else { -1 })
                            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                                .with_name(TopicName(st("t")))
                                .with_partition_indexes(vec![0, 1])])),
                        OffsetFetchRequestGroup::default()
                            .with_group_id(GroupId(st("other")))
                            .with_topics(None),
                    ])
                };
                encoded(&req.with_require_stable(version >= 7), version)
            }
            ApiKey::DescribeGroups => encoded(
                &DescribeGroupsRequest::default()
                    .with_groups(vec![group(), GroupId(st("g2"))])
                    .with_include_authorized_operations(version >= 3),
                version,
            ),
            ApiKey::ListGroups => encoded(
                &ListGroupsRequest::default()
                    .with_states_filter(if version >= 4 {
                        vec![st("Stable")]
                    } else {
                        vec![]
                    })
                    .with_types_filter(if version >= 5 {
                        vec![st("classic")]
                    } else {
                        vec![]
                    }),
                version,
            ),
            _ => return None,
        })
    }

    #[test]
    fn every_advertised_group_api_version_is_walked_exactly() {
        let mut walked = 0;
        for &(api, min, max) in SUPPORTED {
            for version in min..=max {
                let Some(body) = sample(api, version) else {
                    continue;
                };
                assert_eq!(
                    walk(api, version, &body),
                    Ok(Some(body.len())),
                    "{api:?} v{version}"
                );
                for cut in 0..body.len() {
                    if let Ok(Some(n)) = walk(api, version, &body[..cut]) {
                        assert!(n <= cut, "{api:?} v{version} cut {cut}");
                    }
                }
                walked += 1;
            }
        }
        assert!(walked >= 50, "only {walked} versions walked");
    }

    #[test]
    fn absurd_group_array_counts_are_refused() {
        // JoinGroup v5 whose protocols array claims i32::MAX entries.
        let mut join = BytesMut::new();
        join.put_i16(1);
        join.put_slice(b"g");
        join.put_i32(6_000);
        join.put_i32(6_000);
        join.put_i16(0); // member_id ""
        join.put_i16(-1); // group_instance_id null
        join.put_i16(8);
        join.put_slice(b"consumer");
        join.put_i32(i32::MAX);
        assert!(matches!(
            walk(ApiKey::JoinGroup, 5, &join),
            Err(GuardError::ArrayTooLong { .. })
        ));

        // DescribeGroups v5 (flexible) claiming 2^31 groups.
        let mut describe = BytesMut::new();
        describe.put_slice(&[0x80, 0x80, 0x80, 0x80, 0x08]);
        assert!(matches!(
            walk(ApiKey::DescribeGroups, 5, &describe),
            Err(GuardError::ArrayTooLong { .. })
        ));

        // OffsetFetch v8 with a group whose topics claim a billion entries.
        let mut fetch = BytesMut::new();
        fetch.put_u8(2); // one group
        fetch.put_u8(2);
        fetch.put_slice(b"g");
        fetch.put_slice(&[0x80, 0x80, 0x80, 0x80, 0x04]);
        assert!(matches!(
            walk(ApiKey::OffsetFetch, 8, &fetch),
            Err(GuardError::ArrayTooLong { .. })
        ));

        // Non-group APIs are not this walker's business.
        assert_eq!(walk(ApiKey::Produce, 9, &[]), Ok(None));
    }
}
