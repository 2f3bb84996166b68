//! Property tests: the window operator (tumbling, sliding, session; reduce, aggregate and
//! process functions) against a brute-force oracle, over random out-of-order streams with
//! random watermark lags, with and without allowed lateness, and with a snapshot + restore
//! into a fresh operator at a random point.

use std::collections::BTreeMap;
use std::sync::Arc;

use onceflow_operators::window::{
    Aggregate, AggregateFunction, Process, Reduce, Window, WindowAssigner, WindowFunction,
    WindowOperator, WindowOutput, WindowSpec,
};
use onceflow_runtime::state::RestoredState;
use onceflow_runtime::{Operator, SubtaskInfo, Watermark};
use proptest::prelude::*;

type Rec = (u8, i64, u32);

#[derive(Clone, Debug)]
enum Ev {
    Rec(Rec),
    Wm(i64),
}

/// One firing as the oracle sees it: key, window, the window's values (sorted).
type Firing = (u8, Window, Vec<u32>);

fn info() -> SubtaskInfo {
    SubtaskInfo {
        job_name: "t".into(),
        operator: "w".into(),
        node_uid: "n00-w".into(),
        index: 0,
        parallelism: 1,
        max_parallelism: 16,
        restored_checkpoint: 0,
    }
}

/// Windows containing `ts`, found by scanning every candidate start (independent of the
/// assigner's arithmetic).
fn brute_windows(a: WindowAssigner, ts: i64) -> Vec<Window> {
    let (size, slide) = match a {
        WindowAssigner::Tumbling { size, .. } => (size, size),
        WindowAssigner::Sliding { size, slide } => (size, slide),
        WindowAssigner::Session { gap } => {
            return vec![Window {
                start: ts,
                end: ts + gap,
            }]
        }
    };
    (ts - size - slide..=ts)
        .filter(|s| s.rem_euclid(slide) == 0 && *s <= ts && ts < s + size)
        .map(|s| Window {
            start: s,
            end: s + size,
        })
        .collect()
}

fn max_ts(w: &Window) -> i64 {
    w.end - 1
}

/// Sessions of a key's live records: connected components of `[ts, ts + gap)`.
fn sessions(records: &[(i64, u32)], gap: i64) -> Vec<(Window, Vec<u32>)> {
    let mut sorted = records.to_vec();
    sorted.sort();
    let mut out: Vec<(Window, Vec<u32>)> = Vec::new();
    for (ts, v) in sorted {
        match out.last_mut() {
            Some((w, vals)) if ts < w.end => {
                w.end = w.end.max(ts + gap);
                vals.push(v);
            }
            _ => out.push((
                Window {
                    start: ts,
                    end: ts + gap,
                },
                vec![v],
            )),
        }
    }
    out
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort();
    v
}

/// Brute force: what the operator must emit (firings as multisets; late records in order).
fn oracle(events: &[Ev], a: WindowAssigner, lateness: i64) -> (Vec<Firing>, Vec<Rec>) {
    let mut fired = Vec::new();
    let mut late = Vec::new();
    let mut wm: Option<i64> = None;
    let is_late =
        |w: &Window, wm: Option<i64>| wm.is_some_and(|wm| max_ts(w).saturating_add(lateness) <= wm);
    if let WindowAssigner::Session { gap } = a {
        let mut live: BTreeMap<u8, Vec<(i64, u32)>> = BTreeMap::new();
        for ev in events {
            match *ev {
                Ev::Rec((k, ts, v)) => {
                    let recs = live.entry(k).or_default();
                    let own = Window {
                        start: ts,
                        end: ts + gap,
                    };
                    let overlaps = sessions(recs, gap).iter().any(|(w, _)| w.intersects(&own));
                    if !overlaps && is_late(&own, wm) {
                        late.push((k, ts, v));
                        continue;
                    }
                    recs.push((ts, v));
                    let (w, vals) = sessions(recs, gap)
                        .into_iter()
                        .find(|(w, _)| w.start <= ts && ts < w.end)
                        .expect("the record's own session");
                    if wm.is_some_and(|wm| max_ts(&w) <= wm) {
                        fired.push((k, w, sorted(vals)));
                    }
                }
                Ev::Wm(new) => {
                    for (k, recs) in live.iter_mut() {
                        let comps = sessions(recs, gap);
                        for (w, vals) in &comps {
                            if wm.is_none_or(|old| max_ts(w) > old) && max_ts(w) <= new {
                                fired.push((*k, *w, sorted(vals.clone())));
                            }
                        }
                        recs.retain(|(ts, _)| {
                            let (w, _) = comps
                                .iter()
                                .find(|(w, _)| w.start <= *ts && *ts < w.end)
                                .expect("every record is in a session");
                            max_ts(w).saturating_add(lateness) > new
                        });
                    }
                    wm = Some(new);
                }
            }
        }
        return (fired, late);
    }
    let mut accepted: BTreeMap<(u8, Window), Vec<u32>> = BTreeMap::new();
    for ev in events {
        match *ev {
            Ev::Rec((k, ts, v)) => {
                let wins: Vec<Window> = brute_windows(a, ts)
                    .into_iter()
                    .filter(|w| !is_late(w, wm))
                    .collect();
                if wins.is_empty() {
                    late.push((k, ts, v));
                }
                for w in wins {
                    let vals = accepted.entry((k, w)).or_default();
                    vals.push(v);
                    if wm.is_some_and(|wm| max_ts(&w) <= wm) {
                        fired.push((k, w, sorted(vals.clone())));
                    }
                }
            }
            Ev::Wm(new) => {
                for ((k, w), vals) in &accepted {
                    if wm.is_none_or(|old| max_ts(w) > old) && max_ts(w) <= new {
                        fired.push((*k, *w, sorted(vals.clone())));
                    }
                }
                wm = Some(new);
            }
        }
    }
    (fired, late)
}

