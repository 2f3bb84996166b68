//! Watermark strategies: how a source derives event-time watermarks from its records.
//!
//! A [`WatermarkStrategy`] names a record's timestamp, a [`WatermarkGenerator`] per split
//! (bounded out-of-orderness, or your own), an optional split function (records of one
//! split/partition are tracked on their own and the source's watermark is the minimum over
//! its splits) and an optional idle timeout (a split without records for that long no longer
//! holds the minimum back). Wrap any source factory with
//! [`SourceWatermarks::with_watermarks`]; the runtime forwards the source's watermark
//! downstream as a [`crate::StreamElement::Watermark`], and every operator's input gate
//! combines its inputs' watermarks by minimum.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connector::{Source, SourceFactory, SourcePoll, SubtaskInfo};
use crate::element::{CheckpointId, Watermark};
use crate::Result;

/// Generates watermarks for one split from the timestamps seen in it (a custom strategy
/// implements this).
pub trait WatermarkGenerator: Send + 'static {
    /// A record with event time `timestamp` (ms) was read.
    fn on_event(&mut self, timestamp: i64);
    /// The current watermark of this split (`None`: none yet).
    fn current(&self) -> Option<Watermark>;
}

/// Watermark = highest timestamp seen − `max_out_of_orderness` − 1 (Flink's rule: a record
/// exactly `max_out_of_orderness` behind the maximum is still on time).
#[derive(Clone, Copy, Debug)]
pub struct BoundedOutOfOrderness {
    max_out_of_orderness_ms: i64,
    max_seen: Option<i64>,
}

impl BoundedOutOfOrderness {
    /// Records may arrive up to `bound` behind the highest timestamp seen.
    pub fn new(bound: Duration) -> Self {
        BoundedOutOfOrderness {
            max_out_of_orderness_ms: i64::try_from(bound.as_millis()).unwrap_or(i64::MAX),
            max_seen: None,
        }
    }
}

impl WatermarkGenerator for BoundedOutOfOrderness {
    fn on_event(&mut self, timestamp: i64) {
        self.max_seen = Some(self.max_seen.map_or(timestamp, |m| m.max(timestamp)));
    }

    fn current(&self) -> Option<Watermark> {
        self.max_seen.map(|m| {
            Watermark(
                m.saturating_sub(self.max_out_of_orderness_ms)
                    .saturating_sub(1),
            )
        })
    }
}

type GeneratorFactory = Arc<dyn Fn() -> Box<dyn WatermarkGenerator> + Send + Sync>;
type SplitFn<T> = Arc<dyn Fn(&T) -> u32 + Send + Sync>;

/// How a source assigns timestamps and generates watermarks.
pub struct WatermarkStrategy<T> {
    timestamp: Arc<dyn Fn(&T) -> i64 + Send + Sync>,
    generator: GeneratorFactory,
    split: Option<SplitFn<T>>,
    idle_timeout: Option<Duration>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp: self.timestamp.clone(),
            generator: self.generator.clone(),
            split: self.split.clone(),
            idle_timeout: self.idle_timeout,
        }
    }
}

