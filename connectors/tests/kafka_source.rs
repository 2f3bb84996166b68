//! KafkaSource against the in-process broker: partitions spread over subtasks, positions
//! snapshotted and restored (a restored reader continues where the snapshot was taken).

mod kafka_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_support::{broker, info, produce};
use onceflow_connectors::kafka::{Decoder, KafkaMessage, KafkaSource};
use onceflow_runtime::{Source, SourceFactory, SourcePoll};

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
    let b = broker(4).await;
    let brokers = b.bootstrap_servers();
    let values: Vec<String> = (0..200).map(|i| format!("v{i}")).collect();
    produce(&brokers, "src", 4, &values);

    // two subtasks: partitions {0, 2} and {1, 3}
    let factory = KafkaSource::new(brokers.clone(), "src", Decoder::raw());
    let mut s0 = factory.create(&info(0, 2, 0)).expect("create 0");
    let mut s1 = factory.create(&info(1, 2, 0)).expect("create 1");
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
    let mut r = factory.create(&info(0, 1, 1)).expect("create restored");
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
