//! Bad input thrown at the broker's listener: random bytes, truncated frames, huge and negative
//! length prefixes, a frame over `--max-request-bytes`, valid headers with garbage bodies, an
//! unknown API key, unsupported versions (ApiVersions v99 must answer UNSUPPORTED_VERSION with
//! the supported ranges in a v0 body, KIP-511), an array-length bomb, and bit-flipped requests.
//! The broker must never die, must answer or close each bad connection, and a normal rdkafka
//! client in the same test must still produce and consume afterwards.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{
    CreateTopicsRequest, FetchRequest, ListOffsetsRequest, ProduceRequest,
};
use kafka_protocol::protocol::Decodable;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{
    error_code, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, RawClient,
};
use onceflow_testkit::records::{produce_acked, read_all, TestRecord};
use rand::Rng;

/// How long the broker may take to answer or close a bad connection.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(5);

/// A request frame with a hand-written header (v1, or v2 when `flexible`), any API key/version.
fn hand_frame(
    api_key: i16,
    version: i16,
    correlation_id: i32,
    flexible: bool,
    body: &[u8],
) -> BytesMut {
    let mut inner = BytesMut::new();
    inner.put_i16(api_key);
    inner.put_i16(version);
    inner.put_i32(correlation_id);
    let client_id = b"bad-input";
    inner.put_i16(client_id.len() as i16);
    inner.put_slice(client_id);
    if flexible {
        inner.put_u8(0); // no tagged fields
    }
    inner.put_slice(body);
    let mut frame = BytesMut::with_capacity(inner.len() + 4);
    frame.put_i32(inner.len() as i32);
    frame.put_slice(&inner);
    frame
}

/// What the broker did with a bad request.
#[derive(Debug)]
enum Verdict {
    Answered(Bytes),
    Closed,
}

/// Waits for an answer frame (whose correlation id must match) or a close; fails on silence.
fn answer_or_close(client: &mut RawClient, correlation_id: i32, what: &str) -> Result<Verdict> {
    client.set_read_timeout(VERDICT_TIMEOUT)?;
    match client.read_frame() {
        Ok(mut frame) => {
            ensure!(
                frame.len() >= 4,
                "{what}: answer frame of {} bytes",
                frame.len()
            );
            let got = frame.get_i32();
            ensure!(
                got == correlation_id,
                "{what}: answer carries correlation id {got}, expected {correlation_id}"
            );
            Ok(Verdict::Answered(frame))
        }
        Err(e) => {
            let timed_out = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                    matches!(
                        io.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                })
            });
            if timed_out {
                bail!("{what}: the broker neither answered nor closed the connection within {VERDICT_TIMEOUT:?}");
            }
            Ok(Verdict::Closed)
        }
    }
}

/// The broker process is alive and a fresh connection gets an ApiVersions answer.
fn still_serving(broker: &mut BrokerProcess, after: &str) -> Result<()> {
    ensure!(
        broker.is_alive(),
        "the broker died after {after}; log:\n{}",
        broker.log_tail(4000)
    );
    let mut c = match RawClient::connect(broker.addr()) {
        Ok(c) => c,
        Err(e) => bail!(
            "cannot connect after {after} ({e:#}): the broker died; log:\n{}",
            broker.log_tail(4000)
        ),
    };
    c.api_versions()
        .with_context(|| format!("ApiVersions after {after}; log:\n{}", broker.log_tail(4000)))?;
    Ok(())
}

fn metadata_frame(client: &mut RawClient) -> Result<BytesMut> {
    let req = MetadataRequest::default()
        .with_topics(None)
        .with_allow_auto_topic_creation(false);
    Ok(client.encode_frame(&req, 4)?.1)
}

