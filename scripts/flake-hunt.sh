#!/usr/bin/env bash
# Runs chosen test binaries N times in a loop, optionally with the machine loaded by a parallel
# cargo build, and prints failures per test binary and per test. A test that fails here even
# once is flaky: its verdict depends on timing, and it will reject good submissions at random.
#
# Usage:
#   scripts/flake-hunt.sh [-n RUNS] [--load] [--threads N] [--out DIR] PKG:TEST [PKG:TEST ...]
#   scripts/flake-hunt.sh -n 20 --load onceflow-connectors:crash_exactly_once onceflow:eos_kill9
#   scripts/flake-hunt.sh --list      # the crash, kill, stall, network and e2e binaries
#   scripts/flake-hunt.sh -n 20 --load all
#
# PKG:TEST names a cargo package and one of its integration test targets, or `lib` for the
# unit tests of its library (PKG:lib); `all` stands for the list printed by --list. Each run
# executes the whole test binary (every test in it, one at a time: --test-threads=1, or N
# side by side with --threads N, as `cargo test` in CI runs them on an N-core machine), and
# runs do not overlap, so that they do not compete with each other; the load is the
# only other thing on the machine. Logs of failed runs are kept in DIR (default
# target/flake-hunt/<timestamp>); the summary table is also written to DIR/summary.txt.
#
# Extra arguments for the test binaries go after `--`, e.g. `-- --nocapture`.
# Environment knobs of the tests (ONCEFLOW_EOS_RECORDS and so on, docs/TESTING.md) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."

# The whole script is one function, read before anything runs, so that editing this file
# while a long hunt is running cannot change what the running hunt executes.
main() {

ALL=(
  onceflow:eos_kill9
  onceflow:eos_failpoint
  onceflow:eos_fencing
  onceflow:eos_broker_kill
  onceflow:eos_config
  onceflow:eos_checker
  onceflow:eos_sigint
  onceflow:eos_windowed_takeover
  onceflow:jobs_page
  onceflow:eos_security
  onceflow:eos_scale_out
  onceflow-connectors:crash_exactly_once
  onceflow-connectors:window_crash
  onceflow-connectors:recovery
  onceflow-connectors:kafka_two_phase
  onceflow-connectors:completion_hook
  onceflow-connectors:scale_member
  onceflow-connectors:scale_source
  onceflow-connectors:scale_changelog
  onceflow-connectors:scale_restore
  onceflow-connectors:scale_repartition
  onceflow-broker:restart
  onceflow-broker:storage_kill9
  onceflow-broker:storage_crash
  onceflow-broker:groups_crash
  onceflow-broker:txn_crash
  onceflow-broker:durable_corruption
  onceflow-broker:txn_resume
  onceflow-broker:txn_recovery
  onceflow-connectors:window_idle
  onceflow-connectors:operators_api
  onceflow-runtime:runtime_alignment
  onceflow-runtime:runtime_metrics
  onceflow-runtime:stop_during_setup
)

runs=20
load=0
threads=1
out=""
targets=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    --load) load=1; shift ;;
    --threads) threads="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --list) printf '%s\n' "${ALL[@]}"; exit 0 ;;
    all) targets+=("${ALL[@]}"); shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *:*) targets+=("$1"); shift ;;
    *) echo "flake-hunt: unknown argument $1 (want PKG:TEST, all, -n N, --load)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || { echo "flake-hunt: name at least one PKG:TEST (or all)" >&2; exit 2; }

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
out="${out:-$target_dir/flake-hunt/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"

# The executable of target NAME of kind KIND (test, bin) in the build's JSON messages.
artifact() {
  python3 - "$out/build.json" "$1" "$2" <<'EOF'
import json, sys
want, kind = sys.argv[2], sys.argv[3]
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == want and kind in m["target"]["kind"]:
        print(m["executable"])
        break
EOF
}

# Build every chosen test binary once and find its path.
declare -A bin
args=()
lib=
for t in "${targets[@]}"; do
  args+=(-p "${t%%:*}")
  if [ "${t#*:}" = lib ]; then lib=1; else args+=(--test "${t#*:}"); fi
done
# cargo takes --lib once, for every package named
[ -z "$lib" ] || args+=(--lib)
echo "flake-hunt: building ${#targets[@]} test binaries"
cargo test --no-run --message-format=json "${args[@]}" 2>"$out/build.log" >"$out/build.json" || {
  echo "flake-hunt: build failed, see $out/build.log" >&2; exit 1; }