impl<T> WatermarkStrategy<T> {
    /// Bounded out-of-orderness: records may be up to `bound` late relative to the highest
    /// timestamp of their split; `timestamp` gives a record's event time (ms).
    pub fn bounded_out_of_orderness(
        bound: Duration,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> Self {
        Self::custom(move || BoundedOutOfOrderness::new(bound), timestamp)
    }

    /// A custom generator, created once per split.
    pub fn custom<G: WatermarkGenerator>(
        generator: impl Fn() -> G + Send + Sync + 'static,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> Self {
        WatermarkStrategy {
            timestamp: Arc::new(timestamp),
            generator: Arc::new(move || Box::new(generator()) as Box<dyn WatermarkGenerator>),
            split: None,
            idle_timeout: None,
        }
    }

    /// Tracks a watermark per split (e.g. Kafka partition) named by `split(record)`; the
    /// source's watermark is the minimum over its active splits. Splits the source declares
    /// ([`crate::Source::splits`], e.g. the Kafka source's partition numbers) count from the
    /// start, so `split` must name them the same way (for Kafka: the partition).
    pub fn with_splits(mut self, split: impl Fn(&T) -> u32 + Send + Sync + 'static) -> Self {
        self.split = Some(Arc::new(split));
        self
    }

    /// A split with no record for `timeout` (processing time) is idle: it no longer holds
    /// the minimum back until it produces a record again.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// The event time of `record`.
    pub fn timestamp_of(&self, record: &T) -> i64 {
        (self.timestamp)(record)
    }

    /// A fresh per-split tracker for one source subtask.
    pub fn tracker(&self) -> SplitWatermarks {
        SplitWatermarks::new(self.generator.clone(), self.idle_timeout)
    }
}

struct SplitState {
    generator: Box<dyn WatermarkGenerator>,
    last_event: Instant,
    /// The highest event time read from the split (or resumed from a checkpoint).
    max_event_time: Option<i64>,
}

/// Per-split watermarks of one source subtask, combined by minimum over the splits that
/// are not idle. The combined watermark never goes back.
pub struct SplitWatermarks {
    factory: GeneratorFactory,
    idle_timeout: Option<Duration>,
    splits: BTreeMap<u32, SplitState>,
    emitted: Option<Watermark>,
}

impl SplitWatermarks {
    fn new(factory: GeneratorFactory, idle_timeout: Option<Duration>) -> Self {
        SplitWatermarks {
            factory,
            idle_timeout,
            splits: BTreeMap::new(),
            emitted: None,
        }
    }

    /// Declares a split before its first record (so it holds the watermark back from the
    /// start, until it is idle).
    pub fn register_split(&mut self, split: u32, now: Instant) {
        let factory = &self.factory;
        self.splits.entry(split).or_insert_with(|| SplitState {
            generator: factory(),
            last_event: now,
            max_event_time: None,
        });
    }

    /// A record with `timestamp` was read from `split`.
    pub fn on_event(&mut self, split: u32, timestamp: i64, now: Instant) {
        self.register_split(split, now);
        if let Some(s) = self.splits.get_mut(&split) {
            s.generator.on_event(timestamp);
            s.last_event = now;
            s.max_event_time = Some(s.max_event_time.map_or(timestamp, |m| m.max(timestamp)));
        }
    }

    /// `split` was read up to event time `event_time` before a restore (a checkpoint's or
    /// an offset commit's record of it): its generator sees that time as a record, so its
    /// watermark resumes there, as a record read again would set it. Does not count as
    /// activity for idleness.
    pub fn resume(&mut self, split: u32, event_time: i64, now: Instant) {
        self.register_split(split, now);
        if let Some(s) = self.splits.get_mut(&split) {
            if s.max_event_time.is_none_or(|m| event_time > m) {
                s.generator.on_event(event_time);
                s.max_event_time = Some(event_time);
            }
        }
    }

    /// The highest event time of every split that has one.
    pub fn event_times(&self) -> Vec<(u32, i64)> {
        self.splits
            .iter()
            .filter_map(|(id, s)| s.max_event_time.map(|t| (*id, t)))
            .collect()
    }

    /// Whether `split` is idle at `now`.
    pub fn is_idle(&self, split: u32, now: Instant) -> bool {
        match (self.splits.get(&split), self.idle_timeout) {
            (Some(s), Some(t)) => now.saturating_duration_since(s.last_event) >= t,
            _ => false,
        }
    }

    /// Whether every known split is idle at `now` (false when no split is known).
    pub fn all_idle(&self, now: Instant) -> bool {
        !self.splits.is_empty() && self.splits.keys().all(|id| self.is_idle(*id, now))
    }

