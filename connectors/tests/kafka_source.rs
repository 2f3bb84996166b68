//! KafkaSource against the in-process broker: partitions spread over subtasks, positions
//! snapshotted and restored (a restored reader continues where the snapshot was taken); a
//! restored position whose records were deleted before they were read stops the source with
//! DATA LOSS naming the partition and the offsets, instead of skipping them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use onceflow_connectors::kafka::{Decoder, KafkaMessage, KafkaSource};
use onceflow_runtime::{Source, SourceFactory, SourcePoll};
use onceflow_testkit::clients::produce_values;
use onceflow_testkit::inproc::{start_broker, subtask_info};

async fn poll_n<S: Source<KafkaMessage>>(s: &mut S, n: usize) -> Vec<KafkaMessage> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n && Instant::now() < deadline {
        let mut batch = Vec::new();
        let want = (n - out.len()).min(7);
        if let SourcePoll::Idle(d) = s.poll(&mut batch, want).await.expect("poll") {
            tokio::time::sleep(d).await;
        }
        out.extend(batch);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_restore_and_partitions_split() {
    let b = start_broker(4).await;
    let brokers = b.bootstrap_servers();
    let values: Vec<String> = (0..200).map(|i| format!("v{i}")).collect();
    produce_values(&brokers, "src", 4, &values);

    // two subtasks: partitions {0, 2} and {1, 3}
    let factory = KafkaSource::new(brokers.clone(), "src", Decoder::raw());
    let mut s0 = factory.create(&subtask_info(0, 2, 0)).expect("create 0");
    let mut s1 = factory.create(&subtask_info(1, 2, 0)).expect("create 1");
    let first0 = poll_n(&mut s0, 60).await;
    let first1 = poll_n(&mut s1, 40).await;
    assert_eq!(first0.len(), 60);
    assert!(first0.iter().all(|m| m.partition % 2 == 0));
    assert!(first1.iter().all(|m| m.partition % 2 == 1));
    assert!(first0.iter().all(|m| m.timestamp_ms.is_some()));
    let pos0 = s0.snapshot_position(1).expect("snapshot");
    let pos1 = s1.snapshot_position(1).expect("snapshot");
    drop((s0, s1));

    // restore at parallelism 1 from both old positions: exactly the rest
    let mut r = factory
        .create(&subtask_info(0, 1, 1))
        .expect("create restored");
    r.restore(vec![pos0, pos1]).expect("restore");
    let rest = poll_n(&mut r, 100).await;
    assert_eq!(rest.len(), 100);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for m in first0.iter().chain(&first1).chain(&rest) {
        let v = String::from_utf8(m.payload.clone().expect("payload")).expect("utf8");
        assert!(seen.insert(v.clone()), "{v} read twice");
    }
    assert_eq!(seen.len(), 200);
    // nothing more
    let mut extra = Vec::new();
    r.poll(&mut extra, 10).await.expect("poll");
    assert!(extra.is_empty());
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_deleted_before_it_was_read_is_data_loss_not_a_silent_skip() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let b = start_broker(1).await;
    let brokers = b.bootstrap_servers();
    let values: Vec<String> = (0..200).map(|i| format!("v{i}")).collect();
    produce_values(&brokers, "gone", 1, &values);

    let factory = KafkaSource::new(brokers.clone(), "gone", Decoder::raw());
    let mut s = factory.create(&subtask_info(0, 1, 0)).expect("create");
    let first = poll_n(&mut s, 20).await;
    assert_eq!(first.len(), 20);
    let pos = s.snapshot_position(1).expect("snapshot");
    drop(s);

    // the job is stopped at offset 20 while records up to 100 are deleted
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("admin");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("gone", 0, Offset::Offset(100))
        .expect("tpl");
    let deleted = admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("delete records");
    assert_eq!(
        deleted.find_partition("gone", 0).map(|e| e.offset()),
        Some(Offset::Offset(100))
    );

    let mut r = factory
        .create(&subtask_info(0, 1, 1))
        .expect("create restored");
    r.restore(vec![pos]).expect("restore");
    let deadline = Instant::now() + Duration::from_secs(60);
    let err = loop {
        let mut batch = Vec::new();
        match r.poll(&mut batch, 10).await {
            Err(e) => break e.to_string(),
            Ok(SourcePoll::Idle(d)) => tokio::time::sleep(d).await,
            Ok(_) => {}
        }
        assert!(
            batch.is_empty(),
            "the source read past deleted input: {:?}",
            batch.iter().map(|m| m.offset).collect::<Vec<_>>()
        );
        assert!(
            Instant::now() < deadline,
            "no error for deleted input within 60 s"
        );
    };
    assert!(err.contains("DATA LOSS"), "{err}");
    assert!(err.contains("partition 0: offsets 20..100"), "{err}");
    assert!(err.contains("retention"), "{err}");
    b.shutdown().await;
}
