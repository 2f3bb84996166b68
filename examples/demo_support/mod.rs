//! Shared by the examples' embedded demo mode (no `--brokers`): a paced input generator and a
//! read_committed reader of the output that prints what it saw. Not part of the library.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Prints a line on stdout and flushes it (the examples' stdout is a contract tests read).
pub fn say(line: String) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Writes `rate` records per second to `topic` until `stop`, in ticks of 50 ms; record `i` is
/// `make(i) = (key, value)`. Idempotent producer; a full queue is waited out, never dropped.
pub fn spawn_paced_producer(
    brokers: String,
    topic: String,
    rate: u64,
    stop: Arc<AtomicBool>,
    mut make: impl FnMut(u64) -> (String, String) + Send + 'static,
) {
    std::thread::spawn(move || {
        let producer: BaseProducer = match ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
        {
            Ok(p) => p,
            Err(e) => {
                eprintln!("demo generator: {e}");
                return;
            }
        };
        let mut i = 0u64;
        let tick = Duration::from_millis(50);
        let per_tick = (rate / 20).max(1);
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            for _ in 0..per_tick {
                let (key, value) = make(i);
                while producer
                    .send(BaseRecord::to(&topic).key(&key).payload(&value))
                    .is_err()
                {
                    producer.poll(Duration::from_millis(10));
                }
                i += 1;
            }
            producer.poll(Duration::ZERO);
            if let Some(rest) = tick.checked_sub(t0.elapsed()) {
                std::thread::sleep(rest);
            }
        }
        let _ = producer.flush(Duration::from_secs(10));
    });
}

/// What the output reader counts.
pub trait Tally: Send + 'static {
    /// One committed output record's value.
    fn record(&mut self, payload: &[u8]);
    /// What was seen so far, in one line.
    fn summary(&self) -> String;
}

/// Reads `topic` read_committed (consumer group `group`) and feeds `tally`; prints
/// `output (read_committed): <summary>` every 2 s. Once `stop` is set it ends after 2 s
/// without records and returns `final output (read_committed): <summary>`.
pub fn spawn_output_reader(
    brokers: String,
    topic: String,
    group: &str,
    stop: Arc<AtomicBool>,
    mut tally: impl Tally,
) -> std::thread::JoinHandle<String> {
    let group = group.to_string();
    std::thread::spawn(move || {
        let consumer: BaseConsumer = match ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
        {
            Ok(c) => c,
            Err(e) => return format!("verifier: {e}"),
        };
        if let Err(e) = consumer.subscribe(&[&topic]) {
            return format!("verifier: {e}");
        }
        let mut last_print = Instant::now();
        let mut quiet_since: Option<Instant> = None;
        loop {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    quiet_since = None;
                    tally.record(m.payload().unwrap_or_default());
                }
                _ => {
                    if stop.load(Ordering::Relaxed) {
                        let q = *quiet_since.get_or_insert_with(Instant::now);
                        if q.elapsed() > Duration::from_secs(2) {
                            break;
                        }
                    }
                }
            }
            if last_print.elapsed() >= Duration::from_secs(2) {
                last_print = Instant::now();
                say(format!("output (read_committed): {}", tally.summary()));
            }
        }
        format!("final output (read_committed): {}", tally.summary())
    })
}

/// The demo of an example on the embedded broker: a generator writing `rate` records per
/// second (`make(i) = (key, value)`) to the input and a read_committed reader of the output
/// feeding `tally`. Returns what the job runs after it stopped: stop the generator, wait for
/// the reader to go quiet and print its final summary.
pub fn start_demo(
    at: &onceflow::job::JobPlacement,
    rate: u64,
    make: impl FnMut(u64) -> (String, String) + Send + 'static,
    tally: impl Tally,
) -> impl FnOnce() {
    say(format!(
        "demo generator writes {rate} records/s to {}",
        at.input
    ));
    let stop = Arc::new(AtomicBool::new(false));
    spawn_paced_producer(
        at.brokers.clone(),
        at.input.clone(),
        rate,
        stop.clone(),
        make,
    );
    let group = format!("{}-demo-reader", at.output);
    let reader = spawn_output_reader(
        at.brokers.clone(),
        at.output.clone(),
        &group,
        stop.clone(),
        tally,
    );
    move || {
        stop.store(true, Ordering::Relaxed);
        if let Ok(summary) = reader.join() {
            say(summary);
        }
    }
}