    /// The combined watermark at `now`: the minimum over active splits (an active split
    /// without a watermark yet holds everything back), never below what was returned before.
    pub fn current(&mut self, now: Instant) -> Option<Watermark> {
        let mut min: Option<Watermark> = None;
        for (id, s) in &self.splits {
            if self.is_idle(*id, now) {
                continue;
            }
            match s.generator.current() {
                None => return self.emitted,
                Some(w) => min = Some(min.map_or(w, |m| m.min(w))),
            }
        }
        if let Some(m) = min {
            if self.emitted.is_none_or(|e| m > e) {
                self.emitted = Some(m);
            }
        }
        self.emitted
    }
}

/// A source whose records pass through a [`WatermarkStrategy`].
pub struct WatermarkedSource<S, T> {
    inner: S,
    strategy: WatermarkStrategy<T>,
    tracker: SplitWatermarks,
}

#[crate::async_trait]
impl<T: Send + 'static, S: Source<T>> Source<T> for WatermarkedSource<S, T> {
    type Position = S::Position;

    fn restore(&mut self, positions: Vec<Self::Position>) -> Result<()> {
        self.inner.restore(positions)?;
        if let Some(kept) = self.inner.kept_event_times() {
            self.resume(kept);
        }
        Ok(())
    }

    async fn poll(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        let before = out.len();
        let status = self.inner.poll(out, max).await?;
        let now = Instant::now();
        for r in &out[before..] {
            let split = self.strategy.split.as_ref().map_or(0, |f| f(r));
            self.tracker
                .on_event(split, self.strategy.timestamp_of(r), now);
        }
        Ok(status)
    }

    fn snapshot_position(&mut self, checkpoint: CheckpointId) -> Result<Self::Position> {
        if self.strategy.split.is_some() {
            self.inner.keep_event_times(&self.tracker.event_times());
        }
        self.inner.snapshot_position(checkpoint)
    }

    fn event_times(&mut self) -> Vec<(u32, i64)> {
        if self.strategy.split.is_some() {
            self.tracker.event_times()
        } else {
            Vec::new()
        }
    }

    fn resume_event_times(&mut self, times: Vec<(u32, i64)>) {
        // a source whose position is kept outside the checkpoint resumed from the event times
        // kept with it
        if self.inner.kept_event_times().is_none() {
            self.resume(times);
        }
    }

    fn current_watermark(&mut self) -> Option<Watermark> {
        let own = self.tracker.current(Instant::now());
        match (own, self.inner.current_watermark()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn is_idle(&mut self) -> bool {
        self.tracker.all_idle(Instant::now()) || self.inner.is_idle()
    }

    fn checkpoint_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.inner.checkpoint_complete(checkpoint)
    }
}

impl<T: Send + 'static, S: Source<T>> WatermarkedSource<S, T> {
    /// Resumes the event time of the splits this subtask reads (with a per-split strategy
    /// only: a split of another subtask would hold this one's watermark back for good, and
    /// without splits the times of several partitions cannot be told apart).
    fn resume(&mut self, times: Vec<(u32, i64)>) {
        if self.strategy.split.is_none() || times.is_empty() {
            return;
        }
        let own = self.inner.splits();
        let now = Instant::now();
        let resumed: Vec<(u32, i64)> = times
            .into_iter()
            .filter(|(split, _)| own.contains(split))
            .collect();
        for (split, t) in &resumed {
            self.tracker.resume(*split, *t, now);
        }
        if !resumed.is_empty() {
            tracing::info!(splits = ?resumed, "event time resumed from the stored position (split, ms)");
        }
    }
}

/// A source factory whose subtasks generate watermarks.
pub struct WatermarkedSourceFactory<F, T> {
    inner: F,
    strategy: WatermarkStrategy<T>,
}

