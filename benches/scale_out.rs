//! Scale-out benchmark (by hand, not CI): instances of the example job `exactly_once_etl`
//! (`--mode transactional-offsets --instance-id`) as child processes against the bundled
//! broker, input partitioned by the key (`--input-partitioned-by-key`: no repartition topic). Prints three tables:
//!
//! 1. throughput with 1, 2 and 3 instances side by side: the instances start on an empty
//!    input and settle (no new dataflow for 3 s; the time is reported), then the same input
//!    is produced at once; records/s of read_committed output between 10% and 90% of it, and
//!    CPU seconds of all instances per million records while they processed it;
//! 2. the pause of the moved tasks after a SIGKILL: from the kill to the first new output
//!    record of a task the killed instance owned (the session timeout is most of it);
//! 3. changelog restore speed: records and seconds the survivor spent restoring the moved
//!    tasks (from its Prometheus endpoint);
//! 4. a restart of one instance after a graceful stop, on an input of many keys: the restore
//!    with its local changelog cache, then without it (the cache directory deleted): records
//!    read from the changelog and taken from the cache, and the restore's seconds.
//!
//! ```sh
//! cargo bench --bench scale_out                     # 200k records per row
//! ONCEFLOW_SCALE_RECORDS=50000 cargo bench --bench scale_out
//! ONCEFLOW_SCALE_KEYS=100000 cargo bench --bench scale_out   # keys of the restart rows (50000)
//! ```
//!
//! Every row checks the output record by record (every id once, every key's last total the
//! sum of its inputs) and the bench exits non-zero if one is not exact.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use onceflow_testkit::bins::bins;
use onceflow_testkit::child::Proc;
use onceflow_testkit::clients::read_topic;
use onceflow_testkit::eos::*;

/// CPU seconds (user + system) `pid` used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // fields after the command name (which may hold spaces), from field 3 on
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 here; 100 ticks/s
    (ticks(11) + ticks(12)) / 100.0
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn instance_args(base: &JobArgs, dir: &std::path::Path, name: &str, metrics: u16) -> JobArgs {
    let mut args = base.clone();
    args.checkpoint_dir = dir.join(format!("checkpoints-{name}"));
    args.extra_args.extend(
        [
            "--instance-id",
            name,
            "--session-timeout-ms",
            "6000",
            "--recovery-allowance-ms",
            "3000",
            "--input-partitioned-by-key",
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
        ]
        .map(String::from),
    );
    args.env.push(("RUST_LOG".into(), "warn".into()));
    args
}

fn base_args(dir: &std::path::Path, tag: &str) -> JobArgs {
    let mut base = JobArgs::new("transactional-offsets", dir);
    base.prefix = format!("bench-{tag}");
    base.group = format!("bench-{tag}");
    base.transaction_timeout_ms = Some(8_000);
    base.checkpoint_interval_ms = 500;
    base
}

/// Output records read so far (read_committed), sampled until all `n` arrived.
fn wait_complete(
    bootstrap: &str,
    base: &JobArgs,
    data: &Dataset,
    limit: Duration,
) -> Vec<(Instant, usize)> {
    let mut tail = Tail::new(bootstrap, &base.output, &base.dlq());
    let mut samples = Vec::new();
    let deadline = Instant::now() + limit;
    while !tail.complete(data) && Instant::now() < deadline {
        tail.poll_for(data, Duration::from_millis(250));
        samples.push((Instant::now(), tail.progress().0));
    }
    samples
}

/// Records/s between 10% and 90% of `n` in `samples`.
fn steady_rate(samples: &[(Instant, usize)], n: usize) -> f64 {
    let at = |frac: f64| {
        samples
            .iter()
            .find(|(_, c)| *c as f64 >= frac * n as f64)
            .copied()
    };
    match (at(0.1), at(0.9)) {
        (Some((t1, c1)), Some((t2, c2))) if t2 > t1 => (c2 - c1) as f64 / (t2 - t1).as_secs_f64(),
        _ => 0.0,
    }
}

struct Row {
    instances: usize,
    rate: f64,
    startup_s: f64,
    cpu_per_m: f64,
    exact: bool,
}