#[test]
fn ill_formed_frames_never_stop_the_broker() -> Result<()> {
    let mut broker = BrokerProcess::spawn(Storage::InMemory, &["--max-request-bytes", "1048576"])?;
    let mut rng = rand::rng();

    // A slow client that never finishes its frame stays connected through the whole test.
    let mut slow = RawClient::connect(broker.addr())?;
    slow.send_bytes(&[0, 0, 0, 100, 0, 18, 0])?;

    // Random bytes, then close.
    for _ in 0..30 {
        let len = rng.random_range(1..4096);
        let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let mut c = RawClient::connect(broker.addr())?;
        let _ = c.send_bytes(&junk);
    }
    // Random bytes behind a consistent small length prefix, waiting for the verdict.
    for i in 0..30 {
        let len = rng.random_range(0..300);
        let mut frame = BytesMut::new();
        frame.put_i32(len);
        frame.extend((0..len).map(|_| rng.random::<u8>()));
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&frame)?;
        c.set_read_timeout(Duration::from_millis(500))?;
        // Header and correlation id are random, so any verdict is acceptable here (an answer,
        // a close, or silence while a random length field waits for more bytes); what matters
        // is the liveness check that follows.
        let _ = c.read_frame();
        still_serving(&mut broker, &format!("random framed bytes #{i}"))?;
    }
    still_serving(&mut broker, "random bytes")?;

    // Truncated frames: a valid Metadata request cut short, then the connection closed.
    let mut probe = RawClient::connect(broker.addr())?;
    let full = metadata_frame(&mut probe)?;
    for cut in [1, 2, 3, 4, 5, 8, 12, full.len() / 2, full.len() - 1] {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&full[..cut])?;
    }
    // A frame whose length prefix promises more than is sent: truncated mid-body.
    {
        let mut c = RawClient::connect(broker.addr())?;
        let mut f = BytesMut::new();
        f.put_i32(full.len() as i32 + 50);
        f.put_slice(&full[4..]);
        c.send_bytes(&f)?;
    }
    still_serving(&mut broker, "truncated frames")?;

    // Length prefixes: huge, negative, over --max-request-bytes, zero.
    for (what, len) in [
        ("i32::MAX length", i32::MAX),
        ("negative length", -5),
        ("2 MiB > --max-request-bytes 1 MiB", 2 << 20),
    ] {
        let mut c = RawClient::connect(broker.addr())?;
        let mut f = BytesMut::new();
        f.put_i32(len);
        f.put_slice(&[0, 3, 0, 1, 0, 0, 0, 7]);
        c.send_bytes(&f)?;
        ensure!(
            c.closed_within(VERDICT_TIMEOUT),
            "{what}: the connection was not closed"
        );
        still_serving(&mut broker, what)?;
    }
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&0i32.to_be_bytes())?;
        c.set_read_timeout(VERDICT_TIMEOUT)?;
        ensure!(
            c.read_frame().is_err(),
            "a zero-length frame got an answer frame"
        );
        still_serving(&mut broker, "zero-length frame")?;
    }
    // A frame too short to hold a request header.
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&[0, 0, 0, 3, 0, 18, 0])?;
        ensure!(
            c.closed_within(VERDICT_TIMEOUT),
            "a 3-byte frame did not close the connection"
        );
        still_serving(&mut broker, "3-byte frame")?;
    }

    // Valid headers with garbage bodies, for each API the broker serves.
    for (api, version, flexible) in [
        (0i16, 7i16, false),
        (1, 11, false),
        (2, 5, false),
        (3, 9, true),
        (19, 5, true),
        (22, 1, false),
    ] {
        let body: Vec<u8> = (0..rng.random_range(1..200))
            .map(|_| rng.random())
            .collect();
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(api, version, 4242, flexible, &body))?;
        let verdict = answer_or_close(
            &mut c,
            4242,
            &format!("api {api} v{version} with a garbage body"),
        )?;
        eprintln!("api {api} v{version} garbage body: {verdict:?}");
        still_serving(&mut broker, &format!("api {api} v{version} garbage body"))?;
    }

    // An unknown API key.
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(9_999, 0, 77, false, &[]))?;
        answer_or_close(&mut c, 77, "unknown API key 9999")?;
        still_serving(&mut broker, "unknown API key")?;
    }
    // An unsupported version of an API other than ApiVersions: error or close.
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(3, 99, 78, true, &[0, 0, 0]))?;
        answer_or_close(&mut c, 78, "Metadata v99")?;
        still_serving(&mut broker, "Metadata v99")?;
    }

    // With the slow client still connected, a normal rdkafka client produces and consumes.
    rdkafka_round_trip(&broker, "after-bad-input")?;
    ensure!(
        broker.is_alive(),
        "the broker died; log:\n{}",
        broker.log_tail(4000)
    );
    drop(slow);
    Ok(())
}