impl<T: Send + 'static, F: SourceFactory<T>> SourceFactory<T> for WatermarkedSourceFactory<F, T> {
    type Source = WatermarkedSource<F::Source, T>;

    fn create(&self, info: &SubtaskInfo) -> Result<Self::Source> {
        let inner = self.inner.create(info)?;
        let mut tracker = self.strategy.tracker();
        if self.strategy.split.is_some() {
            // the source's splits hold the watermark back before their first record
            let now = Instant::now();
            for split in inner.splits() {
                tracker.register_split(split, now);
            }
        }
        let mut source = WatermarkedSource {
            inner,
            strategy: self.strategy.clone(),
            tracker,
        };
        // a source that starts from a position kept outside the checkpoint knows its event
        // times already
        if let Some(kept) = source.inner.kept_event_times() {
            source.resume(kept);
        }
        Ok(source)
    }
}

/// Adds watermark generation to any source factory.
pub trait SourceWatermarks<T>: SourceFactory<T> + Sized {
    /// Subtasks of this source emit watermarks according to `strategy`.
    fn with_watermarks(self, strategy: WatermarkStrategy<T>) -> WatermarkedSourceFactory<Self, T> {
        WatermarkedSourceFactory {
            inner: self,
            strategy,
        }
    }
}

impl<T, F: SourceFactory<T>> SourceWatermarks<T> for F {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_out_of_orderness_trails_the_maximum() {
        let mut g = BoundedOutOfOrderness::new(Duration::from_millis(10));
        assert_eq!(g.current(), None);
        g.on_event(100);
        g.on_event(50);
        assert_eq!(g.current(), Some(Watermark(89)));
    }

    #[test]
    fn splits_combine_by_minimum_and_idle_splits_stop_counting() {
        let s = WatermarkStrategy::<(u32, i64)>::bounded_out_of_orderness(Duration::ZERO, |r| r.1)
            .with_splits(|r| r.0)
            .with_idleness(Duration::from_secs(5));
        let mut t = s.tracker();
        let t0 = Instant::now();
        t.on_event(0, 100, t0);
        t.on_event(1, 20, t0);
        assert_eq!(t.current(t0), Some(Watermark(19)));
        t.on_event(0, 200, t0 + Duration::from_secs(4));
        assert_eq!(t.current(t0 + Duration::from_secs(4)), Some(Watermark(19)));
        // split 1 has been quiet for 5 s: idle
        assert_eq!(t.current(t0 + Duration::from_secs(5)), Some(Watermark(199)));
        // it wakes up behind: the combined watermark does not go back
        t.on_event(1, 30, t0 + Duration::from_secs(6));
        assert_eq!(t.current(t0 + Duration::from_secs(6)), Some(Watermark(199)));
    }

    #[test]
    fn a_registered_split_without_records_holds_back_until_idle() {
        let s = WatermarkStrategy::<i64>::bounded_out_of_orderness(Duration::ZERO, |r| *r)
            .with_idleness(Duration::from_secs(1));
        let mut t = s.tracker();
        let t0 = Instant::now();
        t.register_split(7, t0);
        t.on_event(0, 10, t0);
        assert_eq!(t.current(t0), None);
        let t1 = t0 + Duration::from_secs(1);
        t.on_event(0, 10, t1);
        assert_eq!(t.current(t1), Some(Watermark(9)));
        assert!(!t.all_idle(t1));
        assert!(t.all_idle(t1 + Duration::from_secs(1)));
    }

    #[test]
    fn a_resumed_split_starts_at_its_event_time_and_never_goes_back() {
        let s = WatermarkStrategy::<(u32, i64)>::bounded_out_of_orderness(
            Duration::from_millis(10),
            |r| r.1,
        )
        .with_splits(|r| r.0);
        let mut t = s.tracker();
        let t0 = Instant::now();
        t.resume(0, 1_000, t0);
        t.register_split(1, t0);
        // split 1 has neither a record nor a resumed time: it holds back
        assert_eq!(t.current(t0), None);
        t.resume(1, 500, t0);
        assert_eq!(t.current(t0), Some(Watermark(489)));
        // a lower resumed time or an older record changes nothing
        t.resume(1, 100, t0);
        t.on_event(1, 300, t0);
        assert_eq!(t.current(t0), Some(Watermark(489)));
        t.on_event(1, 2_000, t0);
        assert_eq!(t.current(t0), Some(Watermark(989)));
        assert_eq!(t.event_times(), vec![(0, 1_000), (1, 2_000)]);
    }

