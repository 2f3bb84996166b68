//! Timers in the keyed process function, end to end through the runtime: event-time timers
//! fire once (deduplicated) per key and timestamp, in timestamp order, when the watermark
//! reaches them; processing-time timers fire by the wall clock.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow_connectors::{CollectSink, Generator, MemorySource};
use onceflow_operators::{KeyBy, TimeDomain, WithTimers};
use onceflow_runtime::{JobConfig, SourceWatermarks, StreamEnvironment, WatermarkStrategy};

#[test]
fn event_time_timers_fire_once_in_order_per_key() {
    // (key, ts): every record registers a timer at the end of its 100 ms bucket
    let records: Vec<(u32, i64)> = (0..2000i64).map(|i| ((i % 7) as u32, i * 3)).collect();
    let env = StreamEnvironment::new(JobConfig::new("timers").parallelism(2));
    let sink = CollectSink::new();
    env.source(
        "records",
        MemorySource::new(records.clone())
            .splits(4)
            .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(
                Duration::ZERO,
                |r: &(u32, i64)| r.1,
            )),
    )
    .key_by(|r: &(u32, i64)| r.0)
    .process(
        "bucket-timers",
        WithTimers {
            process: |r: (u32, i64), ctx: &mut onceflow_operators::KeyedContext<'_, u32, _>| {
                let end = (r.1 / 100 + 1) * 100 - 1;
                ctx.register_event_time_timer(end)?;
                ctx.register_event_time_timer(end) // a duplicate is ignored
            },
            on_timer: |ts: i64,
                       domain: TimeDomain,
                       ctx: &mut onceflow_operators::KeyedContext<
                '_,
                u32,
                (u32, i64, Option<i64>),
            >| {
                assert_eq!(domain, TimeDomain::EventTime);
                let wm = ctx.current_watermark();
                ctx.emit((*ctx.key(), ts, wm));
                Ok(())
            },
        },
    )
    .sink("out", sink.clone());
    env.execute_blocking().expect("job");
    let fired = sink.records();
    let mut per_key: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for (k, ts, wm) in &fired {
        assert!(
            wm.is_some_and(|w| w >= *ts),
            "fired at {ts} before the watermark {wm:?}"
        );
        per_key.entry(*k).or_default().push(*ts);
    }
    for k in 0..7u32 {
        let mut want: Vec<i64> = records
            .iter()
            .filter(|r| r.0 == k)
            .map(|r| (r.1 / 100 + 1) * 100 - 1)
            .collect();
        want.dedup();
        assert_eq!(per_key.get(&k), Some(&want), "key {k}: once each, in order");
    }
}

#[test]
fn processing_time_timers_fire_by_the_wall_clock() {
    let env = StreamEnvironment::new(JobConfig::new("ptimers").parallelism(1));
    let sink = CollectSink::new();
    // 60 records over ~600 ms: the job runs long enough for the 50 ms timers to fire
    env.source(
        "records",
        Generator::new(60, |i| (i % 3) as u32).rate_per_second(100.0),
    )
    .key_by(|r: &u32| *r)
    .process(
        "delay",
        WithTimers {
            process: |_r: u32, ctx: &mut onceflow_operators::KeyedContext<'_, u32, _>| {
                let at = ctx.current_processing_time() + 50;
                ctx.register_processing_time_timer(at)
            },
            on_timer:
                |ts: i64,
                 domain: TimeDomain,
                 ctx: &mut onceflow_operators::KeyedContext<'_, u32, (u32, bool)>| {
                    let on_time = ctx.current_processing_time() >= ts;
                    ctx.emit((*ctx.key(), on_time && domain == TimeDomain::ProcessingTime));
                    Ok(())
                },
        },
    )
    .sink("out", sink.clone());
    env.execute_blocking().expect("job");
    let got = sink.records();
    // timers still pending at the end of input are not fired; those that fired did so on time
    assert!(
        got.len() >= 10,
        "only {} processing-time timers fired",
        got.len()
    );
    assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");
}
