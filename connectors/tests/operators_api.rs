//! The typed API end to end on small inputs: union, filter, map, key_by + aggregate, and a
//! keyed co-process over two connected streams (an enrichment join with keyed state); plus a
//! sink whose pre-commit fails once: that checkpoint fails, the job does not, output stays
//! exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow_connectors::{CollectPending, CollectSink, CollectSinkWriter, MemorySource};
use onceflow_operators::{
    Connect, Filter, KeyBy, KeyedCoProcessFunction, KeyedContext, Map, Rebalance,
};
use onceflow_runtime::{
    async_trait, CheckpointId, Error, JobConfig, Result, Sink, SinkFactory, Source, SourceFactory,
    SourcePoll, StreamEnvironment, SubtaskInfo,
};

#[test]
fn union_filter_aggregate() {
    let env = StreamEnvironment::new(JobConfig::new("api").parallelism(3));
    let a = env.source("a", MemorySource::new((0..1000u64).collect()));
    let b = env
        .source("b", MemorySource::new((1000..2000u64).collect()))
        .set_parallelism(2);
    let sink = CollectSink::<(u64, u64, u64)>::new();
    a.union(&b)
        .rebalance(2)
        .filter(|x| x % 3 != 0)
        .map(|x| (x % 10, x))
        .key_by(|r: &(u64, u64)| r.0)
        .aggregate(
            || (0u64, 0u64),
            |acc: &mut (u64, u64), r: (u64, u64)| {
                acc.0 += 1;
                acc.1 += r.1;
            },
            |k: &u64, acc: &(u64, u64)| (*k, acc.0, acc.1),
        )
        .sink("collect", sink.clone());
    env.execute_blocking().expect("job");
    let mut got = BTreeMap::new();
    for (k, c, s) in sink.records() {
        let e = got.entry(k).or_insert((0, 0));
        if c > e.0 {
            *e = (c, s);
        }
    }
    let mut want = BTreeMap::new();
    for x in (0..2000u64).filter(|x| x % 3 != 0) {
        let e = want.entry(x % 10).or_insert((0u64, 0u64));
        e.0 += 1;
        e.1 += x;
    }
    assert_eq!(got, want);
}

#[derive(Clone)]
struct Enrich;

impl KeyedCoProcessFunction<u64, (u64, String), (u64, u64), (u64, String, u64)> for Enrich {
    fn process_first(
        &mut self,
        record: (u64, String),
        ctx: &mut KeyedContext<'_, u64, (u64, String, u64)>,
    ) -> Result<()> {
        let waiting = ctx.list::<u64>("waiting")?.take();
        ctx.value::<String>("name")?.set(record.1.clone());
        for amount in waiting {
            ctx.emit((record.0, record.1.clone(), amount));
        }
        Ok(())
    }

    fn process_second(
        &mut self,
        record: (u64, u64),
        ctx: &mut KeyedContext<'_, u64, (u64, String, u64)>,
    ) -> Result<()> {
        let name = ctx.value::<String>("name")?.get().cloned();
        match name {
            Some(n) => ctx.emit((record.0, n, record.1)),
            None => ctx.list::<u64>("waiting")?.push(record.1),
        }
        Ok(())
    }
}

#[test]
fn connect_keyed_co_process_joins_both_inputs() {
    let env = StreamEnvironment::new(
        JobConfig::new("join")
            .parallelism(2)
            .checkpoint_interval(Duration::from_millis(10)),
    );
    let names = env.source(
        "names",
        MemorySource::new((0..50u64).map(|k| (k, format!("user{k}"))).collect()),
    );
    let payments = env.source(
        "payments",
        MemorySource::new((0..5000u64).map(|i| (i % 50, i)).collect()),
    );
    let sink = CollectSink::<(u64, String, u64)>::new();
    names
        .connect(&payments)
        .key_by(|n: &(u64, String)| n.0, |p: &(u64, u64)| p.0)
        .process("enrich", Enrich)
        .sink("collect", sink.clone());
    env.execute_blocking().expect("job");
    let mut out = sink.records();
    out.sort_by_key(|r| r.2);
    assert_eq!(out.len(), 5000);
    for (i, (k, name, amount)) in out.into_iter().enumerate() {
        assert_eq!(amount, i as u64);
        assert_eq!(k, amount % 50);
        assert_eq!(name, format!("user{k}"));
    }
}

/// Fails the pre-commit of one checkpoint.
#[derive(Clone)]
struct FlakySink {
    inner: CollectSink<u64>,
    fail_at: CheckpointId,
}

struct FlakyWriter {
    inner: CollectSinkWriter<u64>,
    fail_at: CheckpointId,
}

