//! The rdkafka producer shared by every sink mode: a context that learns the producer id and
//! epoch once from librdkafka's statistics (`eos` object) and records delivery errors; sending
//! with back-off on a full queue; draining delivery reports by polling (never flush's 100 ms
//! steps); blocking calls moved off the async workers.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};
use serde::Deserialize;

use super::super::config::KafkaSinkConfig;
use super::super::{retry, KafkaError, Result};
use super::SinkRecord;

/// State the producer's callbacks fill in.
#[derive(Default)]
pub struct ProdCtx {
    /// (producer id, epoch) from the first statistics with a valid `eos` object. A
    /// transactional producer keeps the id and epoch of its `init_transactions` until an
    /// `abort_transaction`: librdkafka bumps the epoch of a transactional producer only
    /// there (KIP-360 recovery runs inside the abort; librdkafka 2.12 sends EndTxn v1, so
    /// there is no KIP-890 bump per transaction), and a sink drops a producer after an
    /// abort instead of reusing it, so the first value holds for the producer's life.
    pub ids: OnceLock<(i64, i16)>,
    /// First delivery error since the last check.
    pub delivery_error: Mutex<Option<String>>,
}

/// Context handle (shared with the sink).
#[derive(Clone, Default)]
pub struct Ctx(pub Arc<ProdCtx>);

/// The one part of librdkafka's statistics a sink reads.
#[derive(Deserialize)]
struct EosStats {
    eos: Option<Eos>,
}

#[derive(Deserialize)]
struct Eos {
    producer_id: i64,
    producer_epoch: i64,
}

impl ClientContext for Ctx {
    /// Reads the producer id and epoch until they are known, then ignores the statistics.
    /// Not rdkafka's default, which decodes every emission (ten a second) into a full
    /// `Statistics` that nothing here reads.
    fn stats_raw(&self, statistics: &[u8]) {
        if self.0.ids.get().is_some() {
            return;
        }
        match serde_json::from_slice::<EosStats>(statistics) {
            Ok(EosStats {
                eos:
                    Some(Eos {
                        producer_id,
                        producer_epoch,
                    }),
            }) if producer_id >= 0 && (0..=i16::MAX as i64).contains(&producer_epoch) => {
                let _ = self.0.ids.set((producer_id, producer_epoch as i16));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "unreadable librdkafka statistics"),
        }
    }
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut slot = self.0.delivery_error.lock();
            if slot.is_none() {
                *slot = Some(e.to_string());
            }
        }
    }
}

/// The producer type of the sink.
pub type Prod = BaseProducer<Ctx>;

/// What a sink's producer is for.
#[derive(Clone, Copy, Debug)]
pub enum Kind<'a> {
    /// `acks=1`, no idempotence (at-least-once without it).
    Plain,
    /// Idempotent (at-least-once).
    Idempotent,
    /// Transactional with this transactional id. `learn_ids`: the sink learns the producer
    /// id and epoch from librdkafka's statistics ([`init_and_learn`]), so they are switched
    /// on; every other producer goes without them (the two-phase-commit sink asks the
    /// transaction coordinator where the cluster can answer, `committer::describe_producer`).
    Transactional { id: &'a str, learn_ids: bool },
}

/// Creates a producer of `kind`.
pub fn create(cfg: &KafkaSinkConfig, kind: Kind<'_>) -> Result<(Arc<Prod>, Ctx)> {
    let ctx = Ctx::default();
    let p: Prod = config(cfg, kind)
        .create_with_context(ctx.clone())
        .map_err(|e| KafkaError::client("creating the producer", e))?;
    Ok((Arc::new(p), ctx))
}

/// Creates the transactional producer of `id` without statistics and runs its
/// [`init_transactions`] (which fences every older producer of the id). Blocking.
pub fn init_transactional(
    cfg: &KafkaSinkConfig,
    id: &str,
    timeout: Duration,
) -> Result<(Arc<Prod>, Ctx)> {
    let kind = Kind::Transactional {
        id,
        learn_ids: false,
    };
    let (p, ctx) = create(cfg, kind)?;
    init_transactions(&p, id, &cfg.default_topic, timeout)?;
    Ok((p, ctx))
}