#[test]
fn api_versions_v99_answers_unsupported_version_in_a_v0_body() -> Result<()> {
    let mut broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut c = RawClient::connect(broker.addr())?;
    // What a future client sends: a flexible (v2) header and a body the broker cannot parse.
    c.send_bytes(&hand_frame(
        18,
        99,
        31337,
        true,
        &[5, b'f', b'u', b't', b'u', 3, b'9', b'9', 0, 0],
    ))?;
    let Verdict::Answered(mut body) = answer_or_close(&mut c, 31337, "ApiVersions v99")? else {
        bail!("ApiVersions v99: the broker closed the connection instead of answering (KIP-511)");
    };
    let resp = ApiVersionsResponse::decode(&mut body, 0)
        .context("decode the answer as an ApiVersions v0 body")?;
    ensure!(
        !body.has_remaining(),
        "{} trailing bytes after the v0 body",
        body.remaining()
    );
    ensure!(
        resp.error_code == error_code::UNSUPPORTED_VERSION,
        "error code {} instead of 35",
        resp.error_code
    );
    let range = |key: i16| {
        resp.api_keys
            .iter()
            .find(|k| k.api_key == key)
            .map(|k| (k.min_version, k.max_version))
    };
    let (min, max) = range(18).context("the v0 body does not list ApiVersions (18)")?;
    ensure!(min == 0 && max >= 3, "ApiVersions range {min}..={max}");
    for key in [0i16, 1, 2, 3, 22] {
        ensure!(
            range(key).is_some(),
            "the v0 body does not list API key {key}: {:?}",
            resp.api_keys
        );
    }
    // The connection stays usable: the client falls back to a supported version.
    let resp = c
        .request(&ApiVersionsRequest::default(), 0)
        .context("ApiVersions v0 after v99")?;
    ensure!(
        resp.error_code == error_code::NONE,
        "ApiVersions v0 error {}",
        resp.error_code
    );
    still_serving(&mut broker, "ApiVersions v99")?;
    Ok(())
}

