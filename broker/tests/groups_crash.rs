//! Group offsets survive `kill -9` of the broker binary: the last acknowledged commit is there
//! after a restart on the same data directory.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Starts the broker binary on a free port; returns the child and its address.
fn spawn_broker(data_dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onceflow-broker"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("broker binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("listening line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, addr)
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "g-crash")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

fn offsets(topic: &str, values: &[(i32, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for &(partition, offset) in values {
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .expect("offset");
    }
    tpl
}

fn committed(consumer: &BaseConsumer, topic: &str, partitions: &[i32]) -> Vec<Offset> {
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition(topic, p);
    }
    consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets")
        .elements()
        .iter()
        .map(|e| e.offset())
        .collect()
}

#[test]
fn last_acknowledged_commit_survives_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let topic = "crash-offsets";
    let (mut child, addr) = spawn_broker(dir.path());
    {
        // Create the topic (auto-created by the producer's metadata request).
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", &addr)
            .create()
            .expect("producer");
        producer
            .send(BaseRecord::<(), str>::to(topic).payload("x"))
            .map_err(|(e, _)| e)
            .expect("queued");
        producer.flush(Duration::from_secs(10)).expect("flushed");

        let c = consumer(&addr);
        for (i, offset) in [5_i64, 9, 17].into_iter().enumerate() {
            c.commit(&offsets(topic, &[(0, offset)]), CommitMode::Sync)
                .unwrap_or_else(|e| panic!("commit {i} acknowledged: {e}"));
        }
        assert_eq!(committed(&c, topic, &[0]), vec![Offset::Offset(17)]);
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let (mut child, addr) = spawn_broker(dir.path());
    let c = consumer(&addr);
    assert_eq!(
        committed(&c, topic, &[0]),
        vec![Offset::Offset(17)],
        "the last acknowledged commit survived kill -9"
    );
    drop(c);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}
