//! KIP-664's transaction admin APIs over TCP against transactions that rdkafka producers
//! really ran (one committed, one aborted, one left open): DescribeProducers,
//! ListTransactions and DescribeTransactions answer their real state through the raw client
//! (rust-rdkafka's admin has no such calls), and an operator finds the open transaction and
//! aborts it with WriteTxnMarkers, after which a read_committed consumer reads past it. A
//! second test makes a truly hanging transaction (its coordinator state lost with the
//! transaction log) and aborts it the same way. A third throws array-count bombs at every
//! admin API: each closes only its own connection.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::describe_transactions_response::TransactionState as Described;
use kafka_protocol::messages::list_transactions_response::TransactionState as Listed;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeTransactionsRequest, ListTransactionsRequest, ProducerId,
    TopicName, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;
use onceflow_broker::BrokerConfig;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::clients::{consumer, flush, plain_producer, send, txn_producer, T};
use onceflow_testkit::inproc::InProcessBroker;
use onceflow_testkit::raw::RawClient;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};

const TOPIC: &str = "txadm";
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_REQUEST: i16 = 42;
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn list(raw: &mut RawClient, states: &[&str], pids: &[i64], duration: i64) -> Result<Vec<Listed>> {
    let resp = raw.request(
        &ListTransactionsRequest::default()
            .with_state_filters(states.iter().map(|v| s(v)).collect())
            .with_producer_id_filters(pids.iter().map(|&p| ProducerId(p)).collect())
            .with_duration_filter(duration),
        1,
    )?;
    ensure!(
        resp.error_code == 0,
        "ListTransactions error {}",
        resp.error_code
    );
    Ok(resp.transaction_states)
}

fn listed_ids(listed: &[Listed]) -> BTreeSet<String> {
    listed
        .iter()
        .map(|t| t.transactional_id.0.to_string())
        .collect()
}

fn describe_txns(raw: &mut RawClient, ids: &[&str]) -> Result<Vec<Described>> {
    let resp = raw.request(
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(ids.iter().map(|v| TransactionalId(s(v))).collect()),
        0,
    )?;
    Ok(resp.transaction_states)
}

/// DescribeProducers of `partitions` of [`TOPIC`]: per partition (error code, producers).
fn describe_producers(
    raw: &mut RawClient,
    partitions: &[i32],
) -> Result<Vec<(i16, Vec<ProducerState>)>> {
    let resp = raw.request(
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partition_indexes(partitions.to_vec())]),
        0,
    )?;
    let topic = resp
        .topics
        .into_iter()
        .next()
        .context("no topic in answer")?;
    Ok(topic
        .partitions
        .into_iter()
        .map(|p| (p.error_code, p.active_producers))
        .collect())
}

/// WriteTxnMarkers (v1) for `producer` on `partitions` of [`TOPIC`]; the per-partition codes.
fn write_marker(
    raw: &mut RawClient,
    producer: (i64, i16, i32),
    commit: bool,
    partitions: &[i32],
) -> Result<Vec<i16>> {
    let (pid, epoch, coordinator_epoch) = producer;
    let resp = raw.request(
        &WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_transaction_result(commit)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_indexes(partitions.to_vec())])]),
        1,
    )?;
    let marker = resp
        .markers
        .into_iter()
        .next()
        .context("no marker result")?;
    ensure!(marker.producer_id.0 == pid, "answer for another producer");
    Ok(marker
        .topics
        .into_iter()
        .flat_map(|t| t.partitions.into_iter().map(|p| p.error_code))
        .collect())
}

