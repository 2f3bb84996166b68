//! How Produce guards transactions, driven by a raw client against the broker binary: one
//! record batch per partition (INVALID_RECORD otherwise), transactional batches only from a
//! producer id the coordinator issued to the request's transactional id with the partition in
//! its open transaction, none without a transactional id; a refused batch opens no
//! transaction, so read_committed readers keep moving.

use anyhow::{ensure, Context as _, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, BrokerId, FetchRequest, InitProducerIdRequest, ProduceRequest,
    ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{decode_values, end_txn, error_code, idempotent_batch, topic_name};
use onceflow_testkit::raw::{RawClient, Versions};

const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
const INVALID_RECORD: i16 = 87;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// One transactional RecordBatch v2 of producer `pid`/`epoch` from sequence `seq`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> Result<Bytes> {
    onceflow_testkit::raw::transactional_batch(pid, epoch, seq, values)
}

/// Two batches back to back in one partition's records field.
fn concat(a: Bytes, b: Bytes) -> Bytes {
    let mut out = BytesMut::from(&a[..]);
    out.extend_from_slice(&b);
    out.freeze()
}

struct Session {
    client: RawClient,
    produce_v: i16,
}

impl Session {
    /// Connects and creates `topic` (one partition) through Metadata.
    fn open(broker: &BrokerProcess, topic: &str) -> Result<Self> {
        let mut client = RawClient::connect(broker.addr())?;
        let versions: Versions = client.api_versions()?;
        let produce_v = versions.pick::<ProduceRequest>(9)?;
        ensure!(produce_v >= 8, "Produce v{produce_v} has no INVALID_RECORD");
        let md = client.metadata(9, &[topic])?;
        let t = md.topics.first().context("Metadata answer has no topic")?;
        ensure!(
            t.error_code == error_code::NONE,
            "Metadata {topic}: {}",
            t.error_code
        );
        Ok(Self { client, produce_v })
    }

    fn produce(
        &mut self,
        txn_id: Option<&str>,
        topic: &str,
        records: Bytes,
    ) -> Result<PartitionProduceResponse> {
        let req = ProduceRequest::default()
            .with_transactional_id(txn_id.map(|t| TransactionalId(s(t))))
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records))])]);
        let resp = self.client.request(&req, self.produce_v)?;
        resp.responses
            .into_iter()
            .flat_map(|t| t.partition_responses)
            .next()
            .context("Produce answer without a partition")
    }

    fn init_txn(&mut self, txn_id: &str) -> Result<(i64, i16)> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(txn_id))))
            .with_transaction_timeout_ms(60_000);
        let resp = self.client.request(&req, 4)?;
        ensure!(resp.error_code == 0, "InitProducerId {}", resp.error_code);
        Ok((resp.producer_id.0, resp.producer_epoch))
    }

    fn add_partition(&mut self, txn_id: &str, (pid, epoch): (i64, i16), topic: &str) -> Result<()> {
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(txn_id)))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![0])]);
        let resp = self.client.request(&req, 3)?;
        for t in resp.results_by_topic_v3_and_below {
            for p in t.results_by_partition {
                ensure!(
                    p.partition_error_code == 0,
                    "AddPartitionsToTxn {}",
                    p.partition_error_code
                );
            }
        }
        Ok(())
    }

    /// A read_committed Fetch of partition 0 from offset 0: (high watermark, last stable
    /// offset, values).
    fn fetch_committed(&mut self, topic: &str) -> Result<(i64, i64, Vec<String>)> {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_isolation_level(1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(8 << 20)
                    .with_log_start_offset(-1)
                    .with_current_leader_epoch(-1)])]);
        let resp = self.client.request(&req, 11)?;
        let p = resp
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .next()
            .context("Fetch answer without a partition")?;
        ensure!(p.error_code == 0, "Fetch error {}", p.error_code);
        let values = decode_values(p.records.unwrap_or_default())?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        Ok((p.high_watermark, p.last_stable_offset, values))
    }
}

#[test]
fn two_batches_for_one_partition_are_an_invalid_record() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let topic = "two-batches";
    let mut s = Session::open(&broker, topic)?;
    let two = concat(
        idempotent_batch(-1, -1, -1, &["a"])?,
        idempotent_batch(-1, -1, -1, &["b"])?,
    );
    let resp = s.produce(None, topic, two)?;
    ensure!(resp.error_code == INVALID_RECORD, "two batches: {resp:?}");
    let (hw, _, values) = s.fetch_committed(topic)?;
    ensure!(
        hw == 0 && values.is_empty(),
        "stored {values:?} (high watermark {hw})"
    );
    // one batch is fine
    let one = s.produce(None, topic, idempotent_batch(-1, -1, -1, &["c"])?)?;
    ensure!(one.error_code == 0, "one batch: {one:?}");
    Ok(())
}

#[test]
fn a_transactional_batch_from_an_unissued_producer_id_opens_no_transaction() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let topic = "unissued-pid";
    let mut s = Session::open(&broker, topic)?;
    let never_issued = 4242;
    let alone = s.produce(
        Some("nobody"),
        topic,
        txn_batch(never_issued, 0, 0, &["x"])?,
    )?;
    ensure!(
        alone.error_code != 0,
        "lone transactional batch accepted: {alone:?}"
    );
    // behind a plain batch, where only the first batch of a request used to be checked
    let behind = concat(
        idempotent_batch(-1, -1, -1, &["plain"])?,
        txn_batch(never_issued, 0, 0, &["hidden"])?,
    );
    let resp = s.produce(Some("nobody"), topic, behind)?;
    ensure!(
        resp.error_code != 0,
        "hidden transactional batch accepted: {resp:?}"
    );

    let after = s.produce(None, topic, idempotent_batch(-1, -1, -1, &["after"])?)?;
    ensure!(after.error_code == 0, "plain produce: {after:?}");
    let (hw, lso, values) = s.fetch_committed(topic)?;
    ensure!(
        lso == hw,
        "last stable offset {lso} stopped below high watermark {hw}"
    );
    ensure!(
        values.last().map(String::as_str) == Some("after"),
        "read_committed read {values:?}"
    );
    ensure!(
        !values.iter().any(|v| v == "hidden" || v == "x"),
        "read_committed read {values:?}"
    );
    Ok(())
}

#[test]
fn a_transactional_batch_needs_the_transactional_id_of_its_producer() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let topic = "txn-id-needed";
    let mut s = Session::open(&broker, topic)?;
    let owner = s.init_txn("owner")?;
    s.add_partition("owner", owner, topic)?;
    let (pid, epoch) = owner;

    let null_id = s.produce(None, topic, txn_batch(pid, epoch, 0, &["no-id"])?)?;
    ensure!(
        null_id.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "null transactional id: {null_id:?}"
    );
    s.init_txn("other")?;
    let other = s.produce(
        Some("other"),
        topic,
        txn_batch(pid, epoch, 0, &["other-id"])?,
    )?;
    ensure!(
        other.error_code == INVALID_PRODUCER_ID_MAPPING,
        "another transactional id: {other:?}"
    );
    let own = s.produce(Some("owner"), topic, txn_batch(pid, epoch, 0, &["own"])?)?;
    ensure!(own.error_code == 0, "own transactional id: {own:?}");
    ensure!(
        end_txn(broker.bootstrap(), "owner", pid, epoch, true)? == 0,
        "EndTxn"
    );

    let (hw, lso, values) = s.fetch_committed(topic)?;
    ensure!(lso == hw, "last stable offset {lso}, high watermark {hw}");
    ensure!(values == ["own"], "read_committed read {values:?}");
    Ok(())
}
