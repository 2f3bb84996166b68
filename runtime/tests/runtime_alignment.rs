//! Alignment end to end: a two-input operator fed by a fast and a slow source never processes
//! a post-barrier record before its snapshot. Each source logs its position at every barrier;
//! the operator logs how many records of each input it had processed at every snapshot; for
//! every checkpoint the numbers must be equal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceflow_runtime::state::OperatorSnapshot;
use onceflow_runtime::{
    async_trait, CheckpointId, JobConfig, Operator, Partitioning, Result, Sink, Source, SourcePoll,
    StreamEnvironment, SubtaskInfo, TwoInputs,
};

type Log = Arc<Mutex<BTreeMap<(CheckpointId, &'static str), u64>>>;

struct SeqSource {
    name: &'static str,
    next: u64,
    end: u64,
    per_poll: usize,
    pause: Duration,
    log: Log,
    /// After its last record the source idles until it has taken this checkpoint's barrier
    /// (the coordinator runs one checkpoint at a time, so every earlier one has finished):
    /// the job cannot end before the checkpoints the test counts, however loaded the machine.
    end_after_checkpoint: CheckpointId,
    last_checkpoint: CheckpointId,
}

#[async_trait]
impl Source<u64> for SeqSource {
    type Position = u64;

    fn restore(&mut self, _positions: Vec<u64>) -> Result<()> {
        Ok(())
    }

    async fn poll(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourcePoll> {
        for _ in 0..self.per_poll.min(max) {
            if self.next >= self.end {
                if self.last_checkpoint < self.end_after_checkpoint {
                    return Ok(SourcePoll::Idle(Duration::from_millis(1)));
                }
                return Ok(SourcePoll::Exhausted);
            }
            out.push(self.next);
            self.next += 1;
        }
        if self.pause.is_zero() {
            Ok(SourcePoll::Ready)
        } else {
            Ok(SourcePoll::Idle(self.pause))
        }
    }

    fn snapshot_position(&mut self, checkpoint: CheckpointId) -> Result<u64> {
        self.last_checkpoint = checkpoint;
        self.log
            .lock()
            .unwrap()
            .insert((checkpoint, self.name), self.next);
        Ok(self.next)
    }
}

struct CountingJoin {
    first: u64,
    second: u64,
    log: Log,
}

impl Operator<TwoInputs<u64, u64>, u64> for CountingJoin {
    fn process(&mut self, record: TwoInputs<u64, u64>, out: &mut Vec<u64>) -> Result<()> {
        match record {
            TwoInputs::First(v) => {
                assert_eq!(v, self.first, "first input in order");
                self.first += 1;
            }
            TwoInputs::Second(v) => {
                assert_eq!(v, self.second, "second input in order");
                self.second += 1;
            }
        }
        out.push(self.first + self.second);
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<OperatorSnapshot> {
        let mut log = self.log.lock().unwrap();
        log.insert((checkpoint, "op-first"), self.first);
        log.insert((checkpoint, "op-second"), self.second);
        Ok(OperatorSnapshot::default())
    }
}

struct Discard;

#[async_trait]
impl Sink<u64> for Discard {
    type Pending = ();
    async fn recover(&mut self, _p: Vec<()>) -> Result<()> {
        Ok(())
    }
    async fn write_batch(&mut self, _r: Vec<u64>) -> Result<()> {
        Ok(())
    }
    async fn pre_commit(&mut self, _c: CheckpointId) -> Result<Option<()>> {
        Ok(None)
    }
    async fn commit(&mut self, _c: CheckpointId, _p: ()) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self, _p: ()) -> Result<()> {
        Ok(())
    }
}

#[test]
fn alignment_with_skewed_inputs_snapshots_before_post_barrier_records() {
    let log: Log = Arc::new(Mutex::new(BTreeMap::new()));
    let config = JobConfig::new("alignment")
        .checkpoint_interval(Duration::from_millis(20))
        .parallelism(1);
    let env = StreamEnvironment::new(config);
    let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
    let fast = env.source("fast", move |_: &SubtaskInfo| {
        Ok(SeqSource {
            name: "fast",
            next: 0,
            end: 400_000,
            per_poll: 256,
            pause: Duration::ZERO,
            log: l1.clone(),
            end_after_checkpoint: 6,
            last_checkpoint: 0,
        })
    });
    let slow = env.source("slow", move |_: &SubtaskInfo| {
        Ok(SeqSource {
            name: "slow",
            next: 0,
            end: 300,
            per_poll: 1,
            pause: Duration::from_millis(3),
            log: l2.clone(),
            end_after_checkpoint: 6,
            last_checkpoint: 0,
        })
    });
    fast.add_two_input_operator(
        &slow,
        "join",
        Partitioning::Forward,
        Partitioning::Forward,
        move |_| {
            Ok(CountingJoin {
                first: 0,
                second: 0,
                log: l3.clone(),
            })
        },
    )
    .sink("discard", |_: &SubtaskInfo| Ok(Discard));
    let result = env.execute_blocking().expect("job runs");
    assert!(result.completed_checkpoints >= 5, "{result:?}");
    let log = log.lock().unwrap();
    let ids: Vec<CheckpointId> = log.keys().map(|(id, _)| *id).collect();
    for id in ids {
        assert_eq!(
            log.get(&(id, "fast")),
            log.get(&(id, "op-first")),
            "checkpoint {id}"
        );
        assert_eq!(
            log.get(&(id, "slow")),
            log.get(&(id, "op-second")),
            "checkpoint {id}"
        );
    }
}
