//! Group membership of scaled-out instances (`scale::GroupMember`) against the bundled broker
//! with the real client: cooperative-sticky moves only the partitions that must move, a
//! partition is never handed to a new owner before its old owner's revoke callback (where the
//! instance commits what is open for it) has returned, and while that callback runs the
//! partition is still owned but no longer kept for a dataflow built meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use onceflow_connectors::kafka::scale::{
    GroupMember, MemberConfig, RebalanceListener, TopicPartition,
};
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "work";
const PARTITIONS: i32 = 6;

#[derive(Clone, Debug)]
enum Kind {
    Assigned,
    RevokeStarted,
    RevokeDone,
}

#[derive(Clone, Debug)]
struct Event {
    member: String,
    kind: Kind,
    partitions: Vec<i32>,
}

/// Every member's rebalance events in the order they happened.
#[derive(Default)]
struct Log(Mutex<Vec<Event>>);

impl Log {
    fn push(&self, member: &str, kind: Kind, partitions: &[TopicPartition]) {
        self.0.lock().push(Event {
            member: member.to_string(),
            kind,
            partitions: partitions.iter().map(|p| p.partition).collect(),
        });
    }

    /// Replays the log: who owns each partition now. Panics if a partition was assigned to a
    /// member while another still owned it (its revoke callback had not returned).
    fn owners(&self) -> BTreeMap<i32, String> {
        let mut owner: BTreeMap<i32, String> = BTreeMap::new();
        for e in self.0.lock().iter() {
            for p in &e.partitions {
                match e.kind {
                    Kind::Assigned => {
                        if let Some(old) = owner.get(p) {
                            panic!(
                                "partition {p} assigned to {} while {old} still owned it",
                                e.member
                            );
                        }
                        owner.insert(*p, e.member.clone());
                    }
                    Kind::RevokeStarted => {}
                    Kind::RevokeDone => {
                        assert_eq!(owner.remove(p).as_deref(), Some(e.member.as_str()));
                    }
                }
            }
        }
        owner
    }

    fn partitions_of(&self, member: &str) -> BTreeSet<i32> {
        self.owners()
            .into_iter()
            .filter(|(_, m)| m == member)
            .map(|(p, _)| p)
            .collect()
    }

    /// Waits until the members own `want` partitions each and every partition is owned.
    fn wait_balanced(&self, want: &[(&str, usize)]) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let owners = self.owners();
            let balanced = owners.len() == PARTITIONS as usize
                && want
                    .iter()
                    .all(|(m, n)| owners.values().filter(|o| o.as_str() == *m).count() == *n);
            if balanced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "group not balanced as {want:?} within 90 s: {owners:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

struct Listener {
    member: String,
    log: Arc<Log>,
    /// The member this listener belongs to, to look at from inside its callbacks.
    handle: OnceLock<Weak<GroupMember>>,
    /// What the member said during each revoke callback: partitions revoked but not owned
    /// any more, or still kept for a new dataflow (both wrong).
    revoke_faults: Arc<Mutex<Vec<String>>>,
}

impl RebalanceListener for Listener {
    fn revoking(&self, partitions: &[TopicPartition], _lost: bool) {
        self.log.push(&self.member, Kind::RevokeStarted, partitions);
        // the instance's dataflow loop may build its next dataflow while this runs: the
        // partitions are still owned (what is open for them is committed here) but not kept
        if let Some(member) = self.handle.get().and_then(Weak::upgrade) {
            let kept = member.kept();
            for p in partitions {
                if member.assignment_of(p).is_none() {
                    self.revoke_faults.lock().push(format!(
                        "{}: {p} not owned during its revoke callback",
                        self.member
                    ));
                }
                if kept.contains_key(p) {
                    self.revoke_faults.lock().push(format!(
                        "{}: {p} kept during its revoke callback",
                        self.member
                    ));
                }
            }
        }
        self.log.push(&self.member, Kind::RevokeDone, partitions);
    }

    fn assigned(&self, partitions: &[TopicPartition]) {
        self.log.push(&self.member, Kind::Assigned, partitions);
    }
}

struct Instance {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

fn start(
    brokers: &str,
    name: &str,
    log: &Arc<Log>,
    revoke_faults: &Arc<Mutex<Vec<String>>>,
) -> Instance {
    let mut config = MemberConfig::new(brokers, "scale-group", vec![TOPIC.into()], name);
    config.session_timeout = Duration::from_secs(6);
    let listener = Arc::new(Listener {
        member: name.to_string(),
        log: log.clone(),
        handle: OnceLock::new(),
        revoke_faults: revoke_faults.clone(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let member = Arc::new(GroupMember::join(&config, listener.clone()).expect("joins"));
        let _ = listener.handle.set(Arc::downgrade(&member));
        while !stopping.load(Ordering::SeqCst) {
            if let Some(Err(e)) = member.poll(Duration::from_millis(50)) {
                eprintln!("member poll: {e}");
            }
        }
        member.close();
    });
    Instance { stop, thread }
}

impl Instance {
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("member thread");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_moves_only_what_must_move_and_revokes_before_reassigning() {
    let broker = onceflow_testkit::inproc::start_broker(PARTITIONS).await;
    let brokers = broker.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("producer");
    for p in 0..PARTITIONS {
        producer
            .send(BaseRecord::<(), str>::to(TOPIC).partition(p).payload("x"))
            .expect("queued");
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("topic created");

    let log = Arc::new(Log::default());
    let revoke_faults = Arc::new(Mutex::new(Vec::new()));
    let a = start(&brokers, "a", &log, &revoke_faults);
    let b = start(&brokers, "b", &log, &revoke_faults);
    log.wait_balanced(&[("a", 3), ("b", 3)]);
    let before_a = log.partitions_of("a");
    let before_b = log.partitions_of("b");

    let seen_before_c = log.0.lock().len();
    let c = start(&brokers, "c", &log, &revoke_faults);
    log.wait_balanced(&[("a", 2), ("b", 2), ("c", 2)]);
    assert!(
        log.partitions_of("a").is_subset(&before_a) && log.partitions_of("b").is_subset(&before_b),
        "a and b only give partitions up when c joins: a {before_a:?} -> {:?}, b {before_b:?} -> {:?}",
        log.partitions_of("a"),
        log.partitions_of("b")
    );
    let revoked_by_ab: usize = log
        .0
        .lock()
        .iter()
        .skip(seen_before_c)
        .filter(|e| matches!(e.kind, Kind::RevokeDone) && e.member != "c")
        .map(|e| e.partitions.len())
        .sum();
    assert_eq!(revoked_by_ab, 2, "exactly c's two partitions moved");

    let c_had = log.partitions_of("c");
    c.stop();
    log.wait_balanced(&[("a", 3), ("b", 3)]);
    let now_ab: BTreeSet<i32> = log
        .partitions_of("a")
        .union(&log.partitions_of("b"))
        .copied()
        .collect();
    assert!(c_had.is_subset(&now_ab));

    a.stop();
    b.stop();
    // the replay in owners() checked on every call that no partition ever had two owners
    assert!(
        log.owners().is_empty(),
        "closed members released everything"
    );
    let revokes = log
        .0
        .lock()
        .iter()
        .filter(|e| matches!(e.kind, Kind::RevokeStarted) && !e.partitions.is_empty())
        .count();
    assert!(
        revokes >= 3,
        "the scenario revoked partitions ({revokes} callbacks)"
    );
    assert_eq!(*revoke_faults.lock(), Vec::<String>::new());
}
