//! Word count: a generated text -> flat_map words -> key_by word -> reduce counts -> an
//! exactly-once file sink, with checkpoints every second.
//!
//! `cargo run --release --example word_count -- [--parallelism N] [--lines N] [--out DIR]`
//! Restarting with the same `--out` directory resumes from the latest checkpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::connectors::read_committed_lines;
use onceflow::prelude::*;

const WORDS: &[&str] = &[
    "stream",
    "barrier",
    "checkpoint",
    "state",
    "key",
    "group",
    "sink",
    "source",
    "commit",
    "exactly",
    "once",
    "kafka",
    "window",
    "watermark",
    "operator",
    "task",
];

fn line(i: u64) -> String {
    (0..8)
        .map(|w| WORDS[((i * 31 + w * 7) % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let parallelism: usize = arg("--parallelism").map_or(Ok(2), |v| v.parse())?;
    let lines: u64 = arg("--lines").map_or(Ok(200_000), |v| v.parse())?;
    let out = std::path::PathBuf::from(arg("--out").unwrap_or_else(|| "target/word_count".into()));

    let config = JobConfig::new("word-count")
        .parallelism(parallelism)
        .checkpoint_interval(Duration::from_secs(1))
        .checkpoint_dir(out.join("checkpoints"))
        .restore(RestoreMode::Latest)
        .stop_on_sigterm(true);
    let env = StreamEnvironment::new(config);
    env.source("text", Generator::new(lines, line))
        .flat_map(|l: String| l.split(' ').map(str::to_string).collect::<Vec<_>>())
        .map(|w| (w, 1u64))
        .key_by(|(w, _): &(String, u64)| w.clone())
        .reduce(|(w, a): &(String, u64), (_, b)| (w.clone(), a + b))
        .sink("counts", FileSink::new(out.join("output")));
    let result = env.execute_blocking()?;
    println!(
        "done: {} checkpoints, restored from {:?}",
        result.completed_checkpoints, result.restored_from
    );

    let mut counts = BTreeMap::new();
    for l in read_committed_lines(&out.join("output"))? {
        let (w, c): (String, u64) = serde_json::from_str(&l)?;
        let e = counts.entry(w).or_insert(0);
        *e = c.max(*e);
    }
    for (w, c) in counts {
        println!("{w:>12} {c}");
    }
    Ok(())
}