/// Reads `parts` read_committed until every value in `until` arrived (they were written
/// after the transactions under test, so everything before them has been delivered too);
/// returns all values read. The bound only stops a hung test.
fn read_committed_until(
    bootstrap: &str,
    parts: &[(&str, i32)],
    until: &[&str],
) -> Result<Vec<String>> {
    let c: BaseConsumer = consumer(bootstrap, true, parts);
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while !until.iter().all(|u| got.iter().any(|g: &String| g == u)) {
        if Instant::now() > deadline {
            bail!("read_committed consumer stuck; read so far {got:?}");
        }
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    Ok(got)
}

/// Runs one transaction writing `value` to `partitions` of [`TOPIC`]: committed, aborted,
/// or (`None`) left open with every write acknowledged.
fn one_txn(
    bootstrap: &str,
    id: &str,
    value: &str,
    partitions: &[i32],
    commit: Option<bool>,
) -> BaseProducer {
    let p = txn_producer(bootstrap, id, 60_000);
    p.begin_transaction().expect("begin");
    for &partition in partitions {
        send(&p, TOPIC, partition, value);
    }
    flush(&p);
    match commit {
        Some(true) => p.commit_transaction(T).expect("commit"),
        Some(false) => p.abort_transaction(T).expect("abort"),
        None => {}
    }
    p
}

#[test]
fn admin_apis_describe_real_transactions_and_abort_an_open_one() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig {
        default_partitions: 2,
        ..BrokerConfig::default()
    })?;
    let bs = broker.bootstrap();
    let _committed = one_txn(&bs, "adm-committed", "committed", &[0], Some(true));
    let _aborted = one_txn(&bs, "adm-aborted", "aborted", &[0], Some(false));
    // Hanging from here on: written and acknowledged, never ended by its producer.
    let open = one_txn(&bs, "adm-open", "open", &[0, 1], None);
    let mut raw = RawClient::connect(broker.addr())?;

    // DescribeTransactions: the coordinator's view of each id.
    let described = describe_txns(
        &mut raw,
        &["adm-open", "adm-committed", "adm-aborted", "adm-none"],
    )?;
    let [d_open, d_committed, d_aborted, d_none] = &described[..] else {
        bail!("expected 4 answers, got {described:?}");
    };
    assert_eq!(d_open.error_code, 0);
    assert_eq!(d_open.transaction_state.as_str(), "Ongoing");
    assert_eq!(d_open.transaction_timeout_ms, 60_000);
    assert!(d_open.transaction_start_time_ms > 0, "{d_open:?}");
    assert_eq!(d_open.topics.len(), 1);
    assert_eq!(d_open.topics[0].topic.0.as_str(), TOPIC);
    assert_eq!(d_open.topics[0].partitions, vec![0, 1]);
    assert_eq!(d_committed.transaction_state.as_str(), "CompleteCommit");
    assert_eq!(d_aborted.transaction_state.as_str(), "CompleteAbort");
    assert!(d_committed.topics.is_empty() && d_committed.transaction_start_time_ms == -1);
    assert_eq!(d_none.error_code, TRANSACTIONAL_ID_NOT_FOUND);
    let (open_pid, open_epoch) = (d_open.producer_id.0, d_open.producer_epoch);
    let committed_pid = d_committed.producer_id.0;

    // ListTransactions: everything, by state, by producer id, by duration.
    let all = list(&mut raw, &[], &[], -1)?;
    assert_eq!(
        listed_ids(&all),
        ["adm-aborted", "adm-committed", "adm-open"]
            .map(String::from)
            .into()
    );
    let open_listed = all
        .iter()
        .find(|t| t.transactional_id.0.as_str() == "adm-open")
        .context("open listed")?;
    assert_eq!(open_listed.producer_id.0, open_pid);
    assert_eq!(open_listed.transaction_state.as_str(), "Ongoing");
    let ongoing = list(&mut raw, &["Ongoing"], &[], -1)?;
    assert_eq!(listed_ids(&ongoing), ["adm-open".to_string()].into());
    let resp = raw.request(
        &ListTransactionsRequest::default().with_state_filters(vec![s("Ongoing"), s("Bogus")]),
        1,
    )?;
    assert_eq!(resp.unknown_state_filters, vec![s("Bogus")]);
    assert_eq!(listed_ids(&resp.transaction_states), listed_ids(&ongoing));
    let by_pid = list(&mut raw, &[], &[committed_pid], -1)?;
    assert_eq!(listed_ids(&by_pid), ["adm-committed".to_string()].into());
    assert!(list(&mut raw, &[], &[], 3_600_000)?.is_empty());

    // DescribeProducers: the partitions' producer state.
    let parts = describe_producers(&mut raw, &[0, 1, 7])?;
    let [(e0, p0), (e1, p1), (e7, _)] = &parts[..] else {
        bail!("expected 3 partitions, got {parts:?}");
    };
    assert_eq!((*e0, *e1, *e7), (0, 0, UNKNOWN_TOPIC_OR_PARTITION));
    assert_eq!(p0.len(), 3, "{p0:?}");
    let on = |ps: &[ProducerState], pid: i64| ps.iter().find(|p| p.producer_id.0 == pid).cloned();
    let open0 = on(p0, open_pid).context("open producer on partition 0")?;
    // Partition 0: committed record 0, marker 1, aborted record 2, marker 3, open record 4.
    assert_eq!(open0.current_txn_start_offset, 4);
    assert_eq!(open0.producer_epoch, i32::from(open_epoch));
    assert_eq!(open0.last_sequence, 0);
    assert!(open0.last_timestamp > 0);
    let committed0 = on(p0, committed_pid).context("committed producer")?;
    assert_eq!(committed0.current_txn_start_offset, -1);
    // The coordinator epoch of the last marker (this in-memory broker's first run: 0); the
    // open producer has had no marker yet.
    assert_eq!(
        (committed0.coordinator_epoch, open0.coordinator_epoch),
        (0, -1)
    );
    let open1 = on(p1, open_pid).context("open producer on partition 1")?;
    assert_eq!((p1.len(), open1.current_txn_start_offset), (1, 0));

    // Records after the open transaction are held back from read_committed readers.
    let plain = plain_producer(&bs);
    send(&plain, TOPIC, 0, "after-0");
    send(&plain, TOPIC, 1, "after-1");
    flush(&plain);

    // The operator's abort. A COMMIT result is refused and changes nothing.
    let who = (open_pid, open_epoch, open0.coordinator_epoch);
    assert_eq!(
        write_marker(&mut raw, who, true, &[0, 1])?,
        vec![INVALID_REQUEST; 2]
    );
    assert_eq!(
        describe_txns(&mut raw, &["adm-open"])?[0]
            .transaction_state
            .as_str(),
        "Ongoing"
    );
    assert_eq!(
        write_marker(&mut raw, who, false, &[0, 1, 9])?,
        vec![0, 0, UNKNOWN_TOPIC_OR_PARTITION]
    );

    let after = describe_txns(&mut raw, &["adm-open"])?;
    assert_eq!(after[0].transaction_state.as_str(), "CompleteAbort");
    assert_eq!(
        after[0].producer_epoch,
        open_epoch + 1,
        "the open producer is fenced"
    );
    assert!(list(&mut raw, &["Ongoing"], &[], -1)?.is_empty());
    for (_, producers) in describe_producers(&mut raw, &[0, 1])? {
        let p = on(&producers, open_pid).context("open producer still known")?;
        assert_eq!(p.current_txn_start_offset, -1);
    }
    // A second abort finds nothing open: success, nothing written.
    assert_eq!(write_marker(&mut raw, who, false, &[0])?, vec![0]);

    let read = read_committed_until(&bs, &[(TOPIC, 0), (TOPIC, 1)], &["after-0", "after-1"])?;
    let mut read_sorted = read.clone();
    read_sorted.sort();
    assert_eq!(
        read_sorted,
        vec!["after-0", "after-1", "committed"],
        "{read:?}"
    );
    // The fenced producer cannot end the transaction the operator aborted.
    assert!(open.commit_transaction(T).is_err());
    Ok(())
}