fn throughput_row(instances: usize, n: u64) -> Row {
    let dir = scenario_dir(&format!("bench_scale_{instances}"));
    let base = base_args(dir.path(), &format!("tp{instances}"));
    let (broker, data) = setup(dir.path(), &base, n, 7);
    let data = data.partitioned_by_key();
    let bootstrap = broker.bootstrap().to_string();
    // the instances join and settle on an empty input first: the rows measure processing,
    // not the rebalances of a simultaneous start (reported as the settle time)
    let t0 = Instant::now();
    let mut procs: Vec<Proc> = (0..instances)
        .map(|i| {
            let name = format!("node-{i}");
            spawn_job(
                &bootstrap,
                &instance_args(&base, dir.path(), &name, free_port()),
                &name,
            )
        })
        .collect();
    settle(&mut procs);
    let settled = t0.elapsed().as_secs_f64();
    let cpu_before: f64 = procs.iter().map(|p| cpu_seconds(p.pid())).sum();
    produce_all(&bootstrap, &base.input, &data);
    let samples = wait_complete(&bootstrap, &base, &data, Duration::from_secs(900));
    let cpu: f64 = procs.iter().map(|p| cpu_seconds(p.pid())).sum::<f64>() - cpu_before;
    for p in &mut procs {
        p.stop_gracefully(Duration::from_secs(60));
    }
    let report = check_output(&bootstrap, &base, &data);
    drop(broker);
    finish_dir(dir);
    Row {
        instances,
        rate: steady_rate(&samples, data.expected.len()),
        startup_s: settled,
        cpu_per_m: cpu / (n as f64 / 1e6),
        exact: report.is_exact(),
    }
}

