//! Word count over 1M words: identical, correct counts at parallelism 1 and 4.

use std::collections::HashMap;

use onceflow_connectors::{CollectSink, Generator};
use onceflow_operators::{FlatMap, KeyBy, Map};
use onceflow_runtime::{JobConfig, StreamEnvironment};

const LINES: u64 = 100_000;
const WORDS_PER_LINE: u64 = 10;

fn line(i: u64) -> String {
    (0..WORDS_PER_LINE)
        .map(|w| format!("w{}", (i * 7 + w * 13) % 1000))
        .collect::<Vec<_>>()
        .join(" ")
}

fn expected() -> HashMap<String, u64> {
    let mut m = HashMap::new();
    for i in 0..LINES {
        for w in line(i).split(' ') {
            *m.entry(w.to_string()).or_insert(0) += 1;
        }
    }
    m
}

fn run(parallelism: usize) -> HashMap<String, u64> {
    let env = StreamEnvironment::new(JobConfig::new("word-count").parallelism(parallelism));
    let sink = CollectSink::<(String, u64)>::new();
    env.source("lines", Generator::new(LINES, line))
        .flat_map(|l: String| l.split(' ').map(str::to_string).collect::<Vec<_>>())
        .map(|w| (w, 1u64))
        .key_by(|(w, _): &(String, u64)| w.clone())
        .reduce(|(w, a): &(String, u64), (_, b)| (w.clone(), a + b))
        .sink("collect", sink.clone());
    let result = env.execute_blocking().expect("job runs");
    assert_eq!(result.completed_checkpoints, 1, "only the final checkpoint");
    let mut counts = HashMap::new();
    let mut total = 0;
    for (w, c) in sink.records() {
        total += 1;
        let e = counts.entry(w).or_insert(0);
        *e = c.max(*e);
    }
    assert_eq!(
        total,
        LINES * WORDS_PER_LINE,
        "one running count per word occurrence"
    );
    counts
}

#[test]
fn word_count_identical_at_parallelism_1_and_4() {
    let want = expected();
    let p1 = run(1);
    assert_eq!(p1, want);
    let p4 = run(4);
    assert_eq!(p4, want);
}