#[test]
fn hanging_transaction_unknown_to_the_coordinator_is_aborted_by_marker() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut broker = BrokerProcess::spawn(
        Storage::Durable {
            dir: dir.path().to_path_buf(),
            fsync: "every-batch".into(),
        },
        &["--default-partitions", "1"],
    )?;
    let bs = broker.bootstrap();
    let kept = one_txn(bs, "kept", "kept-committed", &[0], Some(true));
    let open = one_txn(bs, "lost", "lost-open", &[0], None);
    let mut raw = RawClient::connect(broker.addr())?;
    let d = describe_txns(&mut raw, &["lost"])?;
    let (pid, epoch) = (d[0].producer_id.0, d[0].producer_epoch);
    drop(raw);

    // The coordinator's log is lost: the partition keeps an open transaction nobody will end.
    broker.kill9()?;
    drop(open);
    drop(kept);
    let log = dir
        .path()
        .join("__transaction_state")
        .join("transactions.log");
    std::fs::remove_file(&log).with_context(|| format!("remove {}", log.display()))?;
    broker.restart()?;
    let bs = broker.bootstrap();
    let mut raw = RawClient::connect(broker.addr())?;
    assert!(list(&mut raw, &[], &[], -1)?.is_empty());
    assert_eq!(
        describe_txns(&mut raw, &["lost"])?[0].error_code,
        TRANSACTIONAL_ID_NOT_FOUND
    );

    // Found by DescribeProducers: a producer with an open transaction on the partition.
    let parts = describe_producers(&mut raw, &[0])?;
    let hanging: Vec<&ProducerState> = parts[0]
        .1
        .iter()
        .filter(|p| p.current_txn_start_offset >= 0)
        .collect();
    let [h] = &hanging[..] else {
        bail!("expected one hanging producer, got {parts:?}");
    };
    assert_eq!((h.producer_id.0, h.producer_epoch), (pid, i32::from(epoch)));
    // The committed producer's marker epoch is recovered from the log.
    let committed: Vec<i32> = parts[0]
        .1
        .iter()
        .filter(|p| p.producer_id.0 != pid)
        .map(|p| p.coordinator_epoch)
        .collect();
    assert_eq!(committed, vec![0], "{parts:?}");

    let plain = plain_producer(bs);
    send(&plain, TOPIC, 0, "after-lost");
    flush(&plain);
    // An older epoch than the partition's is refused; the producer's own epoch aborts.
    let stale = (pid, epoch - 1, h.coordinator_epoch);
    if epoch > 0 {
        assert_eq!(write_marker(&mut raw, stale, false, &[0])?, vec![47]);
    }
    let who = (pid, epoch, h.coordinator_epoch);
    assert_eq!(write_marker(&mut raw, who, false, &[0])?, vec![0]);
    let parts = describe_producers(&mut raw, &[0])?;
    assert!(
        parts[0].1.iter().all(|p| p.current_txn_start_offset == -1),
        "{parts:?}"
    );

    let read = read_committed_until(bs, &[(TOPIC, 0)], &["after-lost"])?;
    assert_eq!(read, vec!["kept-committed", "after-lost"]);
    Ok(())
}