/// Waits until every instance runs a dataflow and none built a new one for 3 s (the group
/// settled).
fn settle(procs: &mut [Proc]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = Instant::now();
    let mut seen: Vec<usize> = vec![0; procs.len()];
    while Instant::now() < deadline {
        for (i, p) in procs.iter().enumerate() {
            let n = p
                .lines()
                .iter()
                .filter(|l| l.contains("dataflow for assignment") || *l == "job started")
                .count();
            if n != seen[i] {
                seen[i] = n;
                last = Instant::now();
            }
        }
        let all_started = procs.iter().all(|p| {
            p.lines().last().is_some_and(|l| {
                l == "job started" || l.ends_with("committed") || l.ends_with("complete")
            })
        });
        if all_started && last.elapsed() > Duration::from_secs(3) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The partitions of an instance's latest dataflow, from its stdout.
fn owned_partitions(p: &Proc) -> Vec<i32> {
    p.lines()
        .iter()
        .rev()
        .find(|l| l.contains("dataflow for assignment"))
        .and_then(|l| l.split("partitions [").nth(1))
        .and_then(|l| l.split(']').next())
        .map(|l| l.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// A metric's value (the sum of its series) from a Prometheus endpoint.
fn scrape(port: u16, name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0.0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Moved {
    pause_s: f64,
    session_s: f64,
    restored_records: f64,
    restore_s: f64,
    exact: bool,
}

fn kill_row(n: u64) -> Moved {
    let dir = scenario_dir("bench_scale_kill");
    let base = base_args(dir.path(), "kill");
    let (broker, data) = setup(dir.path(), &base, n, 11);
    let data = data.partitioned_by_key();
    let bootstrap = broker.bootstrap().to_string();
    let producer = produce_paced(
        &bootstrap,
        &base.input,
        &data,
        60,
        Duration::from_millis(250),
    );
    let (pa, pb) = (free_port(), free_port());
    let mut a = spawn_job(
        &bootstrap,
        &instance_args(&base, dir.path(), "node-a", pa),
        "a",
    );
    let mut b = spawn_job(
        &bootstrap,
        &instance_args(&base, dir.path(), "node-b", pb),
        "b",
    );
    // both own tasks and b committed since
    let both = |p: &mut Proc| {
        p.wait_line(Duration::from_secs(120), |l| {
            l.contains("dataflow for assignment") && !l.ends_with("partitions []")
        })
    };
    both(&mut a);
    both(&mut b);
    let _ = b.wait_line(Duration::from_secs(60), |l| l.ends_with("committed"));
    let moved: BTreeSet<i32> = owned_partitions(&b).into_iter().collect();
    let restored_before = scrape(pa, "onceflow_scale_restore_records_total");
    let restore_s_before = scrape(pa, "onceflow_restore_seconds_sum");
    b.kill9();
    let killed = Instant::now();
    // what is visible once b is dead (a commit b finished just before the kill included)
    let seen: BTreeSet<u64> = read_topic(&bootstrap, &base.output, true)
        .iter()
        .filter_map(|r| parse_output(&r.value).map(|o| o.id))
        .collect();
    let task = |key: &str| {
        onceflow_connectors::kafka::scale::task_of(key.as_bytes(), PARTITIONS as u32) as i32
    };
    let mut pause_s = f64::NAN;
    while killed.elapsed() < Duration::from_secs(120) {
        let fresh = read_topic(&bootstrap, &base.output, true).iter().any(|r| {
            parse_output(&r.value)
                .is_some_and(|o| !seen.contains(&o.id) && moved.contains(&task(&o.key)))
        });
        if fresh {
            pause_s = killed.elapsed().as_secs_f64();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let restored_records = scrape(pa, "onceflow_scale_restore_records_total") - restored_before;
    let restore_s = scrape(pa, "onceflow_restore_seconds_sum") - restore_s_before;
    producer.join().expect("input producer");
    let _ = wait_complete(&bootstrap, &base, &data, Duration::from_secs(300));
    a.stop_gracefully(Duration::from_secs(60));
    let report = check_output(&bootstrap, &base, &data);
    drop(broker);
    finish_dir(dir);
    Moved {
        pause_s,
        session_s: 6.0,
        restored_records,
        restore_s,
        exact: report.is_exact(),
    }
}

struct Restart {
    what: &'static str,
    from_changelog: f64,
    from_cache: f64,
    restore_s: f64,
}

/// One instance processes `n` records over `keys` keys and stops; it is started again twice,
/// with its changelog cache and with the cache deleted, and each restore is measured.
fn restart_rows(n: u64, keys: u32) -> (Vec<Restart>, bool) {
    let dir = scenario_dir("bench_scale_restart");
    let base = base_args(dir.path(), "restart");
    let bootstrap;
    let broker = {
        let (broker, _) = setup(dir.path(), &base, 0, 13);
        bootstrap = broker.bootstrap().to_string();
        broker
    };
    let data = Dataset::generate_keys(n, keys, 13).partitioned_by_key();
    let port = free_port();
    let args = instance_args(&base, dir.path(), "node-a", port);
    let mut a = spawn_job(&bootstrap, &args, "a");
    produce_all(&bootstrap, &base.input, &data);
    let _ = wait_complete(&bootstrap, &base, &data, Duration::from_secs(900));
    a.stop_gracefully(Duration::from_secs(60));
    let exact = check_output(&bootstrap, &base, &data).is_exact();
    let mut rows = Vec::new();
    for (what, keep_cache) in [("local cache", true), ("changelog only", false)] {
        if !keep_cache {
            let _ = std::fs::remove_dir_all(args.checkpoint_dir.join("changelog-cache"));
        }
        let port = free_port();
        let args = instance_args(&base, dir.path(), "node-a", port);
        let mut a = spawn_job(&bootstrap, &args, "a");
        // the restore ends before the dataflow's first checkpoint
        let _ = a.wait_line(Duration::from_secs(300), |l| l.ends_with("complete"));
        rows.push(Restart {
            what,
            from_changelog: scrape(port, "onceflow_scale_restore_records_total"),
            from_cache: scrape(port, "onceflow_scale_restore_cached_records_total"),
            restore_s: scrape(port, "onceflow_restore_seconds_sum"),
        });
        a.stop_gracefully(Duration::from_secs(60));
    }
    drop(broker);
    finish_dir(dir);
    (rows, exact)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line
    let n = env_u64("ONCEFLOW_SCALE_RECORDS", 200_000);
    bins();
    let rows: Vec<Row> = [1, 2, 3].iter().map(|k| throughput_row(*k, n)).collect();
    let moved = kill_row((n / 4).max(20_000));
    let keys = env_u64("ONCEFLOW_SCALE_KEYS", 50_000) as u32;
    let (restarts, restart_exact) = restart_rows(n, keys);

    println!("\nScale-out: instances of exactly_once_etl, {n} JSON records of about 60 B, 4 partitions, transactional-offsets, checkpoint 500 ms");
    println!(
        "| instances | records/s (10%-90%) | vs 1 instance | start until the group settled (s) | CPU s per M records | exact |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let one = rows.first().map_or(0.0, |r| r.rate);
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.2}x | {:.1} | {:.1} | {} |",
            r.instances,
            r.rate,
            if one > 0.0 { r.rate / one } else { 0.0 },
            r.startup_s,
            r.cpu_per_m,
            r.exact
        );
    }
    println!(
        "\nMoved tasks after a SIGKILL (2 instances, session timeout {} s)",
        moved.session_s
    );
    println!("| kill -> first output of a moved task (s) | restored records | restore s | restore records/s | exact |");
    println!("| --- | --- | --- | --- | --- |");
    println!(
        "| {:.1} | {:.0} | {:.3} | {:.0} | {} |",
        moved.pause_s,
        moved.restored_records,
        moved.restore_s,
        if moved.restore_s > 0.0 {
            moved.restored_records / moved.restore_s
        } else {
            0.0
        },
        moved.exact
    );
    println!(
        "\nRestart of one instance after a graceful stop ({n} records over {keys} keys, exact output: {restart_exact})"
    );
    println!("| restore from | changelog records read | records from the cache | restore s | records/s |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &restarts {
        println!(
            "| {} | {:.0} | {:.0} | {:.3} | {:.0} |",
            r.what,
            r.from_changelog,
            r.from_cache,
            r.restore_s,
            if r.restore_s > 0.0 {
                (r.from_changelog + r.from_cache) / r.restore_s
            } else {
                0.0
            }
        );
    }
    if !rows.iter().all(|r| r.exact) || !moved.exact || !restart_exact {
        eprintln!("an output was not exact");
        std::process::exit(1);
    }
}
