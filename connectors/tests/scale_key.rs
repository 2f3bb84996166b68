//! The key-to-task function of scaled-out jobs is the one librdkafka's Java-compatible
//! partitioner (`partitioner=murmur2`) uses: every key produced through it lands on the
//! partition `task_of` names. Real client, real broker over TCP.

use std::time::Duration;

use onceflow_connectors::kafka::scale::{task_of, KafkaKey};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_murmur2_partitioner_agrees_with_task_of() {
    const PARTITIONS: u32 = 6;
    let broker = onceflow_testkit::inproc::start_broker(PARTITIONS as i32).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("partitioner", "murmur2")
        .set("linger.ms", "0")
        .create()
        .expect("producer");

    let mut keys: Vec<Vec<u8>> = (0..200).map(|i| format!("user-{i}").key_bytes()).collect();
    keys.push(Vec::new());
    keys.push("😀 non-ascii".key_bytes());
    keys.push(1234567i64.key_bytes());
    let mut seen = [0usize; PARTITIONS as usize];
    for key in &keys {
        let delivery = producer
            .send(
                FutureRecord::to("keys").key(key).payload("v"),
                Duration::from_secs(30),
            )
            .await
            .expect("delivered");
        let partition = delivery.partition;
        let want = task_of(key, PARTITIONS);
        assert_eq!(partition as u32, want, "key {key:?}");
        seen[partition as usize] += 1;
    }
    assert!(
        seen.iter().all(|n| *n > 0),
        "200 keys spread over every partition: {seen:?}"
    );
}