#[async_trait]
impl Sink<u64> for FlakyWriter {
    type Pending = CollectPending<u64>;
    async fn recover(&mut self, p: Vec<CollectPending<u64>>) -> Result<()> {
        self.inner.recover(p).await
    }
    async fn write_batch(&mut self, r: Vec<u64>) -> Result<()> {
        self.inner.write_batch(r).await
    }
    async fn pre_commit(&mut self, c: CheckpointId) -> Result<Option<CollectPending<u64>>> {
        if c == self.fail_at {
            return Err(Error::Connector("injected pre-commit failure".into()));
        }
        self.inner.pre_commit(c).await
    }
    async fn commit(&mut self, c: CheckpointId, p: CollectPending<u64>) -> Result<()> {
        self.inner.commit(c, p).await
    }
    async fn abort(&mut self, p: CollectPending<u64>) -> Result<()> {
        self.inner.abort(p).await
    }
}

impl SinkFactory<u64> for FlakySink {
    type Sink = FlakyWriter;
    fn create(&self, info: &SubtaskInfo) -> Result<FlakyWriter> {
        Ok(FlakyWriter {
            inner: self.inner.create(info)?,
            fail_at: self.fail_at,
        })
    }
}

/// Wraps a source so that it ends only after it has taken checkpoint `n`'s barrier (one
/// checkpoint runs at a time, so every earlier one has finished): a test that counts
/// checkpoints of a bounded job gets them however fast or loaded the machine is.
struct EndAfterCheckpoint<F>(F, CheckpointId);

struct EndAfterCheckpointSource<S> {
    inner: S,
    end_after: CheckpointId,
    last: CheckpointId,
}

impl<T: Send + 'static, F: SourceFactory<T>> SourceFactory<T> for EndAfterCheckpoint<F> {
    type Source = EndAfterCheckpointSource<F::Source>;
    fn create(&self, info: &SubtaskInfo) -> Result<Self::Source> {
        Ok(EndAfterCheckpointSource {
            inner: self.0.create(info)?,
            end_after: self.1,
            last: 0,
        })
    }
}

#[async_trait]
impl<T: Send + 'static, S: Source<T>> Source<T> for EndAfterCheckpointSource<S> {
    type Position = S::Position;
    fn restore(&mut self, positions: Vec<S::Position>) -> Result<()> {
        self.inner.restore(positions)
    }
    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        match self.inner.poll(out, max).await? {
            SourcePoll::Exhausted if self.last < self.end_after => {
                Ok(SourcePoll::Idle(Duration::from_millis(1)))
            }
            other => Ok(other),
        }
    }
    fn snapshot_position(&mut self, checkpoint: CheckpointId) -> Result<S::Position> {
        self.last = checkpoint;
        self.inner.snapshot_position(checkpoint)
    }
}

#[test]
fn failing_pre_commit_fails_the_checkpoint_not_the_job() {
    let env = StreamEnvironment::new(
        JobConfig::new("flaky")
            .parallelism(2)
            .checkpoint_interval(Duration::from_millis(5)),
    );
    let inner = CollectSink::new();
    env.source(
        "numbers",
        EndAfterCheckpoint(
            onceflow_connectors::Generator::new(200_000, |i| i).rate_per_second(1_000_000.0),
            4,
        ),
    )
    .map(|x| x * 2)
    .sink(
        "flaky",
        FlakySink {
            inner: inner.clone(),
            fail_at: 2,
        },
    );
    let r = env.execute_blocking().expect("job survives");
    assert!(r.failed_checkpoints >= 1, "{r:?}");
    assert!(r.completed_checkpoints >= 2, "{r:?}");
    let mut out = inner.records();
    out.sort_unstable();
    assert_eq!(out, (0..200_000u64).map(|x| x * 2).collect::<Vec<_>>());
}

/// A keyed operator tells whether its key stream declared a route: a scaled-out job refuses
/// the ones without (their state could not be placed in the changelog).
#[test]
fn keyed_operators_without_a_route_are_listed() {
    let env = StreamEnvironment::new(JobConfig::new("routes").parallelism(2));
    let input = env.source("in", MemorySource::new((0..10u64).collect()));
    let sum = |acc: &mut u64, r: u64| *acc += r;
    input
        .key_by(|r: &u64| r % 3)
        .aggregate(|| 0u64, sum, |_: &u64, acc: &u64| *acc);
    input
        .key_by(|r: &u64| r % 5)
        .routed_by(|k: &u64| k.to_be_bytes().to_vec())
        .aggregate(|| 0u64, sum, |_: &u64, acc: &u64| *acc);
    input.map(|r| r + 1).rebalance(2).filter(|r| r % 2 == 0);
    assert_eq!(env.key_routes().len(), 1, "one operator declared a route");
    let unrouted = env.keyed_operators_without_route();
    assert_eq!(unrouted.len(), 1, "{unrouted:?}");
    assert!(unrouted[0].contains("aggregate"), "{unrouted:?}");
}
