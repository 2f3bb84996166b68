//! kcat (Debian package `kcat`, librdkafka from the shell) against the broker binary:
//! `kcat -L` (metadata), `kcat -P` (produce keyed lines), `kcat -C -e` (consume to the end),
//! `kcat -Q` (offset for a timestamp). Skips with a notice when kcat is not on PATH;
//! `scripts/ci-setup.sh` installs it.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Result};
use onceflow_testkit::bins::find_on_path;
use onceflow_testkit::broker_process::{BrokerProcess, Storage};
use onceflow_testkit::child::run_bounded;

const KCAT_TIMEOUT: Duration = Duration::from_secs(30);

fn kcat(
    bin: &std::path::Path,
    broker: &BrokerProcess,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<String> {
    let mut cmd = Command::new(bin);
    cmd.arg("-b")
        .arg(broker.bootstrap())
        .args(["-X", "broker.address.family=v4"])
        .args(args);
    let (status, stdout, stderr) = run_bounded(&mut cmd, stdin, KCAT_TIMEOUT)?;
    ensure!(
        status.success(),
        "kcat {args:?} failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}\nbroker log:\n{}",
        broker.log_tail(3000)
    );
    ensure!(
        !stderr.contains("ERROR") && !stderr.contains("failed"),
        "kcat {args:?} reported errors:\n{stderr}"
    );
    Ok(stdout)
}

#[test]
fn kcat_lists_produces_and_consumes() -> Result<()> {
    let Some(bin) = find_on_path(&["kcat", "kafkacat"]) else {
        eprintln!("SKIPPED kcat_lists_produces_and_consumes: kcat is not on PATH (scripts/ci-setup.sh installs it)");
        return Ok(());
    };
    let broker = BrokerProcess::spawn(Storage::InMemory, &[])?;

    let listing = kcat(&bin, &broker, &["-L", "-m", "10"], None)?;
    ensure!(
        listing.contains("1 brokers:"),
        "kcat -L does not show one broker:\n{listing}"
    );
    ensure!(
        listing.contains(&format!("at {}", broker.bootstrap())),
        "kcat -L does not show {}:\n{listing}",
        broker.bootstrap()
    );

    let topic = "kcat-topic";
    kcat(
        &bin,
        &broker,
        &["-P", "-t", topic, "-p", "0", "-K", ":"],
        Some(b"k1:one\nk2:two\nk3:three\n"),
    )?;
    kcat(
        &bin,
        &broker,
        &["-P", "-t", topic, "-p", "0"],
        Some(b"four\n"),
    )?;

    let consumed = kcat(
        &bin,
        &broker,
        &[
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k=%s@%o\\n",
        ],
        None,
    )?;
    ensure!(
        consumed == "k1=one@0\nk2=two@1\nk3=three@2\n=four@3\n",
        "kcat -C printed:\n{consumed}"
    );

    let listing = kcat(&bin, &broker, &["-L", "-t", topic, "-m", "10"], None)?;
    ensure!(
        listing.contains(&format!("topic \"{topic}\" with 1 partitions")),
        "kcat -L -t:\n{listing}"
    );
    ensure!(
        listing.contains("partition 0, leader"),
        "kcat -L -t shows no partition 0:\n{listing}"
    );

    // Offset lookup by timestamp (ListOffsets): timestamp 0 is before every record.
    let query = kcat(&bin, &broker, &["-Q", "-t", &format!("{topic}:0:0")], None)?;
    ensure!(
        query.contains("offset 0"),
        "kcat -Q for timestamp 0 printed:\n{query}"
    );

    // Every codec librdkafka offers: batches are stored as sent and served back.
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let t = format!("kcat-{codec}");
        let lines: String = (0..50).map(|i| format!("{codec}-{i}\n")).collect();
        kcat(
            &bin,
            &broker,
            &["-P", "-t", &t, "-p", "0", "-z", codec],
            Some(lines.as_bytes()),
        )?;
        let back = kcat(
            &bin,
            &broker,
            &[
                "-C",
                "-t",
                &t,
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-f",
                "%s\\n",
            ],
            None,
        )?;
        ensure!(back == lines, "kcat -z {codec}: consumed\n{back}");
    }

    // A second consumer starting at the end sees nothing and exits.
    let tail = kcat(
        &bin,
        &broker,
        &["-C", "-t", topic, "-p", "0", "-o", "end", "-e"],
        None,
    )?;
    ensure!(tail.is_empty(), "kcat -C -o end printed:\n{tail}");
    Ok(())
}