/// The librdkafka settings of a sink's producer (see [`create`]).
fn config(cfg: &KafkaSinkConfig, kind: Kind<'_>) -> ClientConfig {
    let mut c = cfg.client_properties.client_config(&cfg.brokers);
    // the batching default; a job's own `--kafka-property linger.ms=...` wins
    if cfg.client_properties.get("linger.ms").is_none() {
        c.set("linger.ms", "5");
    }
    c
        // only failed deliveries are reported: the sinks look at nothing else, and a report
        // per acknowledged record cost the writing subtask an event per produce response and
        // a callback per record; `in_flight_count` still counts records until their ack
        .set("delivery.report.only.error", "true")
        .set("message.timeout.ms", "120000");
    match kind {
        Kind::Transactional { id, learn_ids } => {
            let t = cfg.transaction_timeout.as_millis().to_string();
            c.set("transactional.id", id)
                .set("transaction.timeout.ms", &t)
                .set("message.timeout.ms", &t);
            if learn_ids {
                // the statistics' `eos` object is how a sink learns its producer id and
                // epoch (init_and_learn); the first emission comes one interval after the
                // producer was created, and the ones after it are ignored (Ctx::stats_raw)
                c.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
            }
        }
        Kind::Idempotent => {
            c.set("enable.idempotence", "true");
        }
        Kind::Plain => {
            c.set("acks", "1");
        }
    }
    for (k, v) in &cfg.producer_properties {
        c.set(k, v);
    }
    c
}

/// The statistics interval of a producer that learns its ids: how long [`init_and_learn`]
/// waits at most after `init_transactions`.
const STATISTICS_INTERVAL_MS: &str = "100";

/// Runs a blocking closure on tokio's blocking pool.
pub async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> onceflow_runtime::Result<R> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        onceflow_runtime::Error::Internal(format!("blocking kafka call panicked: {e}"))
    })
}

/// How long [`send`] keeps retrying a full local queue.
const QUEUE_FULL_LIMIT: Duration = Duration::from_secs(60);

/// How long [`drain`] and [`send`] sleep between two looks at the producer.
const IDLE_STEP: Duration = Duration::from_millis(1);

/// Serves pending events (delivery errors, statistics) without blocking, then sleeps
/// [`IDLE_STEP`]. Not `p.poll(d)` with a short `d`: rust-rdkafka passes librdkafka the
/// remaining time in whole milliseconds and loops until its deadline, so the last
/// millisecond of every `poll(d)` (all of a `poll(1 ms)`) is a busy loop, which burned a
/// core per draining sink subtask while it waited for acks.
fn serve_then_sleep(p: &Prod) {
    p.poll(Duration::ZERO);
    std::thread::sleep(IDLE_STEP);
}

/// Sends one record, polling while the local queue is full.
pub fn send(p: &Prod, default_topic: &str, r: &SinkRecord) -> Result<()> {
    let topic = r.topic.as_deref().unwrap_or(default_topic);
    if r.topic.is_some() && is_dead_letter_topic(topic, default_topic) {
        metrics::counter!(crate::kafka::metrics::DEAD_LETTERS).increment(1);
    }
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(&r.value[..]);
    if let Some(k) = &r.key {
        rec = rec.key(&k[..]);
    }
    if let Some(ts) = r.timestamp_ms {
        rec = rec.timestamp(ts);
    }
    send_record(p, rec).map_err(|e| KafkaError::client(format!("producing to {topic}"), e))
}

/// Whether `topic` is the dead-letter topic of `output` (`<output>.dlq`), without allocating.
fn is_dead_letter_topic(topic: &str, output: &str) -> bool {
    topic
        .strip_prefix(output)
        .is_some_and(|rest| rest == ".dlq")
}

/// Sends one record to an explicit partition (a changelog record: `value` `None` is a
/// tombstone), polling while the local queue is full.
pub fn send_to_partition(
    p: &Prod,
    topic: &str,
    partition: i32,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<()> {
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(partition).key(key);
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    send_record(p, rec)
        .map_err(|e| KafkaError::client(format!("producing to {topic}-{partition}"), e))
}

/// Sends `rec`, serving the producer while its local queue is full, for at most
/// [`QUEUE_FULL_LIMIT`]; a refused record comes back from `send` and is sent again as is.
fn send_record(p: &Prod, mut rec: BaseRecord<'_, [u8], [u8]>) -> std::result::Result<(), RdError> {
    // the clock is read only once the queue is full (not once per record)
    let mut deadline: Option<Instant> = None;
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now()
                    < *deadline.get_or_insert_with(|| Instant::now() + QUEUE_FULL_LIMIT) =>
            {
                serve_then_sleep(p);
                rec = back;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Serves delivery reports until nothing is in flight (or `timeout`). Blocking, without
/// spinning: between two looks it waits up to 1 ms for the producer's last record to be
/// acknowledged ([`wait_flushing`]), and while it waits the producer sends what lingers at
/// once, so a drain takes the produce round trips of the records in flight, not `linger.ms`
/// more.
pub fn drain(p: &Prod, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        p.poll(Duration::ZERO);
        if p.in_flight_count() == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::Protocol(format!(
                "{} records still in flight after {timeout:?}",
                p.in_flight_count()
            )));
        }
        wait_flushing(p, IDLE_STEP);
    }
}