/// What the operator emitted: firings `(key, window, value)` and late records in order.
type Emitted<O> = (Vec<(u8, Window, O)>, Vec<Rec>);

/// Runs the operator over `events`, snapshotting and restoring into a fresh operator
/// before event `restore_at`.
fn run<F: WindowFunction<u8, Rec>>(
    events: &[Ev],
    a: WindowAssigner,
    lateness: i64,
    f: F,
    restore_at: usize,
) -> Emitted<F::Out> {
    let spec = WindowSpec {
        key: Arc::new(|r: &Rec| r.0),
        timestamp: Arc::new(|r: &Rec| r.1),
        assigner: a,
        allowed_lateness: lateness,
    };
    let f = Arc::new(f);
    let mut op = WindowOperator::new(spec.clone(), f.clone(), &info()).unwrap();
    let mut out = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        if i == restore_at {
            let snap = op.snapshot(1).unwrap();
            op = WindowOperator::new(spec.clone(), f.clone(), &info()).unwrap();
            op.restore(RestoredState {
                key_groups: snap.key_groups,
                operator_states: snap.operator_state.into_iter().collect(),
            })
            .unwrap();
        }
        match ev {
            Ev::Rec(r) => op.process(*r, &mut out).unwrap(),
            Ev::Wm(w) => {
                op.handle_watermark(Watermark(*w), &mut out).unwrap();
            }
        }
    }
    let mut results = Vec::new();
    let mut late = Vec::new();
    for o in out {
        match o {
            WindowOutput::Result(r) => results.push((r.key, r.window, r.value)),
            WindowOutput::Late(t) => late.push(t),
        }
    }
    (results, late)
}

struct CountSum;

impl AggregateFunction<Rec> for CountSum {
    type Acc = (u64, u64);
    type Out = (u64, u64);
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), r: Rec) {
        acc.0 += 1;
        acc.1 += u64::from(r.2);
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
    fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }
}

fn sum_reduce() -> Reduce<fn(&Rec, &Rec) -> Rec> {
    Reduce(|x, y| (x.0, x.1, x.2 + y.2))
}

fn check(events: Vec<Ev>, a: WindowAssigner, lateness: i64, restore_at: usize) {
    let (want, want_late) = oracle(&events, a, lateness);

    let mut want_sum: Vec<(u8, Window, u64)> = want
        .iter()
        .map(|(k, w, v)| (*k, *w, v.iter().map(|x| u64::from(*x)).sum()))
        .collect();
    want_sum.sort();
    let (got, late) = run(&events, a, lateness, sum_reduce(), restore_at);
    let mut got: Vec<(u8, Window, u64)> = got
        .into_iter()
        .map(|(k, w, r)| (k, w, u64::from(r.2)))
        .collect();
    got.sort();
    assert_eq!(got, want_sum, "reduce");
    assert_eq!(late, want_late, "late side output (reduce)");

    let mut want_cs: Vec<(u8, Window, (u64, u64))> = want
        .iter()
        .map(|(k, w, v)| {
            (
                *k,
                *w,
                (v.len() as u64, v.iter().map(|x| u64::from(*x)).sum()),
            )
        })
        .collect();
    want_cs.sort();
    let (mut got, late) = run(&events, a, lateness, Aggregate(CountSum), restore_at);
    got.sort();
    assert_eq!(got, want_cs, "aggregate");
    assert_eq!(late, want_late, "late side output (aggregate)");

    let mut want_all = want.clone();
    want_all.sort();
    let process = Process(
        |k: &u8, w: &Window, recs: &[Rec], out: &mut Vec<Firing>| {
            out.push((*k, *w, sorted(recs.iter().map(|r| r.2).collect())))
        },
        std::marker::PhantomData,
    );
    let (got, late) = run(&events, a, lateness, process, restore_at);
    let mut got: Vec<Firing> = got.into_iter().map(|(_, _, v)| v).collect();
    got.sort();
    assert_eq!(got, want_all, "process");
    assert_eq!(late, want_late, "late side output (process)");
}

