//! Consumer groups over TCP with the real librdkafka client (rdkafka crate) against the
//! in-process broker: partition ownership, rebalances, committed offsets, restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onceflow_broker::storage::StorageConfig;
use onceflow_broker::{start, BrokerConfig, BrokerHandle};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(45);

async fn broker(data_dir: Option<std::path::PathBuf>) -> BrokerHandle {
    let config = BrokerConfig {
        storage: StorageConfig {
            data_dir,
            ..StorageConfig::default()
        },
        ..BrokerConfig::default()
    };
    start(config).await.expect("broker starts")
}

async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topics");
    for result in results {
        result.expect("topic created");
    }
}

/// Produces `per_partition` records to each partition; values are "p{partition}-{i}".
async fn produce(bootstrap: &str, topic: &str, partitions: i32, per_partition: usize) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    for p in 0..partitions {
        for i in 0..per_partition {
            let value = format!("p{p}-{i}");
            producer
                .send(
                    FutureRecord::<(), _>::to(topic)
                        .partition(p)
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .expect("delivered");
        }
    }
}

fn consumer(bootstrap: &str, group: &str) -> StreamConsumer {
    consumer_with(bootstrap, group, "range,roundrobin")
}

fn consumer_with(bootstrap: &str, group: &str, assignor: &str) -> StreamConsumer {
    ClientConfig::new()
        .set("partition.assignment.strategy", assignor)
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("client.id", "groups-test")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .expect("consumer")
}

/// Drives a consumer (rebalances only progress while it is polled) and records what it reads.
fn drive(
    consumer: Arc<StreamConsumer>,
    seen: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match consumer.recv().await {
                Ok(message) => {
                    if let Some(Ok(value)) = message.payload_view::<str>() {
                        seen.lock().unwrap().push(value.to_owned());
                    }
                }
                Err(e) => eprintln!("consumer error: {e}"),
            }
        }
    })
}