/// Waits up to `step` until the producer holds no record, as librdkafka's `rd_kafka_flush`
/// does: for the wait, librdkafka treats the records that linger (`linger.ms`) as due, wakes
/// its broker threads to send them, and returns as soon as the last one is acknowledged.
/// rust-rdkafka's own `flush` cannot do this: it calls `rd_kafka_flush` with no time to
/// wait, so the flag is down again before a broker thread looks at it, and then polls for up
/// to 100 ms between calls. Delivery reports are not served here (the producer reports
/// through its event queue, which `rd_kafka_flush` leaves alone); [`drain`] polls between
/// two waits.
#[allow(unsafe_code)]
fn wait_flushing(p: &Prod, step: Duration) {
    let ms = step.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `native_ptr` is the handle of the live producer `p`, which is borrowed for the
    // whole call, so the handle is not destroyed during it; `rd_kafka_flush` may be called
    // from any thread while other threads produce to or poll the same handle (librdkafka's
    // handles are thread-safe), and it only waits, so its result needs no handling: the
    // caller counts the records still in flight itself.
    unsafe {
        rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), ms);
    }
}

/// Takes the first delivery error since the last call.
pub fn take_delivery_error(ctx: &Ctx) -> Option<String> {
    ctx.0.delivery_error.lock().take()
}

/// `init_transactions` of a fresh producer, after a ListOffsets of partition 0 of `topic`
/// (one the job writes) has brought up a connection to a broker of the cluster.
///
/// librdkafka looks for the transaction coordinator as soon as `init_transactions` is called,
/// through any broker that is up; the bootstrap connection does not count, and a fresh
/// producer has no other, so the query fails and is tried again only 500 ms later
/// (`rd_kafka_txn_coord_query` in rdkafka_txnmgr.c). The ListOffsets goes to the partition's
/// leader and waits for its answer, so that broker is up when `init_transactions` starts.
/// Against the in-process broker, 30 fresh producers each: without it 7 waited the 500 ms
/// (mean 160 ms to initialize); after a metadata request instead (which the bootstrap
/// connection answers) 25 did (mean 432 ms); after the ListOffsets none did (mean 8 ms).
/// Every transactional producer a job starts (the seal, the ring, the fencing at recovery,
/// the instance producer) is a fresh one.
///
/// A coordinator that is loading, moved, unreachable or still completing the id's previous
/// transaction (CONCURRENT_TRANSACTIONS, right after a broker restart) is retried within
/// [`retry::COORDINATOR_BUDGET`], as Kafka's own producer does; no transaction is open yet.
pub fn init_transactions(p: &Prod, id: &str, topic: &str, timeout: Duration) -> Result<()> {
    // an error here (say, the topic does not exist yet) only costs the wait it would save
    let _ = p
        .client()
        .fetch_watermarks(topic, 0, timeout.min(Duration::from_secs(5)));
    retry::blocking(
        &format!("init_transactions {id}"),
        &format!("transaction coordinator of {id}"),
        retry::COORDINATOR_BUDGET,
        || p.init_transactions(timeout),
    )
}

/// [`init_transactions`] of a producer made with `learn_ids`, then waits until the
/// statistics report its producer id and epoch.
pub fn init_and_learn(
    p: &Prod,
    ctx: &Ctx,
    id: &str,
    topic: &str,
    timeout: Duration,
) -> Result<(i64, i16)> {
    init_transactions(p, id, topic, timeout)?;
    let deadline = Instant::now() + timeout;
    loop {
        p.poll(Duration::from_millis(20));
        if let Some(v) = ctx.0.ids.get() {
            return Ok(*v);
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::Protocol(
                "librdkafka statistics did not report the producer id and epoch (statistics.interval.ms)".into(),
            ));
        }
    }
}

