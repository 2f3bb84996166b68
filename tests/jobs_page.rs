//! The job authors' page, docs/JOBS.md: its `src/main.rs` is `examples/running_totals.rs`
//! byte for byte; that job survives three SIGKILLs (each right after it reported a committed
//! checkpoint) with its output checked record by record; and a job crate that depends on
//! onceflow with `default-features = false` does not build the bundled broker.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use onceflow_testkit::bins::*;
use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;
use onceflow_testkit::jobs::*;

const PAGE: &str = include_str!("../docs/JOBS.md");

/// The body of the first fenced block of `lang` after the first line mentioning `marker`.
fn block_after(marker: &str, lang: &str) -> String {
    let at = PAGE
        .find(marker)
        .unwrap_or_else(|| panic!("docs/JOBS.md has no `{marker}`"));
    let fence = format!("```{lang}\n");
    let start = PAGE[at..]
        .find(&fence)
        .expect("a code block after the marker")
        + at
        + fence.len();
    let len = PAGE[start..].find("```\n").expect("the block's end");
    PAGE[start..start + len].to_string()
}

#[test]
fn the_page_main_rs_is_the_tested_example() {
    let code = block_after("`src/main.rs`", "rust");
    let example = include_str!("../examples/running_totals.rs");
    assert_eq!(
        code, example,
        "docs/JOBS.md's src/main.rs differs from examples/running_totals.rs"
    );
    assert!(
        code.lines().count() < 40,
        "the page's main.rs has {} lines",
        code.lines().count()
    );
}

const KEYS: u64 = 12;
const RECORDS: u64 = 20_000;

/// Input record `i`: key `k{i % KEYS}`, value `i % 9 + 1`.
fn input(i: u64) -> (String, i64) {
    (format!("k{}", i % KEYS), (i % 9 + 1) as i64)
}

/// Produces the input in 40 chunks 250 ms apart (the default partitioner keeps a key's
/// records in one partition, in order).
fn produce(bootstrap: &str, topic: &str) -> std::thread::JoinHandle<()> {
    let records = (0..RECORDS)
        .map(|i| {
            let (key, n) = input(i);
            (None, key, n.to_string().into_bytes())
        })
        .collect();
    produce_records_paced(bootstrap, topic, records, 40, Duration::from_millis(250))
}

#[test]
fn the_page_job_survives_three_sigkills_exactly_once() {
    let _machine = exclusive();
    let test = "jobs_page_kill9";
    let dir = scenario_dir(test);
    bins();
    let broker = scenario_broker(dir.path(), &[]);
    let bootstrap = broker.bootstrap().to_string();
    create_topics(&bootstrap, &["totals-in", "totals-out"], PARTITIONS);
    let ckpt = dir.path().join("checkpoints");
    let args: Vec<String> = [
        "--brokers",
        &bootstrap,
        "--input",
        "totals-in",
        "--output",
        "totals-out",
        "--checkpoint-dir",
        ckpt.to_str().expect("utf-8 path"),
        "--checkpoint-interval-ms",
        "300",
        "--parallelism",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let producer = produce(&bootstrap, "totals-in");

    // each kill right after the job reported a newer committed checkpoint
    let mut last = 0;
    for kill in 1..=3 {
        let mut job = spawn_example("running_totals", &args, dir.path(), &format!("run-{kill}"));
        let line = job.wait_line(Duration::from_secs(90), |l| {
            checkpoint_number(l, "committed").is_some_and(|n| n > last)
        });
        let line = line.unwrap_or_else(|| {
            panic!(
                "run {kill} committed no checkpoint after {last}\n{}",
                job.describe()
            )
        });
        last = checkpoint_number(&line, "committed").expect("checkpoint number");
        assert!(
            job.kill9(),
            "run {kill} had exited by itself\n{}",
            job.describe()
        );
        eprintln!("[eos] {test}: SIGKILL {kill} after checkpoint {last} committed");
    }
    producer.join().expect("input producer");

    let mut job = spawn_example("running_totals", &args, dir.path(), "final");
    let complete = wait_for(
        Duration::from_secs(120),
        || read_topic(&bootstrap, "totals-out", true).len() as u64,
        |n| *n >= RECORDS,
    );
    assert!(
        complete.is_some(),
        "the output did not reach {RECORDS} records\n{}",
        job.describe()
    );
    assert!(job
        .wait_line(Duration::from_secs(60), |l| l.contains("job started"))
        .is_some());
    job.stop_gracefully(Duration::from_secs(60));

    // per key, in offset order: the running totals of the key's inputs, each exactly once
    let mut want: HashMap<String, Vec<String>> = HashMap::new();
    let mut totals: HashMap<String, i64> = HashMap::new();
    for i in 0..RECORDS {
        let (key, n) = input(i);
        let t = totals.entry(key.clone()).or_default();
        *t += n;
        want.entry(key).or_default().push(t.to_string());
    }
    let mut out = read_topic(&bootstrap, "totals-out", true);
    out.sort_by_key(|r| (r.partition, r.offset));
    let mut got: HashMap<String, Vec<String>> = HashMap::new();
    for r in out {
        got.entry(r.key_str()).or_default().push(r.value_str());
    }
    for (key, w) in &want {
        let g = got.remove(key).unwrap_or_default();
        let first_diff = w.iter().zip(&g).position(|(a, b)| a != b);
        assert!(
            g == *w,
            "key {key}: {} outputs for {} inputs; first difference at {first_diff:?}",
            g.len(),
            w.len()
        );
    }
    assert!(
        got.is_empty(),
        "output for keys the input does not have: {:?}",
        got.keys()
    );
    eprintln!("[eos] {test}: {RECORDS} records exactly once through 3 SIGKILLs");
    drop(broker);
    finish_dir(dir);
}

/// `cargo tree` of a fresh job crate made of the page's `Cargo.toml` and `src/main.rs`,
/// depending on this checkout with or without its default features.
fn job_crate_tree(default_features: bool) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = env!("CARGO_MANIFEST_DIR");
    let features = if default_features {
        ""
    } else {
        ", default-features = false"
    };
    let manifest = block_after("`Cargo.toml`", "toml").replace(
        "path = \"../onceflow\" }",
        &format!("path = {root:?}{features} }}"),
    );
    assert!(
        manifest.contains(root),
        "the page's Cargo.toml names no `path = \"../onceflow\"`"
    );
    std::fs::write(dir.path().join("Cargo.toml"), manifest).expect("write Cargo.toml");
    std::fs::create_dir(dir.path().join("src")).expect("src");
    std::fs::write(
        dir.path().join("src/main.rs"),
        block_after("`src/main.rs`", "rust"),
    )
    .expect("main.rs");
    // the workspace's lock file: resolving offline picks the same versions
    std::fs::copy(
        Path::new(root).join("Cargo.lock"),
        dir.path().join("Cargo.lock"),
    )
    .expect("lock file");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--edges", "normal", "--prefix", "none"])
        .current_dir(dir.path())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_job_crate_without_default_features_has_no_broker() {
    let has_broker = |tree: &str| tree.lines().any(|l| l.starts_with("onceflow-broker "));
    let lean = job_crate_tree(false);
    assert!(
        lean.lines().any(|l| l.starts_with("onceflow-connectors ")),
        "{lean}"
    );
    assert!(
        !has_broker(&lean),
        "default-features = false still builds the broker:\n{lean}"
    );
    assert!(
        has_broker(&job_crate_tree(true)),
        "the default features should bring the embedded broker"
    );
}
