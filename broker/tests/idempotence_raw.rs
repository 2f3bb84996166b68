//! The idempotent producer checks, driven byte-exactly by a raw client (kafka-protocol encoders
//! over a `TcpStream`) against the broker binary: a resent batch with the same producer id,
//! epoch and sequence gets its original base offset (or DUPLICATE_SEQUENCE_NUMBER) and is stored
//! once; a sequence gap gets OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch gets
//! INVALID_PRODUCER_EPOCH; and the producer state survives kill -9 and restart.

use anyhow::{ensure, Context as _, Result};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::raw::{
    decode_values, error_code, idempotent_batch, FetchRequest, InitProducerIdRequest,
    MetadataRequest, ProduceRequest, RawClient, Versions,
};

struct Session {
    client: RawClient,
    produce_v: i16,
    fetch_v: i16,
    init_v: i16,
}

impl Session {
    fn open(broker: &BrokerProcess, topic: &str) -> Result<Self> {
        let mut client = RawClient::connect(broker.addr())?;
        let versions: Versions = client.api_versions()?;
        let produce_v = versions.pick::<ProduceRequest>(10)?;
        let fetch_v = versions.pick::<FetchRequest>(12)?;
        let init_v = versions.pick::<InitProducerIdRequest>(4)?;
        let metadata_v = versions.pick::<MetadataRequest>(12)?;
        ensure!(
            metadata_v >= 4,
            "Metadata v{metadata_v} cannot ask for auto-creation"
        );
        let md = client.metadata(metadata_v, &[topic])?;
        let t = md.topics.first().context("Metadata answer has no topic")?;
        ensure!(
            t.error_code == error_code::NONE,
            "Metadata for {topic}: error {}",
            t.error_code
        );
        Ok(Self {
            client,
            produce_v,
            fetch_v,
            init_v,
        })
    }

    fn produce(
        &mut self,
        topic: &str,
        pid: i64,
        epoch: i16,
        seq: i32,
        values: &[&str],
    ) -> Result<PartitionProduceResponse> {
        let batch = idempotent_batch(pid, epoch, seq, values)?;
        self.client.produce(self.produce_v, topic, 0, batch)
    }

    fn values(&mut self, topic: &str) -> Result<Vec<(i64, String)>> {
        let (err, hw, bytes) = self.client.fetch(self.fetch_v, topic, 0, 0)?;
        ensure!(err == error_code::NONE, "Fetch error {err}");
        let values = decode_values(bytes)?;
        ensure!(
            values.len() as i64 == hw,
            "fetched {} records, high watermark {hw}",
            values.len()
        );
        Ok(values)
    }
}

/// The answer to a resent batch: success with the original base offset, or
/// DUPLICATE_SEQUENCE_NUMBER (which librdkafka also treats as success).
fn assert_duplicate_answer(
    resp: &PartitionProduceResponse,
    original_base: i64,
    what: &str,
) -> Result<()> {
    match resp.error_code {
        error_code::NONE => ensure!(
            resp.base_offset == original_base,
            "{what}: resend answered base offset {}, the original was {original_base}",
            resp.base_offset
        ),
        error_code::DUPLICATE_SEQUENCE_NUMBER => {}
        other => anyhow::bail!("{what}: resend answered error {other}, expected 0 or 46"),
    }
    Ok(())
}

fn expect_error(resp: &PartitionProduceResponse, code: i16, what: &str) -> Result<()> {
    ensure!(
        resp.error_code == code,
        "{what}: expected error {code}, got {} (base offset {})",
        resp.error_code,
        resp.base_offset
    );
    Ok(())
}

#[test]
fn resent_batch_gets_original_offset_and_is_stored_once() -> Result<()> {
    let topic = "idem-raw";
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut s = Session::open(&broker, topic)?;
    let (pid, epoch) = s.client.init_producer_id(s.init_v)?;
    ensure!(
        pid >= 0 && epoch >= 0,
        "InitProducerId gave producer id {pid} epoch {epoch}"
    );

    // A non-idempotent batch first so the idempotent one does not start at offset 0.
    let plain = s.client.produce(
        s.produce_v,
        topic,
        0,
        idempotent_batch(-1, -1, -1, &["plain"])?,
    )?;
    expect_error(&plain, error_code::NONE, "non-idempotent batch")?;
    ensure!(
        plain.base_offset == 0,
        "first batch at offset {}",
        plain.base_offset
    );

    let a = s.produce(topic, pid, epoch, 0, &["a0", "a1", "a2", "a3", "a4"])?;
    expect_error(&a, error_code::NONE, "batch A")?;
    ensure!(a.base_offset == 1, "batch A base offset {}", a.base_offset);

    let again = s.produce(topic, pid, epoch, 0, &["a0", "a1", "a2", "a3", "a4"])?;
    assert_duplicate_answer(&again, 1, "immediate resend of A")?;

    let b = s.produce(topic, pid, epoch, 5, &["b5", "b6", "b7"])?;
    expect_error(&b, error_code::NONE, "batch B")?;
    ensure!(b.base_offset == 6, "batch B base offset {}", b.base_offset);

    // A is no longer the last batch but is among the last five: still a duplicate.
    let late = s.produce(topic, pid, epoch, 0, &["a0", "a1", "a2", "a3", "a4"])?;
    assert_duplicate_answer(&late, 1, "late resend of A")?;
    let late_b = s.produce(topic, pid, epoch, 5, &["b5", "b6", "b7"])?;
    assert_duplicate_answer(&late_b, 6, "resend of B")?;

    // A gap (next expected sequence is 8) is refused and stores nothing.
    let gap = s.produce(topic, pid, epoch, 20, &["gap"])?;
    expect_error(
        &gap,
        error_code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        "sequence gap",
    )?;

    let c = s.produce(topic, pid, epoch, 8, &["c8"])?;
    expect_error(&c, error_code::NONE, "batch C after the refused gap")?;
    ensure!(c.base_offset == 9, "batch C base offset {}", c.base_offset);

    let values = s.values(topic)?;
    let expected: Vec<(i64, String)> = [
        "plain", "a0", "a1", "a2", "a3", "a4", "b5", "b6", "b7", "c8",
    ]
    .iter()
    .enumerate()
    .map(|(i, v)| (i as i64, v.to_string()))
    .collect();
    ensure!(
        values == expected,
        "log holds {values:?}, expected {expected:?}"
    );
    Ok(())
}

