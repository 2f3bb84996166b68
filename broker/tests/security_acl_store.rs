//! The persisted ACL store keeps every binding exactly, whatever its fields hold: a TLS
//! principal with spaces and commas, resource names with a space or a newline. Created with
//! CreateAcls over TCP, the broker restarted on the same data directory, DescribeAcls must
//! list exactly the created bindings and nothing else.

use std::collections::BTreeSet;

use anyhow::{ensure, Result};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::{CreateAclsRequest, DescribeAclsRequest};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::config::SecurityConfig;
use onceflow_broker::storage::StorageConfig;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::RawClient;

/// (resource type, name, pattern type, principal, host, operation, permission)
type Binding = (i8, String, i8, String, String, i8, i8);

const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const TRANSACTIONAL_ID: i8 = 5;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const READ: i8 = 3;
const WRITE: i8 = 4;
const ALLOW: i8 = 3;
const DENY: i8 = 2;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn config(data: &std::path::Path) -> BrokerConfig {
    BrokerConfig {
        security: SecurityConfig {
            // The PLAINTEXT listener's clients are User:ANONYMOUS: the admin here.
            super_users: vec!["User:ANONYMOUS".into()],
            ..SecurityConfig::default()
        },
        storage: StorageConfig {
            data_dir: Some(data.to_path_buf()),
            ..StorageConfig::default()
        },
        ..BrokerConfig::default()
    }
}

fn describe_all(client: &mut RawClient) -> Result<BTreeSet<Binding>> {
    let req = DescribeAclsRequest::default()
        .with_resource_type_filter(1)
        .with_pattern_type_filter(1)
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_operation(1)
        .with_permission_type(1);
    let resp = client.request(&req, 3)?;
    ensure!(resp.error_code == 0, "DescribeAcls: {}", resp.error_code);
    let mut out = BTreeSet::new();
    for r in resp.resources {
        for a in r.acls {
            ensure!(
                out.insert((
                    r.resource_type,
                    r.resource_name.to_string(),
                    r.pattern_type,
                    a.principal.to_string(),
                    a.host.to_string(),
                    a.operation,
                    a.permission_type,
                )),
                "a binding listed twice"
            );
        }
    }
    Ok(out)
}

fn binding(resource: i8, name: &str, pattern: i8, principal: &str, op: i8, perm: i8) -> Binding {
    let (name, principal) = (name.to_string(), principal.to_string());
    (resource, name, pattern, principal, "*".into(), op, perm)
}

#[test]
fn acl_bindings_with_spaces_and_newlines_survive_a_restart_exactly() -> Result<()> {
    let data = tempfile::tempdir()?;
    let wanted: BTreeSet<Binding> = [
        binding(
            TOPIC,
            "orders",
            LITERAL,
            "User:CN=John Smith,O=Acme",
            READ,
            ALLOW,
        ),
        binding(
            GROUP,
            "etl group",
            LITERAL,
            "User:CN=John Smith,O=Acme",
            READ,
            ALLOW,
        ),
        // A newline followed by what would read as a whole binding in a line-split store.
        binding(
            TRANSACTIONAL_ID,
            "etl\nUser:mallory * All Allow Topic Literal *",
            PREFIXED,
            "User:alice",
            WRITE,
            ALLOW,
        ),
        binding(TOPIC, "100%\ttab", LITERAL, "User:50% off", READ, DENY),
    ]
    .into_iter()
    .collect();

    let broker = InProcessBroker::start(config(data.path()))?;
    let mut client = RawClient::connect(broker.addr())?;
    let creations = wanted
        .iter()
        .map(|(rt, name, pt, principal, host, op, perm)| {
            AclCreation::default()
                .with_resource_type(*rt)
                .with_resource_name(s(name))
                .with_resource_pattern_type(*pt)
                .with_principal(s(principal))
                .with_host(s(host))
                .with_operation(*op)
                .with_permission_type(*perm)
        })
        .collect();
    let created = client.request(&CreateAclsRequest::default().with_creations(creations), 3)?;
    for r in &created.results {
        ensure!(
            r.error_code == 0,
            "CreateAcls: {} {:?}",
            r.error_code,
            r.error_message
        );
    }
    let before = describe_all(&mut client)?;
    ensure!(before == wanted, "before the restart: got {before:#?}");
    drop(client);
    drop(broker);

    let broker = InProcessBroker::start(config(data.path()))?;
    let mut client = RawClient::connect(broker.addr())?;
    let after = describe_all(&mut client)?;
    ensure!(
        after == wanted,
        "after the restart:\n got {after:#?}\nwant {wanted:#?}"
    );
    Ok(())
}