fn assignment(consumer: &StreamConsumer) -> BTreeSet<i32> {
    consumer
        .assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Waits until the consumers' assignments are disjoint and cover `0..partitions`, and each
/// consumer owns at least one partition.
async fn wait_for_exclusive_cover(
    consumers: &[Arc<StreamConsumer>],
    partitions: i32,
) -> Vec<BTreeSet<i32>> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let owned: Vec<BTreeSet<i32>> = consumers.iter().map(|c| assignment(c)).collect();
        let mut count: BTreeMap<i32, usize> = BTreeMap::new();
        for set in &owned {
            for p in set {
                *count.entry(*p).or_default() += 1;
            }
        }
        let covered = (0..partitions).all(|p| count.get(&p) == Some(&1))
            && count.len() == partitions as usize;
        if covered && owned.iter().all(|s| !s.is_empty()) {
            return owned;
        }
        assert!(
            Instant::now() < deadline,
            "no exclusive assignment within {TIMEOUT:?}: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn close(consumer: Arc<StreamConsumer>, task: tokio::task::JoinHandle<()>) {
    task.abort();
    let _ = task.await;
    // Dropping the last handle closes the consumer (LeaveGroup); it blocks while polling.
    tokio::task::spawn_blocking(move || drop(consumer))
        .await
        .expect("consumer closed");
}

/// Three consumers with `assignor` on a 6-partition topic: each partition owned exactly once;
/// after one leaves the two others own all six.
async fn share_six_partitions(assignor: &str) {
    let broker = broker(None).await;
    let bootstrap = broker.bootstrap_servers();
    let topic = "groups-six";
    let group = format!("g-six-{assignor}");
    create_topic(&bootstrap, topic, 6).await;
    produce(&bootstrap, topic, 6, 5).await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut consumers = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c = Arc::new(consumer_with(&bootstrap, &group, assignor));
        c.subscribe(&[topic]).expect("subscribe");
        tasks.push(drive(Arc::clone(&c), Arc::clone(&seen)));
        consumers.push(c);
    }
    let owned = wait_for_exclusive_cover(&consumers, 6).await;
    assert!(
        owned.iter().all(|s| s.len() == 2),
        "6 partitions over 3 members: {owned:?}"
    );

    // Every record is read (once per assignment; nothing was committed, so a rebalance could
    // only repeat, never skip).
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let distinct: BTreeSet<String> = seen.lock().unwrap().iter().cloned().collect();
        if distinct.len() == 30 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "read {} of 30 records",
            distinct.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One member leaves: the two others take over all six partitions.
    let leaving = consumers.remove(1);
    let leaving_task = tasks.remove(1);
    close(leaving, leaving_task).await;
    let owned = wait_for_exclusive_cover(&consumers, 6).await;
    assert_eq!(owned.iter().map(BTreeSet::len).sum::<usize>(), 6);
    assert!(
        owned.iter().all(|s| s.len() == 3),
        "6 partitions over 2 members: {owned:?}"
    );

    for (c, t) in consumers.into_iter().zip(tasks) {
        close(c, t).await;
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_assignor_three_consumers_six_partitions_rebalance_on_leave() {
    share_six_partitions("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_assignor_three_consumers_six_partitions_rebalance_on_leave() {
    share_six_partitions("roundrobin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_assignor_three_consumers_six_partitions_rebalance_on_leave() {
    share_six_partitions("cooperative-sticky").await;
}

/// Reads exactly `n` records from `consumer` (in order within the single partition).
async fn read_n(consumer: &StreamConsumer, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let message = tokio::time::timeout(TIMEOUT, consumer.recv())
            .await
            .expect("a record within the timeout")
            .expect("no consumer error");
        let value = message
            .payload_view::<str>()
            .and_then(Result::ok)
            .unwrap_or("");
        out.push(value.to_owned());
    }
    out
}

async fn committed(consumer: &StreamConsumer, topic: &str) -> Offset {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let consumer_tpl =
        tokio::task::block_in_place(|| consumer.committed_offsets(tpl, Duration::from_secs(10)))
            .expect("committed offsets");
    consumer_tpl.elements()[0].offset()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_resume_without_loss_or_repetition() {
    let broker = broker(None).await;
    let bootstrap = broker.bootstrap_servers();
    let topic = "groups-resume";
    create_topic(&bootstrap, topic, 1).await;
    produce(&bootstrap, topic, 1, 100).await;

    let first = consumer(&bootstrap, "g-resume");
    first.subscribe(&[topic]).expect("subscribe");
    let read = read_n(&first, 40).await;
    let expected: Vec<String> = (0..40).map(|i| format!("p0-{i}")).collect();
    assert_eq!(read, expected);
    tokio::task::block_in_place(|| first.commit_consumer_state(CommitMode::Sync)).expect("commit");
    assert_eq!(committed(&first, topic).await, Offset::Offset(40));
    tokio::task::spawn_blocking(move || drop(first))
        .await
        .unwrap();

    // A restarted consumer of the group continues at the committed offset.
    let second = consumer(&bootstrap, "g-resume");
    second.subscribe(&[topic]).expect("subscribe");
    let read = read_n(&second, 60).await;
    let expected: Vec<String> = (40..100).map(|i| format!("p0-{i}")).collect();
    assert_eq!(read, expected, "no record lost or repeated");
    // Nothing more arrives.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), second.recv())
            .await
            .is_err()
    );
    tokio::task::spawn_blocking(move || drop(second))
        .await
        .unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_survive_a_broker_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let topic = "groups-restart";
    {
        let broker = broker(Some(dir.path().to_path_buf())).await;
        let bootstrap = broker.bootstrap_servers();
        create_topic(&bootstrap, topic, 1).await;
        produce(&bootstrap, topic, 1, 20).await;
        let c = consumer(&bootstrap, "g-restart");
        c.subscribe(&[topic]).expect("subscribe");
        read_n(&c, 12).await;
        tokio::task::block_in_place(|| c.commit_consumer_state(CommitMode::Sync)).expect("commit");
        tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
        broker.shutdown().await;
    }
    let broker = broker(Some(dir.path().to_path_buf())).await;
    let bootstrap = broker.bootstrap_servers();
    let c = consumer(&bootstrap, "g-restart");
    assert_eq!(committed(&c, topic).await, Offset::Offset(12));
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_metrics_are_exported() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let config = BrokerConfig {
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..BrokerConfig::default()
    };
    let broker = start(config).await.expect("broker starts");
    let bootstrap = broker.bootstrap_servers();
    create_topic(&bootstrap, "metered-group", 2).await;
    let c = Arc::new(consumer(&bootstrap, "g-metered"));
    c.subscribe(&["metered-group"]).expect("subscribe");
    let task = drive(Arc::clone(&c), Arc::new(Mutex::new(Vec::new())));
    wait_for_exclusive_cover(std::slice::from_ref(&c), 2).await;

    let addr = broker.metrics_addr().expect("metrics address");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut text))
        .await
        .expect("metrics within 10 s")
        .expect("read");
    assert!(
        text.contains("onceflow_broker_group_rebalances_total{group=\"g-metered\"}"),
        "no rebalance counter in: {text}"
    );
    assert!(
        text.contains("onceflow_broker_group_members{group=\"g-metered\"} 1"),
        "no members gauge in: {text}"
    );
    close(c, task).await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_topic_drops_its_committed_offsets() {
    let broker = broker(None).await;
    let bootstrap = broker.bootstrap_servers();
    let topic = "groups-deleted";
    create_topic(&bootstrap, topic, 1).await;
    let c = consumer(&bootstrap, "g-deleted");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(7))
        .expect("offset");
    tokio::task::block_in_place(|| c.commit(&tpl, CommitMode::Sync)).expect("commit");
    assert_eq!(committed(&c, topic).await, Offset::Offset(7));

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    for result in admin
        .delete_topics(&[topic], &AdminOptions::new())
        .await
        .expect("delete topics")
    {
        result.expect("topic deleted");
    }
    create_topic(&bootstrap, topic, 1).await;
    assert_eq!(
        committed(&c, topic).await,
        Offset::Invalid,
        "a recreated topic does not inherit the old offsets"
    );
    tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    broker.shutdown().await;
}