    /// A source of two splits; every record comes from split 0. With `outside`, its position
    /// is kept outside the checkpoint, with those event times; it remembers the event times it
    /// was handed to keep.
    #[derive(Default)]
    struct TwoSplits {
        outside: Option<Vec<(u32, i64)>>,
        kept: Vec<(u32, i64)>,
    }

    #[crate::async_trait]
    impl Source<(u32, i64)> for TwoSplits {
        type Position = ();
        fn restore(&mut self, _: Vec<()>) -> Result<()> {
            Ok(())
        }
        async fn poll(&mut self, out: &mut Vec<(u32, i64)>, _max: usize) -> Result<SourcePoll> {
            out.push((0, 1_000));
            Ok(SourcePoll::Ready)
        }
        fn snapshot_position(&mut self, _: CheckpointId) -> Result<()> {
            Ok(())
        }
        fn splits(&self) -> Vec<u32> {
            vec![0, 1]
        }
        fn keep_event_times(&mut self, times: &[(u32, i64)]) {
            self.kept = times.to_vec();
        }
        fn kept_event_times(&self) -> Option<Vec<(u32, i64)>> {
            self.outside.clone()
        }
    }

    fn info() -> SubtaskInfo {
        SubtaskInfo {
            job_name: "j".into(),
            operator: "src".into(),
            node_uid: "src".into(),
            index: 0,
            parallelism: 1,
            max_parallelism: 128,
            restored_checkpoint: 0,
        }
    }

    fn by_split() -> WatermarkStrategy<(u32, i64)> {
        WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |r: &(u32, i64)| r.1)
            .with_splits(|r| r.0)
    }

    #[tokio::test]
    async fn restored_event_times_release_a_split_without_records() {
        let factory = (|_: &SubtaskInfo| Ok(TwoSplits::default())).with_watermarks(by_split());
        let mut source = factory.create(&info()).unwrap();
        source.restore(Vec::new()).unwrap();
        // split 7 is not this subtask's: its time is left out (it would hold back for good)
        source.resume_event_times(vec![(1, 5_000), (7, 10)]);
        let mut out = Vec::new();
        source.poll(&mut out, 10).await.unwrap();
        assert_eq!(source.current_watermark(), Some(Watermark(999)));
        assert_eq!(source.event_times(), vec![(0, 1_000), (1, 5_000)]);
    }

    #[tokio::test]
    async fn a_source_that_keeps_its_position_outside_resumes_from_its_own_event_times() {
        let factory = (|_: &SubtaskInfo| {
            Ok(TwoSplits {
                outside: Some(vec![(1, 3_000)]),
                ..TwoSplits::default()
            })
        })
        .with_watermarks(by_split());
        let mut source = factory.create(&info()).unwrap();
        source.restore(Vec::new()).unwrap();
        // the checkpoint's times are ignored: its positions are not where the source starts
        source.resume_event_times(vec![(1, 9_000)]);
        let mut out = Vec::new();
        source.poll(&mut out, 10).await.unwrap();
        assert_eq!(source.current_watermark(), Some(Watermark(999)));
        source.snapshot_position(1).unwrap();
        assert_eq!(source.inner.kept, vec![(0, 1_000), (1, 3_000)]);
    }

    #[tokio::test]
    async fn declared_splits_hold_the_watermark_back_before_their_first_record() {
        let factory = (|_: &SubtaskInfo| Ok(TwoSplits::default())).with_watermarks(by_split());
        let mut source = factory.create(&info()).unwrap();
        let mut out = Vec::new();
        source.poll(&mut out, 10).await.unwrap();
        // split 1 was declared but has not delivered a record: no watermark yet
        assert_eq!(source.current_watermark(), None);
    }
}
