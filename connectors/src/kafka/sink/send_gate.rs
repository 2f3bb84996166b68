//! A producer's send gate on one topic: while it is closed, records produced to the topic
//! queue in the producer and nothing of them is sent; the transaction still registers their
//! partitions with the coordinator (AddPartitionsToTxn), because librdkafka does that when a
//! record is queued, not when it is sent.
//!
//! The two-phase-commit sink hands the records of transaction n+1 to the next producer while
//! the previous producer still drains transaction n, with the gate closed so that no record
//! of n+1 reaches a partition before the records of n. Opening the gate once the drain
//! ended sends them at once: the AddPartitionsToTxn round trip (a transaction-log write
//! on the coordinator) has already been done during the drain instead of after it.
//!
//! The gate is librdkafka's `rd_kafka_pause_partitions`, which holds back a producer's sends
//! to the paused partitions; rust-rdkafka offers it on consumers only.

use std::time::Duration;

use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::TopicPartitionList;

use super::super::{KafkaError, Result};
use super::producer::Prod;

/// The partitions of one topic, as one producer knows them, that [`SendGate::close`] holds
/// back.
#[derive(Clone, Debug)]
pub struct SendGate {
    topic: String,
    partitions: i32,
}

impl SendGate {
    /// Learns `topic`'s partitions with a metadata request of `p`, which also makes the
    /// producer's state of each partition (a partition the producer does not know yet cannot
    /// be paused). Blocking.
    pub fn learn(p: &Prod, topic: &str, timeout: Duration) -> Result<SendGate> {
        let md = p
            .client()
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| KafkaError::client(format!("metadata of {topic}"), e))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| KafkaError::Protocol(format!("no metadata for topic {topic}")))?;
        if let Some(e) = t.error() {
            return Err(KafkaError::Protocol(format!(
                "metadata of topic {topic}: error {e:?}"
            )));
        }
        let partitions = t.partitions().len() as i32;
        if partitions == 0 {
            return Err(KafkaError::Protocol(format!(
                "metadata of topic {topic}: no partitions"
            )));
        }
        Ok(SendGate {
            topic: topic.to_string(),
            partitions,
        })
    }

    /// The topic the gate holds back.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn list(&self) -> TopicPartitionList {
        let mut l = TopicPartitionList::with_capacity(self.partitions as usize);
        l.add_partition_range(&self.topic, 0, self.partitions - 1);
        l
    }

    /// Holds back `p`'s sends to every partition of the topic. `true` when every partition
    /// is held; `false` when the producer did not know one of them (its metadata changed):
    /// then the gate is opened again and must not be relied on.
    pub fn close(&self, p: &Prod) -> bool {
        let mut l = self.list();
        pause_resume(p, &mut l, true);
        let all = l.elements().iter().all(|e| e.error().is_ok());
        if !all {
            self.open(p);
        }
        all
    }

    /// Lets `p` send to every partition of the topic again; records queued meanwhile go out
    /// at once (those that waited their `linger.ms`).
    pub fn open(&self, p: &Prod) {
        let mut l = self.list();
        pause_resume(p, &mut l, false);
    }
}

/// `rd_kafka_pause_partitions` / `rd_kafka_resume_partitions` on a producer. Both wait until
/// each partition's thread has applied the change, so a record queued after the call
/// returns is held (or sent) as asked. A partition's outcome is left in its element of `l`.
#[allow(unsafe_code)]
fn pause_resume(p: &Prod, l: &mut TopicPartitionList, pause: bool) {
    // SAFETY: `native_ptr` is the handle of the live producer `p`, and `l.ptr()` the list
    // owned by `l`; both are borrowed for the whole call, so neither is destroyed during it,
    // and the exclusive borrow of `l` covers librdkafka writing each element's `err`.
    // librdkafka's handles are thread-safe: pausing may run while other threads produce to
    // or poll the same handle. Neither function keeps a pointer to the list after it
    // returns. The return value is always NO_ERROR; per-partition outcomes are in `l`.
    let err: RDKafkaRespErr = unsafe {
        if pause {
            rdkafka::bindings::rd_kafka_pause_partitions(p.client().native_ptr(), l.ptr())
        } else {
            rdkafka::bindings::rd_kafka_resume_partitions(p.client().native_ptr(), l.ptr())
        }
    };
    if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        tracing::warn!(
            ?err,
            pause,
            "pausing or resuming a producer's partitions failed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::config::KafkaSinkConfig;
    use crate::kafka::sink::producer::{self, init_transactional};
    use crate::kafka::sink::SinkRecord;
    use onceflow_testkit::clients;
    use rdkafka::consumer::Consumer;

    fn high_watermark(c: &rdkafka::consumer::BaseConsumer, topic: &str, p: i32) -> i64 {
        c.fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks")
            .1
    }

    /// A closed gate holds back every record of its topic while the producer sends to other
    /// topics: a record to another topic, queued after the gated ones, reaches the log while
    /// the gated partitions stay empty; opened, the gate lets them follow, in order, in the
    /// same transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_gate_holds_back_its_topic_until_opened() {
        let broker =
            onceflow_testkit::inproc::start_with(onceflow_broker::BrokerConfig::default()).await;
        let bootstrap = broker.bootstrap_servers();
        let b = bootstrap.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            clients::create_topics(&b, &["gated"], 2);
            clients::create_topics(&b, &["other"], 1);
            let cfg = KafkaSinkConfig::new(&b, "gated");
            let (p, ctx) =
                init_transactional(&cfg, "gate-test", Duration::from_secs(30)).expect("init");
            let gate = SendGate::learn(&p, "gated", Duration::from_secs(10)).expect("learn");
            assert_eq!(gate.topic(), "gated");
            p.begin_transaction().expect("begin");
            assert!(gate.close(&p), "every partition of the topic is held");
            for i in 0..40 {
                let key = format!("k{}", i % 4).into_bytes();
                let r = SinkRecord::new(Some(key), format!("r{i}").into_bytes());
                producer::send(&p, "gated", &r).expect("send");
            }
            producer::send(&p, "other", &SinkRecord::new(None, b"after".to_vec()))
                .expect("send other");
            // the record queued after the gated ones reaches the log: the producer's broker
            // thread has looked at the gated partitions since they were due
            let c = clients::consumer_with(&b, false, false);
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while high_watermark(&c, "other", 0) < 1 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the other topic's record was not sent"
                );
                p.poll(Duration::from_millis(10));
            }
            let held: i64 = (0..2).map(|i| high_watermark(&c, "gated", i)).sum();
            assert_eq!(
                held, 0,
                "records of the gated topic were sent while it was closed"
            );
            assert!(
                p.in_flight_count() >= 40,
                "the gated records wait in the producer"
            );
            gate.open(&p);
            p.commit_transaction(Duration::from_secs(30))
                .expect("commit");
            assert_eq!(producer::take_delivery_error(&ctx), None);
            clients::read_committed_values(&b, "gated")
        })
        .await
        .expect("test thread");
        assert_eq!(verdict.len(), 40, "every gated record once: {verdict:?}");
        // one key's records are in one partition: in offset order their numbers rise
        let mut last: [Option<usize>; 4] = [None; 4];
        for v in &verdict {
            let i: usize = v[1..].parse().expect("r<number>");
            if let Some(prev) = last[i % 4] {
                assert!(prev < i, "key k{}: r{i} after r{prev}", i % 4);
            }
            last[i % 4] = Some(i);
        }
        broker.shutdown().await;
    }
}