/// Random out-of-order records with watermarks trailing the maximum by random lags, ending
/// with the end-of-input watermark.
fn stream() -> impl Strategy<Value = Vec<Ev>> {
    prop::collection::vec(
        (0u8..3, -20i64..300, 0u32..100, prop::option::of(0i64..60)),
        1..120,
    )
    .prop_map(|raw| {
        let mut events = Vec::new();
        let mut max = i64::MIN;
        let mut wm = i64::MIN;
        for (k, ts, v, lag) in raw {
            events.push(Ev::Rec((k, ts, v)));
            max = max.max(ts);
            if let Some(lag) = lag {
                if max - lag > wm {
                    wm = max - lag;
                    events.push(Ev::Wm(wm));
                }
            }
        }
        events.push(Ev::Wm(i64::MAX));
        events
    })
}

fn lateness() -> impl Strategy<Value = i64> {
    prop_oneof![Just(0i64), 1i64..80]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn tumbling_windows_match_the_oracle(events in stream(), size in 1i64..40, l in lateness(), at in 0usize..200) {
        check(events, WindowAssigner::Tumbling { size, offset: 0 }, l, at);
    }

    #[test]
    fn sliding_windows_match_the_oracle(events in stream(), slide in 1i64..12, k in 1i64..5, l in lateness(), at in 0usize..200) {
        check(events, WindowAssigner::Sliding { size: slide * k, slide }, l, at);
    }

    #[test]
    fn session_windows_match_the_oracle(events in stream(), gap in 1i64..40, l in lateness(), at in 0usize..200) {
        check(events, WindowAssigner::Session { gap }, l, at);
    }
}

#[test]
fn late_record_refires_within_lateness_and_goes_to_side_output_after() {
    let a = WindowAssigner::Tumbling {
        size: 10,
        offset: 0,
    };
    let events = vec![
        Ev::Rec((1, 3, 1)),
        Ev::Wm(9),          // fires [0,10) = 1
        Ev::Rec((1, 5, 2)), // late, within lateness 5: fires again with 1+2
        Ev::Wm(14),         // purges [0,10)
        Ev::Rec((1, 6, 4)), // too late: side output
        Ev::Wm(i64::MAX),
    ];
    let (got, late) = run(&events, a, 5, sum_reduce(), 99);
    let sums: Vec<u32> = got.iter().map(|(_, _, r)| r.2).collect();
    assert_eq!(sums, vec![1, 3]);
    assert_eq!(late, vec![(1, 6, 4)]);
    let (got, late) = run(&events, a, 0, sum_reduce(), 99);
    assert_eq!(got.len(), 1);
    assert_eq!(late, vec![(1, 5, 2), (1, 6, 4)]);
}

/// A restore whose watermark is lower than the one the state was written under (a task moved
/// to a scaled-out instance whose watermark restarts, a rescale restoring the minimum): a
/// record of a key whose window was already fired and purged stays late, it does not open
/// that window a second time; a key without a purged window is not affected.
#[test]
fn a_purged_window_stays_closed_after_a_restore_with_a_lower_watermark() {
    for (assigner, lateness) in [
        (
            WindowAssigner::tumbling(std::time::Duration::from_millis(100)),
            0,
        ),
        (
            WindowAssigner::tumbling(std::time::Duration::from_millis(100)),
            50,
        ),
        (
            WindowAssigner::session(std::time::Duration::from_millis(30)),
            0,
        ),
    ] {
        let spec = WindowSpec {
            key: Arc::new(|r: &Rec| r.0),
            timestamp: Arc::new(|r: &Rec| r.1),
            assigner,
            allowed_lateness: lateness,
        };
        let f = Arc::new(sum_reduce());
        let mut op = WindowOperator::new(spec.clone(), f.clone(), &info()).unwrap();
        let mut out = Vec::new();
        op.process((1, 10, 5), &mut out).unwrap();
        op.handle_watermark(Watermark(1_000), &mut out).unwrap();
        let fired = out
            .iter()
            .filter(|o| matches!(o, WindowOutput::Result(_)))
            .count();
        assert_eq!(fired, 1, "{assigner:?}: key 1's window fired once");

        // the keyed state alone: the new owner's watermark starts from nothing
        let snap = op.snapshot(1).unwrap();
        let mut op = WindowOperator::new(spec.clone(), f.clone(), &info()).unwrap();
        op.restore(RestoredState {
            key_groups: snap.key_groups,
            operator_states: Vec::new(),
        })
        .unwrap();
        assert_eq!(op.current_watermark(), None);
        let mut out = Vec::new();
        op.process((1, 20, 7), &mut out).unwrap();
        op.process((2, 20, 9), &mut out).unwrap();
        op.handle_watermark(Watermark(1_000), &mut out).unwrap();
        let mut late = Vec::new();
        let mut results = Vec::new();
        for o in out {
            match o {
                WindowOutput::Result(r) => results.push((r.key, r.value.2)),
                WindowOutput::Late(t) => late.push(t),
            }
        }
        assert_eq!(
            late,
            vec![(1, 20, 7)],
            "{assigner:?}: key 1's record is late"
        );
        assert_eq!(results, vec![(2, 9)], "{assigner:?}: key 2's window fires");
    }
}
