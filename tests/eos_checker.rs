//! The exactly-once checker of the end-to-end tests, on synthetic output: it must accept an exact
//! output and report duplicates, losses, wrong totals and DLQ mistakes (so the end-to-end
//! tests can fail).

use onceflow_testkit::clients::*;
use onceflow_testkit::eos::*;

fn exact_output(data: &Dataset) -> (Vec<Consumed>, Vec<Consumed>) {
    let mut totals = std::collections::HashMap::<String, i64>::new();
    let mut offsets = [0i64; PARTITIONS as usize];
    let mut ids: Vec<_> = data.expected.keys().copied().collect();
    ids.sort_unstable();
    let mut output = Vec::new();
    for id in ids {
        let (key, amount) = &data.expected[&id];
        let total = totals.entry(key.clone()).or_default();
        *total += amount;
        let partition = (key.len() as i32 + key.as_bytes()[key.len() - 1] as i32) % PARTITIONS;
        let offset = &mut offsets[partition as usize];
        output.push(Consumed {
            partition,
            offset: *offset,
            key: key.clone().into_bytes(),
            value: serde_json::json!({"id": id, "key": key, "amount": amount, "total": *total})
                .to_string()
                .into_bytes(),
        });
        *offset += 2; // gaps like transaction markers
    }
    let dlq = data
        .records
        .iter()
        .filter(|r| r.key.starts_with("bad#"))
        .enumerate()
        .map(|(i, r)| Consumed {
            partition: 0,
            offset: i as i64,
            key: r.key.clone().into_bytes(),
            value: r.value.clone(),
        })
        .collect();
    (output, dlq)
}

#[test]
fn checker_accepts_exact_output() {
    let data = Dataset::generate(5_000, 7);
    assert!(data.bad_markers.len() >= 8);
    let (output, dlq) = exact_output(&data);
    let r = check(&data, &output, &dlq);
    assert!(r.is_exact(), "{r}");
}

#[test]
fn checker_finds_duplicates_losses_and_wrong_totals() {
    let data = Dataset::generate(5_000, 8);
    let (output, dlq) = exact_output(&data);

    let mut dup = output.clone();
    let mut again = dup[10].clone();
    again.offset = 1_000_000;
    dup.push(again);
    let r = check(&data, &dup, &dlq);
    assert_eq!(r.duplicated.len(), 1, "{r}");
    assert!(!r.is_exact());
    assert!(r.nothing_lost());

    let mut lost = output.clone();
    lost.remove(100);
    let r = check(&data, &lost, &dlq);
    assert_eq!(r.missing.len(), 1, "{r}");
    assert!(
        !r.wrong_totals.is_empty() || !r.broken_chains.is_empty(),
        "{r}"
    );
    assert!(!r.nothing_lost());

    let mut wrong = output.clone();
    let last = wrong.len() - 1;
    let mut o = parse_output(&wrong[last].value).unwrap();
    o.total += 1;
    wrong[last].value =
        serde_json::json!({"id": o.id, "key": o.key, "amount": o.amount, "total": o.total})
            .to_string()
            .into_bytes();
    let r = check(&data, &wrong, &dlq);
    assert_eq!(r.wrong_totals.len(), 1, "{r}");
    assert_eq!(r.broken_chains.len(), 1, "{r}");

    let mut dlq_dup = dlq.clone();
    dlq_dup.push(dlq[0].clone());
    let r = check(&data, &output, &dlq_dup);
    assert_eq!(r.dlq_duplicated.len(), 1, "{r}");
    let r = check(&data, &output, &dlq[1..]);
    assert_eq!(r.dlq_missing.len(), 1, "{r}");
    assert!(!r.is_exact());
}

/// The harness itself against the broker child: the dataset goes in, comes back out record
/// by record, and survives a kill -9 and restart of the broker on the same port and data dir.
#[test]
fn harness_reads_back_input_across_broker_kill9() {
    let dir = scenario_dir("eos_harness");
    let mut broker = scenario_broker(dir.path(), &[]);
    let bootstrap = broker.bootstrap().to_string();
    create_topics(&bootstrap, &["harness-in"], PARTITIONS);
    let data = Dataset::generate(20_000, 9);
    produce_all(&bootstrap, "harness-in", &data);
    let read = |b: &str| {
        let mut got = read_topic(b, "harness-in", true);
        got.sort_by_key(|c| (c.partition, c.offset));
        got.into_iter().map(|c| c.value).collect::<Vec<_>>()
    };
    let before = read(&bootstrap);
    assert_eq!(before.len(), data.records.len());
    let mut want: Vec<Vec<u8>> = data.records.iter().map(|r| r.value.clone()).collect();
    want.sort();
    let mut got = before.clone();
    got.sort();
    assert_eq!(got, want, "input read back differs from the dataset");
    kill9_broker(&mut broker);
    broker.restart_same_port().expect("broker restarts");
    assert_eq!(broker.bootstrap(), bootstrap);
    assert_eq!(
        read(&bootstrap),
        before,
        "log changed across kill -9 and restart"
    );
    drop(broker);
    finish_dir(dir);
}