#[test]
fn bit_flipped_requests_are_answered_or_closed() -> Result<()> {
    let mut broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let topic = "flip";
    let mut setup = RawClient::connect(broker.addr())?;
    setup.metadata(4, &[topic])?;
    let batch = onceflow_testkit::raw::idempotent_batch(-1, -1, -1, &["x", "y", "z"])?;
    let mut seeds: Vec<BytesMut> = Vec::new();
    seeds.push(metadata_frame(&mut setup)?);
    let produce = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(1000)
        .with_topic_data(vec![
            kafka_protocol::messages::produce_request::TopicProduceData::default()
                .with_name(onceflow_testkit::raw::topic_name(topic))
                .with_partition_data(vec![
                    kafka_protocol::messages::produce_request::PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch)),
                ]),
        ]);
    seeds.push(setup.encode_frame(&produce, 7)?.1);
    seeds.push(setup.encode_frame(&produce, 9)?.1);
    let fetch = FetchRequest::default()
        .with_max_wait_ms(10)
        .with_topics(vec![
            kafka_protocol::messages::fetch_request::FetchTopic::default()
                .with_topic(onceflow_testkit::raw::topic_name(topic))
                .with_partitions(vec![
                    kafka_protocol::messages::fetch_request::FetchPartition::default()
                        .with_partition(0)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    seeds.push(setup.encode_frame(&fetch, 11)?.1);
    seeds.push(setup.encode_frame(&ListOffsetsRequest::default(), 5)?.1);
    let mut rng = rand::rng();
    let mut answered = 0;
    let mut closed = 0;
    for i in 0..200 {
        let mut frame = seeds[i % seeds.len()].clone();
        // Keep the length prefix and the api key/version (the first 8 bytes); flip body bits.
        for _ in 0..rng.random_range(1..6) {
            let at = rng.random_range(8..frame.len());
            frame[at] ^= 1 << rng.random_range(0..8);
        }
        let mut c = match RawClient::connect(broker.addr()) {
            Ok(c) => c,
            Err(e) => bail!(
                "cannot connect before flipped frame #{i} ({e:#}): the broker died; log:\n{}",
                broker.log_tail(4000)
            ),
        };
        c.send_bytes(&frame)?;
        c.set_read_timeout(VERDICT_TIMEOUT)?;
        match c.read_frame() {
            Ok(_) => answered += 1,
            Err(_) => closed += 1,
        }
        ensure!(
            broker.is_alive(),
            "the broker died on flipped frame #{i} {:02x?}; log:\n{}",
            &frame[..],
            broker.log_tail(4000)
        );
    }
    eprintln!("bit flips: {answered} answered, {closed} closed or silent");
    still_serving(&mut broker, "bit-flipped requests")?;
    rdkafka_round_trip(&broker, "after-bit-flips")?;
    Ok(())
}

#[test]
fn missing_topic_or_partition_gets_unknown_topic_or_partition() -> Result<()> {
    let broker = BrokerProcess::spawn(Storage::InMemory, &["--no-auto-create-topics"])?;
    let mut c = RawClient::connect(broker.addr())?;
    let versions = c.api_versions()?;
    let (produce_v, fetch_v) = (
        versions.pick::<ProduceRequest>(10)?,
        versions.pick::<FetchRequest>(12)?,
    );
    let create_v = versions.pick::<CreateTopicsRequest>(5)?;
    let md = c.metadata(4, &["nope"])?;
    let t = md.topics.first().context("no topic in answer")?;
    ensure!(
        t.error_code == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Metadata for a missing topic: error {}",
        t.error_code
    );

    let batch = onceflow_testkit::raw::idempotent_batch(-1, -1, -1, &["v"])?;
    let p = c.produce(produce_v, "nope", 0, batch.clone())?;
    ensure!(
        p.error_code == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Produce to a missing topic: error {}",
        p.error_code
    );
    let (err, _, _) = c.fetch(fetch_v, "nope", 0, 0)?;
    ensure!(
        err == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Fetch from a missing topic: error {err}"
    );

    let create = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(onceflow_testkit::raw::topic_name("one-partition"))
            .with_num_partitions(1)
            .with_replication_factor(3)]);
    let created = c.request(&create, create_v)?;
    let ct = created
        .topics
        .first()
        .context("CreateTopics answer without topics")?;
    ensure!(
        ct.error_code == error_code::NONE,
        "CreateTopics (replication factor 3 on one node): error {}",
        ct.error_code
    );

    let p = c.produce(produce_v, "one-partition", 7, batch.clone())?;
    ensure!(
        p.error_code == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Produce to partition 7 of 1: error {}",
        p.error_code
    );
    let (err, _, _) = c.fetch(fetch_v, "one-partition", 7, 0)?;
    ensure!(
        err == error_code::UNKNOWN_TOPIC_OR_PARTITION,
        "Fetch from partition 7 of 1: error {err}"
    );
    let p = c.produce(produce_v, "one-partition", 0, batch)?;
    ensure!(
        p.error_code == error_code::NONE && p.base_offset == 0,
        "Produce to partition 0: {p:?}"
    );
    let (err, _, _) = c.fetch(fetch_v, "one-partition", 0, 5)?;
    ensure!(
        err == error_code::OFFSET_OUT_OF_RANGE,
        "Fetch past the end: error {err}, expected 1"
    );
    Ok(())
}

/// Produces 200 records with rdkafka and reads them back, checking each.
fn rdkafka_round_trip(broker: &BrokerProcess, topic: &str) -> Result<()> {
    let records: Vec<TestRecord> = (0..200).map(|i| TestRecord::numbered(0, i, 64)).collect();
    let offsets = produce_acked(broker.bootstrap(), topic, &records)
        .context("rdkafka produce after bad input")?;
    ensure!(
        offsets.iter().enumerate().all(|(i, &o)| o == (0, i as i64)),
        "offsets {:?}",
        &offsets[..5]
    );
    let read = read_all(broker.bootstrap(), topic, 1, Duration::from_secs(30))
        .context("rdkafka consume after bad input")?;
    ensure!(
        read.len() == records.len(),
        "read {} of {} records",
        read.len(),
        records.len()
    );
    for (r, expected) in read.iter().zip(&records) {
        ensure!(r.matches(expected), "read {r:?}, expected {expected:?}");
    }
    Ok(())
}

/// Regression: kafka-protocol's array decoder calls `Vec::with_capacity(count)` with the count
/// read from the wire, so a 4-byte count of 2^31-1 makes the allocator abort the whole process
/// ("memory allocation of N bytes failed"), which no `catch_unwind` can stop.
#[test]
fn array_length_bombs_do_not_abort_the_broker() -> Result<()> {
    let mut broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    // An array-length bomb: Metadata v1 whose topics array claims i32::MAX entries.
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(3, 1, 79, false, &i32::MAX.to_be_bytes()))?;
        answer_or_close(&mut c, 79, "array-length bomb").ok();
        still_serving(
            &mut broker,
            "a Metadata request whose topics array claims 2^31-1 entries",
        )?;
    }
    // The same with a compact (flexible) array: unsigned varint 0xffffffff.
    {
        let mut c = RawClient::connect(broker.addr())?;
        c.send_bytes(&hand_frame(3, 9, 80, true, &[0xff, 0xff, 0xff, 0xff, 0x0f]))?;
        answer_or_close(&mut c, 80, "compact array-length bomb").ok();
        still_serving(
            &mut broker,
            "a Metadata v9 request whose compact topics array claims 2^32-2 entries",
        )?;
    }

    rdkafka_round_trip(&broker, "after-array-bombs")?;
    Ok(())
}

