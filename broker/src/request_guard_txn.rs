//! The request guard's walkers for the transaction APIs with arrays (AddPartitionsToTxn
//! v0..=3, TxnOffsetCommit v0..=3): arrays whose count cannot fit in the remaining bytes are
//! refused before the decoder reserves memory for them. AddOffsetsToTxn and EndTxn hold no
//! arrays.

use kafka_protocol::messages::ApiKey;

use super::{min_len, Result, Walker};

/// Transaction APIs walked here (the guard's tests iterate it).
#[cfg(test)]
pub(super) const WALKED_TXN: &[ApiKey] = &[ApiKey::AddPartitionsToTxn, ApiKey::TxnOffsetCommit];

/// Walks a transaction API request body; `Ok(None)` for other APIs.
pub(super) fn walk(api: ApiKey, version: i16, body: &[u8]) -> Result<Option<usize>> {
    let flexible = match api {
        ApiKey::AddPartitionsToTxn => version >= 3,
        ApiKey::TxnOffsetCommit => version >= 3,
        _ => return Ok(None),
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
        ApiKey::AddPartitionsToTxn => {
            w.string()?; // transactional_id
            w.skip(8 + 2)?; // producer_id, producer_epoch
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(4, |w| w.skip(4))?; // partitions
                w.tags()
            })?;
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
            let fixed = 4 + 8 + if version >= 2 { 4 } else { 0 };
            w.array(s + a + t, |w| {
                w.string()?; // name
                w.array(fixed + s + t, |w| {
                    w.skip(fixed)?; // partition_index, committed_offset, leader_epoch
                    w.string()?; // committed_metadata
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        _ => return Ok(None),
    }
    w.tags()?;
    Ok(Some(w.pos))
}

/// A well-formed request body of a walked transaction API (for the guard's tests).
#[cfg(test)]
pub(super) fn sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, GroupId, ProducerId, TopicName, TransactionalId,
        TxnOffsetCommitRequest,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let st = StrBytes::from_static_str;
    let mut out = bytes::BytesMut::new();
    match api {
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(st("tx")))
            .with_v3_and_below_producer_id(ProducerId(7))
            .with_v3_and_below_producer_epoch(2)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(st("a")))
                    .with_partitions(vec![0, 1, 2]),
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(st("bb")))
                    .with_partitions(vec![]),
            ])
            .encode(&mut out, version)
            .ok()?,
        ApiKey::TxnOffsetCommit => {
            let part = |i| {
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(i)
                    .with_committed_offset(42)
                    .with_committed_leader_epoch(if version >= 2 { 3 } else { -1 })
                    .with_committed_metadata(Some(st("m")))
            };
            let mut req = TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(st("tx")))
                .with_group_id(GroupId(st("g")))
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(2)
                .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                    .with_name(TopicName(st("t")))
                    .with_partitions(vec![part(0), part(5)])]);
            if version >= 3 {
                req = req
                    .with_generation_id(4)
                    .with_member_id(st("member-1"))
                    .with_group_instance_id(None);
            }
            req.encode(&mut out, version).ok()?
        }
        _ => return None,
    }
    Some(out.to_vec())
}

#[cfg(test)]
mod tests {
    use super::super::GuardError;
    use super::*;
    use crate::handlers::api_versions::SUPPORTED;
    use bytes::BufMut;

    #[test]
    fn every_advertised_txn_api_version_is_walked_exactly() {
        for &(api, min, max) in SUPPORTED {
            if !WALKED_TXN.contains(&api) {
                continue;
            }
            for version in min..=max {
                let body = sample(api, version).expect("sample");
                assert_eq!(
                    walk(api, version, &body),
                    Ok(Some(body.len())),
                    "{api:?} v{version}"
                );
            }
        }
    }

    #[test]
    fn absurd_txn_array_counts_are_refused() {
        // AddPartitionsToTxn v0: one topic claiming a billion partitions.
        let mut body = bytes::BytesMut::new();
        body.put_i16(2);
        body.put_slice(b"tx");
        body.put_i64(7);
        body.put_i16(0);
        body.put_i32(1);
        body.put_i16(1);
        body.put_u8(b't');
        body.put_i32(1_000_000_000);
        assert!(matches!(
            walk(ApiKey::AddPartitionsToTxn, 0, &body),
            Err(GuardError::ArrayTooLong { .. })
        ));
        // TxnOffsetCommit v3 (flexible): 2^32-1 topics.
        let mut body = bytes::BytesMut::new();
        body.put_u8(3);
        body.put_slice(b"tx");
        body.put_u8(2);
        body.put_u8(b'g');
        body.put_i64(7);
        body.put_i16(0);
        body.put_i32(1);
        body.put_u8(1); // member id ""
        body.put_u8(0); // null group instance id
        body.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(
            walk(ApiKey::TxnOffsetCommit, 3, &body),
            Err(GuardError::ArrayTooLong { .. })
        ));
    }
}