for t in "${targets[@]}"; do
  name="${t#*:}"
  if [ "$name" = lib ]; then
    # the unit tests of the package's library: its crate name, kind lib
    pkg="${t%%:*}"
    path=$(artifact "${pkg//-/_}" lib)
  else
    path=$(artifact "$name" test)
  fi
  [ -n "$path" ] || { echo "flake-hunt: no test binary for $t" >&2; exit 1; }
  bin[$t]="$path"
done

# cargo tells a test of the package that owns a binary where that binary is
# (CARGO_BIN_EXE_<name>, read by onceflow_testkit::bins at run time); do the same
broker_bin=$(artifact onceflow-broker bin)

declare -A pkg_dir
while read -r name dir; do pkg_dir[$name]="$dir"; done < <(
  cargo metadata --no-deps --format-version 1 | python3 -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], os.path.dirname(p["manifest_path"]))')

# The load: a release build of the broker in its own target dir, cleaned and rebuilt in a loop.
load_pid=""
stop_load() {
  if [ -n "$load_pid" ]; then
    kill -- -"$load_pid" 2>/dev/null || kill "$load_pid" 2>/dev/null || true
    wait "$load_pid" 2>/dev/null || true
  fi
}
trap stop_load EXIT
if [ "$load" = 1 ]; then
  load_dir="$target_dir/flake-hunt-load"
  echo "flake-hunt: loading the machine with a parallel build (target dir $load_dir)"
  set -m
  (
    while true; do
      cargo clean --target-dir "$load_dir" -p onceflow-broker -p onceflow-runtime \
        -p onceflow-connectors >/dev/null 2>&1 || true
      cargo build --release --target-dir "$load_dir" -p onceflow-broker -p onceflow-connectors \
        >/dev/null 2>&1 || sleep 5
    done
  ) &
  load_pid=$!
  set +m
fi

declare -A fails secs maxs
: >"$out/failed-tests.txt"
for ((i = 1; i <= runs; i++)); do
  for t in "${targets[@]}"; do
    log="$out/${t//[:\/]/_}-run$i.log"
    start=$(date +%s)
    # cargo runs a test binary in its package's directory; do the same
    bin_env=()
    if [ "${t%%:*}" = onceflow-broker ] && [ -n "$broker_bin" ]; then
      bin_env=("CARGO_BIN_EXE_onceflow-broker=$broker_bin")
    fi
    if (cd "${pkg_dir[${t%%:*}]}" && env "${bin_env[@]}" "${bin[$t]}" --test-threads="$threads" "${extra[@]}") >"$log" 2>&1; then
      status=ok
      rm -f "$log"
    else
      status=FAILED
      fails[$t]=$(( ${fails[$t]:-0} + 1 ))
      grep -E '^test .* FAILED$|^    [a-z_0-9:]+$' "$log" | sed "s|^|run $i $t: |" \
        >>"$out/failed-tests.txt" || true
    fi
    d=$(( $(date +%s) - start ))
    secs[$t]=$(( ${secs[$t]:-0} + d ))
    if [ "$d" -gt "${maxs[$t]:-0}" ] || [ -z "${maxs[$t]:-}" ]; then maxs[$t]=$d; fi
    echo "flake-hunt: run $i/$runs $t: $status (${d}s)"
  done
done

total=0
for t in "${targets[@]}"; do total=$((total + ${fails[$t]:-0})); done
{
  echo "flake-hunt: $runs runs each, load=$([ "$load" = 1 ] && echo 'parallel cargo build' || echo none), test threads=$threads, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
  printf '%-42s %5s %8s %8s %8s\n' "test binary" runs failures "mean s" "max s"
  for t in "${targets[@]}"; do
    f=${fails[$t]:-0}
    printf '%-42s %5d %8d %8d %8d\n' "$t" "$runs" "$f" $(( ${secs[$t]} / runs )) "${maxs[$t]}"
  done
  if [ -s "$out/failed-tests.txt" ]; then
    echo "failed tests:"
    sort "$out/failed-tests.txt" | uniq -c
  fi
  echo "failed runs in total: $total; logs of failed runs: $out"
} | tee "$out/summary.txt"
[ "$total" -eq 0 ]
}

# exit on the same line: bash reads a script as it goes, and would otherwise read on from
# the old offset of a file edited during the hunt
main "$@"; exit
