#!/usr/bin/env bash
# Compares two builds of the example job (`exactly_once_etl`) in one cell of the `txn_size`
# bench: alternating rounds, one run of each build per round, the order flipped every round
# so neither build always runs first. Prints every run's line and then, per build, the
# median records/s, CPU s per M records and end-to-end p50, and the median of the per-round
# ratios new / base. Nothing else should run on the machine meanwhile.
#
# Usage:
#   scripts/txn-ab.sh [-r ROUNDS] [-i INTERVAL_MS] [-m MODE] [-s STORAGE] [-b RECORD_BYTES] \
#       BASE_JOB NEW_JOB [-- more txn_size arguments]
#   scripts/txn-ab.sh -r 6 -i 100 -m two-phase-commit /tmp/etl-before target/release/examples/exactly_once_etl
#
# Defaults: 6 rounds, 100 ms, two-phase-commit, durable, 1024 B. Build a job with
# `cargo build --release --example exactly_once_etl` and copy it aside before changing the
# code. The bench binary is built here (`cargo bench --bench txn_size --no-run`) unless
# TXN_SIZE_BIN names one. Runs use `--no-calibrate` (backlogs sized by the assumed rate, the
# same for both builds).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=6 interval=100 mode=two-phase-commit storage=durable bytes=1024
while getopts "r:i:m:s:b:" o; do
  case "$o" in
    r) rounds=$OPTARG ;;
    i) interval=$OPTARG ;;
    m) mode=$OPTARG ;;
    s) storage=$OPTARG ;;
    b) bytes=$OPTARG ;;
    *) sed -n 2,17p "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then
  sed -n 2,17p "$0" >&2
  exit 2
fi
base=$(realpath "$1") new=$(realpath "$2")
shift 2
[ "${1:-}" = "--" ] && shift
for b in "$base" "$new"; do
  [ -x "$b" ] || { echo "txn-ab: $b is not an executable job binary" >&2; exit 2; }
done

bench=${TXN_SIZE_BIN:-}
if [ -z "$bench" ]; then
  bench=$(cargo bench --bench txn_size --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "txn_size":
        print(m["executable"])')
fi
[ -x "$bench" ] || { echo "txn-ab: no txn_size bench binary (set TXN_SIZE_BIN)" >&2; exit 2; }

out=$(mktemp -d -t txn-ab-XXXXXX)
results="$out/results.tsv"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
  for which in $order; do
    if [ "$which" = base ]; then job=$base; else job=$new; fi
    line=$("$bench" --bench --etl-bin "$job" --storage "$storage" --record-bytes "$bytes" \
      --intervals "$interval" --sizes 10000 --modes "$mode" --repeat 1 --no-raw --no-calibrate \
      --out "$out/bench" "$@" 2>&1 | grep 'records/s steady' | tail -1 || true)
    echo "round $r $which: ${line:-no result (see $out/bench)}"
    # "... (rep 0): 479161 records/s steady, start-up 1.75 s of 11.6 s, 2.5 CPU s per M records, e2e p50 60.0 ms"
    python3 - "$r" "$which" "$line" >>"$results" <<'PY'
import re, sys
r, which, line = sys.argv[1:4]
m = re.search(r"\): (\d+) records/s steady.*?, ([\d.]+) CPU s per M records, e2e p50 ([\d.]+) ms", line)
if m:
    print(r, which, *m.groups(), sep="\t")
PY
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
by = {"base": {}, "new": {}}
for r, which, rate, cpu, e2e in rows:
    by[which][r] = (float(rate), float(cpu), float(e2e))
print()
print("| build | runs | records/s median (min - max) | CPU s / M records median | e2e p50 ms median |")
print("| --- | ---: | --- | ---: | ---: |")
for which in ("base", "new"):
    v = list(by[which].values())
    if not v:
        print(f"| {which} | 0 | - | - | - |")
        continue
    rates = [x[0] for x in v]
    print(f"| {which} | {len(v)} | {statistics.median(rates) / 1e3:.0f}k ({min(rates) / 1e3:.0f}k - {max(rates) / 1e3:.0f}k) "
          f"| {statistics.median(x[1] for x in v):.2f} | {statistics.median(x[2] for x in v):.1f} |")
ratios = [by["new"][r][0] / by["base"][r][0] for r in by["base"] if r in by["new"]]
if ratios:
    print()
    print(f"new / base per round: {' '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}")
PY