/// Whether a transactional error means this producer was fenced by a newer one.
pub fn is_fenced(e: &RdError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink_config(properties: &[(&str, &str)]) -> KafkaSinkConfig {
        let mut c = KafkaSinkConfig::new("127.0.0.1:9", "out");
        for (k, v) in properties {
            c.client_properties
                .set(k, v)
                .expect("a property the job may set");
        }
        c
    }

    fn txn(id: &str) -> Kind<'_> {
        Kind::Transactional {
            id,
            learn_ids: true,
        }
    }

    /// A drain sends the records that linger instead of waiting out `linger.ms`: with a
    /// linger of 100 s, records are only sent before it ends if the drain makes them
    /// due, so a drain that waited for the linger would fail at its 30 s timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_sends_what_lingers_at_once() {
        let broker =
            onceflow_testkit::inproc::start_with(onceflow_broker::BrokerConfig::default()).await;
        let bootstrap = broker.bootstrap_servers();
        let mut cfg = KafkaSinkConfig::new(&bootstrap, "lingering");
        cfg.client_properties
            .set("linger.ms", "100000")
            .expect("a property the job may set");
        let (p, ctx) = create(&cfg, Kind::Idempotent).expect("producer");
        for i in 0..20 {
            send(
                &p,
                "lingering",
                &SinkRecord::new(None, format!("r{i}").into_bytes()),
            )
            .expect("send");
        }
        // the count also takes in events waiting to be polled, if any
        assert!(
            p.in_flight_count() >= 20,
            "the records linger in the producer"
        );
        let drained = {
            let p = p.clone();
            tokio::task::spawn_blocking(move || drain(&p, Duration::from_secs(30)))
                .await
                .expect("drain thread")
        };
        drained.expect("the drain ends before the linger does");
        assert_eq!(p.in_flight_count(), 0);
        assert_eq!(take_delivery_error(&ctx), None);
        let bootstrap2 = bootstrap.clone();
        let seen = tokio::task::spawn_blocking(move || {
            onceflow_testkit::clients::read_committed_values(&bootstrap2, "lingering")
        })
        .await
        .expect("reader");
        let want: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
        assert_eq!(seen, want, "every record in the log, in order");
    }

    #[test]
    fn linger_defaults_to_five_ms_and_the_jobs_own_value_wins() {
        let c = config(&sink_config(&[]), txn("t-0-0"));
        assert_eq!(c.get("linger.ms"), Some("5"));
        let c = config(&sink_config(&[("linger.ms", "1")]), txn("t-0-0"));
        assert_eq!(c.get("linger.ms"), Some("1"));
        let c = config(&sink_config(&[("linger.ms", "20")]), Kind::Idempotent);
        assert_eq!(c.get("linger.ms"), Some("20"));
    }

    #[test]
    fn the_producer_id_and_epoch_are_read_once_from_the_statistics() {
        let ctx = Ctx::default();
        // before init_transactions, a non-transactional client, a broken emission
        ctx.stats_raw(br#"{"name":"p#producer-1","eos":{"idemp_state":"Init","producer_id":-1,"producer_epoch":-1}}"#);
        ctx.stats_raw(br#"{"name":"p#producer-2","brokers":{}}"#);
        ctx.stats_raw(b"{\"eos\": {\"producer_id\": 7");
        ctx.stats_raw(br#"{"eos":{"producer_id":7,"producer_epoch":40000}}"#);
        assert_eq!(ctx.0.ids.get(), None);
        ctx.stats_raw(br#"{"brokers":{"b":{"rtt":{"p50":1}}},"eos":{"idemp_state":"Assigned","txn_state":"Ready","producer_id":4000,"producer_epoch":3,"epoch_cnt":1}}"#);
        assert_eq!(ctx.0.ids.get(), Some(&(4000, 3)));
        // later emissions are not read
        ctx.stats_raw(br#"{"eos":{"producer_id":4000,"producer_epoch":4}}"#);
        assert_eq!(ctx.0.ids.get(), Some(&(4000, 3)));
    }

    #[test]
    fn only_a_producer_that_learns_its_ids_emits_statistics() {
        let cfg = sink_config(&[]);
        assert_eq!(
            config(&cfg, txn("t-0-0")).get("statistics.interval.ms"),
            Some("100")
        );
        let sealing = Kind::Transactional {
            id: "t-seal",
            learn_ids: false,
        };
        for kind in [sealing, Kind::Idempotent, Kind::Plain] {
            assert_eq!(
                config(&cfg, kind).get("statistics.interval.ms"),
                None,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_transactional_producers_message_timeout_follows_the_transaction_timeout() {
        let c = config(
            &sink_config(&[("message.timeout.ms", "900000")]),
            txn("t-0-0"),
        );
        assert_eq!(c.get("message.timeout.ms"), Some("60000"));
        assert_eq!(c.get("transaction.timeout.ms"), Some("60000"));
    }
}
