//! Populated requests of the retention and topic config APIs (DeleteRecords, AlterConfigs,
//! IncrementalAlterConfigs) for the request guard's tests.

use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::incremental_alter_configs_request as incremental;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::encoded;

fn str(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}

/// A request of `api` at `version` with every array populated, or `None` for other APIs.
pub(super) fn sample(api: ApiKey, version: i16) -> Option<Vec<u8>> {
    let b = match api {
        ApiKey::DeleteRecords => {
            let topic = |n| {
                DeleteRecordsTopic::default()
                    .with_name(TopicName(str(n)))
                    .with_partitions(vec![
                        DeleteRecordsPartition::default()
                            .with_partition_index(0)
                            .with_offset(10),
                        DeleteRecordsPartition::default()
                            .with_partition_index(3)
                            .with_offset(-1),
                    ])
            };
            encoded(
                &DeleteRecordsRequest::default()
                    .with_topics(vec![topic("a"), topic("bb")])
                    .with_timeout_ms(5000),
                version,
            )
        }
        ApiKey::AlterConfigs => encoded(
            &AlterConfigsRequest::default()
                .with_resources(vec![
                    AlterConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(str("t"))
                        .with_configs(vec![
                            AlterableConfig::default()
                                .with_name(str("retention.ms"))
                                .with_value(Some(str("1000"))),
                            AlterableConfig::default()
                                .with_name(str("x"))
                                .with_value(None),
                        ]),
                    AlterConfigsResource::default()
                        .with_resource_type(4)
                        .with_resource_name(str("0")),
                ])
                .with_validate_only(true),
            version,
        ),
        ApiKey::IncrementalAlterConfigs => encoded(
            &IncrementalAlterConfigsRequest::default()
                .with_resources(vec![incremental::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(str("t"))
                    .with_configs(vec![
                        incremental::AlterableConfig::default()
                            .with_name(str("cleanup.policy"))
                            .with_config_operation(2)
                            .with_value(Some(str("compact"))),
                        incremental::AlterableConfig::default()
                            .with_name(str("retention.ms"))
                            .with_config_operation(1)
                            .with_value(None),
                    ])])
                .with_validate_only(false),
            version,
        ),
        _ => return None,
    };
    Some(b)
}