/// A request frame with a hand-written header (v2 with an empty tag section when
/// `flexible`) and `body`.
fn hand_frame(api_key: i16, version: i16, flexible: bool, body: &[u8]) -> BytesMut {
    let mut inner = BytesMut::new();
    inner.put_i16(api_key);
    inner.put_i16(version);
    inner.put_i32(7);
    inner.put_i16(4);
    inner.put_slice(b"bomb");
    if flexible {
        inner.put_u8(0);
    }
    inner.put_slice(body);
    let mut frame = BytesMut::new();
    frame.put_i32(inner.len() as i32);
    frame.put_slice(&inner);
    frame
}

#[test]
fn admin_request_bombs_close_only_their_connection() -> Result<()> {
    let broker = InProcessBroker::start(BrokerConfig::default())?;
    let compact_bomb: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f];
    let bombs: [(&str, i16, i16, bool, Vec<u8>); 5] = [
        (
            "CreatePartitions",
            37,
            1,
            false,
            i32::MAX.to_be_bytes().to_vec(),
        ),
        ("DescribeProducers", 61, 0, true, compact_bomb.to_vec()),
        ("DescribeTransactions", 65, 0, true, compact_bomb.to_vec()),
        ("ListTransactions", 66, 1, true, compact_bomb.to_vec()),
        ("WriteTxnMarkers", 27, 1, true, compact_bomb.to_vec()),
    ];
    let mut healthy = RawClient::connect(broker.addr())?;
    for (name, key, version, flexible, body) in bombs {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(key, version, flexible, &body))?;
        ensure!(
            c.closed_within(Duration::from_secs(10)),
            "{name}: a bomb left the connection open"
        );
        // Another connection, opened before the bomb, is still served.
        let versions = healthy.api_versions()?;
        ensure!(versions.0.contains_key(&key), "{name} not advertised");
    }
    ensure!(list(&mut healthy, &[], &[], -1)?.is_empty());
    Ok(())
}