#[test]
fn pipelined_requests_are_answered_in_order_before_a_bad_frame_closes() -> Result<()> {
    let mut broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut c = RawClient::connect(broker.addr())?;
    // Five requests of different APIs in one write, then a frame with an unknown API key.
    let mut burst = BytesMut::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        let (id, frame) = if i % 2 == 0 {
            c.encode_frame(&ApiVersionsRequest::default(), 0)?
        } else {
            c.encode_frame(
                &MetadataRequest::default()
                    .with_topics(None)
                    .with_allow_auto_topic_creation(false),
                4,
            )?
        };
        ids.push(id);
        burst.extend_from_slice(&frame);
    }
    burst.extend_from_slice(&hand_frame(9_999, 0, 999, false, &[]));
    c.send_bytes(&burst)?;
    for id in ids {
        let mut frame = c
            .read_frame()
            .with_context(|| format!("answer to pipelined request {id}"))?;
        let got = frame.get_i32();
        ensure!(
            got == id,
            "pipelined answers out of order: got correlation id {got}, expected {id}"
        );
    }
    answer_or_close(&mut c, 999, "unknown API key after a pipelined burst")?;
    still_serving(&mut broker, "a pipelined burst ending in a bad frame")?;
    Ok(())
}

#[test]
fn produce_with_acks_0_gets_no_answer() -> Result<()> {
    // Kafka sends no response to a Produce request with acks=0; a broker that answers anyway
    // desynchronises clients that pipeline the next request behind it.
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut c = RawClient::connect(broker.addr())?;
    let versions = c.api_versions()?;
    let produce_v = versions.pick::<ProduceRequest>(9)?;
    c.metadata(4, &["acks0"])?;
    let produce = ProduceRequest::default()
        .with_acks(0)
        .with_timeout_ms(1000)
        .with_topic_data(vec![
            kafka_protocol::messages::produce_request::TopicProduceData::default()
                .with_name(onceflow_testkit::raw::topic_name("acks0"))
                .with_partition_data(vec![
                    kafka_protocol::messages::produce_request::PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(onceflow_testkit::raw::idempotent_batch(
                            -1,
                            -1,
                            -1,
                            &["fire", "forget"],
                        )?)),
                ]),
        ]);
    let (_, frame) = c.encode_frame(&produce, produce_v)?;
    c.send_bytes(&frame)?;
    // The next answer on the connection must be the one to the next request.
    let resp = c
        .request(&ApiVersionsRequest::default(), 0)
        .context("ApiVersions after an acks=0 Produce")?;
    ensure!(
        resp.error_code == error_code::NONE,
        "ApiVersions error {}",
        resp.error_code
    );
    // And the records were written.
    let fetch_v = versions.pick::<FetchRequest>(12)?;
    let (err, hw, bytes) = c.fetch(fetch_v, "acks0", 0, 0)?;
    ensure!(
        err == error_code::NONE && hw == 2,
        "Fetch after acks=0: error {err}, high watermark {hw}"
    );
    let values: Vec<String> = onceflow_testkit::raw::decode_values(bytes)?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    ensure!(
        values == ["fire", "forget"],
        "acks=0 records read back as {values:?}"
    );
    Ok(())
}