#[test]
fn older_epoch_is_refused() -> Result<()> {
    let topic = "idem-epoch";
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;
    let mut s = Session::open(&broker, topic)?;
    let (pid, epoch) = s.client.init_producer_id(s.init_v)?;
    let first = s.produce(topic, pid, epoch, 0, &["e0-0", "e0-1"])?;
    expect_error(&first, error_code::NONE, "batch at the first epoch")?;

    // A newer epoch of the same producer id starts over at sequence 0 (what an epoch bump does).
    let newer = s.produce(topic, pid, epoch + 1, 0, &["e1-0"])?;
    expect_error(&newer, error_code::NONE, "first batch of the newer epoch")?;
    ensure!(
        newer.base_offset == 2,
        "newer epoch batch at {}",
        newer.base_offset
    );

    // The old epoch is fenced now, whatever its sequence.
    let stale = s.produce(topic, pid, epoch, 2, &["stale"])?;
    ensure!(
        matches!(
            stale.error_code,
            error_code::INVALID_PRODUCER_EPOCH | error_code::PRODUCER_FENCED
        ),
        "older epoch: expected INVALID_PRODUCER_EPOCH (47), got {}",
        stale.error_code
    );
    let values = s.values(topic)?;
    let got: Vec<&str> = values.iter().map(|(_, v)| v.as_str()).collect();
    ensure!(got == ["e0-0", "e0-1", "e1-0"], "log holds {got:?}");
    Ok(())
}

#[test]
fn producer_state_survives_kill_9() -> Result<()> {
    let topic = "idem-restart";
    let data = tempfile::tempdir()?;
    let storage = Storage::Durable {
        dir: data.path().to_path_buf(),
        fsync: "every-batch".into(),
    };
    let mut broker = BrokerProcess::spawn(storage, &[])?;
    let (pid, epoch) = {
        let mut s = Session::open(&broker, topic)?;
        let (pid, epoch) = s.client.init_producer_id(s.init_v)?;
        let a = s.produce(topic, pid, epoch, 0, &["a0", "a1"])?;
        expect_error(&a, error_code::NONE, "batch A")?;
        let b = s.produce(topic, pid, epoch, 2, &["b2", "b3", "b4"])?;
        expect_error(&b, error_code::NONE, "batch B")?;
        ensure!(
            (a.base_offset, b.base_offset) == (0, 2),
            "offsets {} {}",
            a.base_offset,
            b.base_offset
        );
        (pid, epoch)
    };
    broker.kill9()?;
    broker.restart()?;

    let mut s = Session::open(&broker, topic)?;
    // The producer did not see B's answer before the crash and resends it: stored once.
    let b_again = s.produce(topic, pid, epoch, 2, &["b2", "b3", "b4"])?;
    assert_duplicate_answer(&b_again, 2, "resend of B after restart")
        .with_context(|| format!("broker log:\n{}", broker.log_tail(3000)))?;
    let gap = s.produce(topic, pid, epoch, 9, &["gap"])?;
    expect_error(
        &gap,
        error_code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        "gap after restart",
    )?;
    let c = s.produce(topic, pid, epoch, 5, &["c5"])?;
    expect_error(&c, error_code::NONE, "next batch after restart")?;
    ensure!(c.base_offset == 5, "C at {}", c.base_offset);

    // A new producer id from the restarted broker must not collide with the old one.
    let (pid2, _) = s.client.init_producer_id(s.init_v)?;
    ensure!(
        pid2 != pid,
        "InitProducerId after restart handed out the old producer id {pid} again"
    );

    let got: Vec<String> = s.values(topic)?.into_iter().map(|(_, v)| v).collect();
    ensure!(
        got == ["a0", "a1", "b2", "b3", "b4", "c5"],
        "log holds {got:?}"
    );
    Ok(())
}
