#!/usr/bin/env bash
# Produce and fetch throughput of the onceflow broker next to librdkafka's mock cluster, both
# driven by librdkafka's own perf tool (rdkafka_performance) over loopback.
#
# Rows (each repeated REPEATS times, targets interleaved so that machine noise hits all alike):
#   produce 100 B and 1 KiB, idempotent, linger.ms=5, one partition, against
#     mock        the mock cluster inside the perf tool (-X test.mock.num.brokers=1)
#     memory      onceflow-broker --in-memory (keeps every record)
#     memory-5m   onceflow-broker --in-memory with the mock's bound: 5 MiB per partition
#                 (retention.bytes, 4 MiB segments, retention checked every 100 ms), so the
#                 in-memory log reuses its memory as the mock does
#     durable     onceflow-broker --data-dir D --fsync every-batch
#   fetch 1 KiB  (mock, memory, durable) a consumer reading, from the beginning, what a producer wrote ahead into a
#                topic of FETCH_PARTITIONS partitions, from a standalone mock cluster process and
#                from ours (the mock keeps only the last 5 MB of each partition, so the records
#                are spread over many partitions to fit)
# A fresh broker (and data directory) per run keeps runs independent.
# With BASE_BIN set, a second broker build (e.g. the previous commit's) runs beside the first
# in every repetition, as targets base-memory and base-durable, for before/after ratios taken
# side by side.
#
# Usage: scripts/perf-vs-mock.sh [-n REPEATS] [-s COUNT_100B] [-l COUNT_1KIB] [-f COUNT_FETCH]
# Environment: LIBRDKAFKA_DIR (default /work/librdkafka: a built librdkafka tree with
# src/librdkafka.so and examples/rdkafka_performance.c), BROKER_BIN (skip the cargo build),
# BASE_BIN (a second broker build to compare, see above), RUN_TIMEOUT seconds per run
# (default 120).
set -euo pipefail

REPEATS=3
COUNT_SMALL=2000000
COUNT_LARGE=500000
COUNT_FETCH=300000
FETCH_PARTITIONS=128
while getopts "n:s:l:f:" opt; do
    case $opt in
    n) REPEATS=$OPTARG ;;
    s) COUNT_SMALL=$OPTARG ;;
    l) COUNT_LARGE=$OPTARG ;;
    f) COUNT_FETCH=$OPTARG ;;
    *)
        echo "usage: $0 [-n REPEATS] [-s COUNT_100B] [-l COUNT_1KIB] [-f COUNT_FETCH]" >&2
        exit 2
        ;;
    esac
done
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
LIBRDKAFKA_DIR=${LIBRDKAFKA_DIR:-/work/librdkafka}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$ROOT/target/perf-vs-mock
mkdir -p "$WORK"

# --- build what is needed -------------------------------------------------------------------
if [[ -z ${BROKER_BIN:-} ]]; then
    (cd "$ROOT" && cargo build --release -p onceflow-broker --quiet)
    BROKER_BIN=$ROOT/target/release/onceflow-broker
fi
LIB=$LIBRDKAFKA_DIR/src
[[ -f $LIB/librdkafka.so ]] || {
    echo "no $LIB/librdkafka.so: build librdkafka first (./configure && make)" >&2
    exit 1
}
mkdir -p "$WORK/include/librdkafka"
cp "$LIB/rdkafka.h" "$LIB/rdkafka_mock.h" "$WORK/include/librdkafka/"
PERF=$WORK/rdkafka_performance
MOCK=$WORK/mock_cluster
if [[ ! -x $PERF || $PERF -ot $LIBRDKAFKA_DIR/examples/rdkafka_performance.c ]]; then
    cc -O2 -I"$LIB" "$LIBRDKAFKA_DIR/examples/rdkafka_performance.c" -o "$PERF" \
        -L"$LIB" -lrdkafka -Wl,-rpath,"$LIB" -lm -lpthread
fi
if [[ ! -x $MOCK || $MOCK -ot $ROOT/scripts/perf-vs-mock/mock_cluster.c ]]; then
    cc -O2 -I"$WORK/include" "$ROOT/scripts/perf-vs-mock/mock_cluster.c" -o "$MOCK" \
        -L"$LIB" -lrdkafka -Wl,-rpath,"$LIB"
fi

# --- helpers --------------------------------------------------------------------------------
BROKER_PID=
MOCK_PID=
DATA_DIR=
cleanup() {
    # The mock dies of the signal (status 143): not a failure of this script.
    if [[ -n $BROKER_PID ]]; then kill "$BROKER_PID" 2>/dev/null; wait "$BROKER_PID" 2>/dev/null || true; fi
    if [[ -n $MOCK_PID ]]; then kill "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null || true; fi
    if [[ -n $DATA_DIR ]]; then rm -rf "$DATA_DIR"; fi
    BROKER_PID= MOCK_PID= DATA_DIR=
    return 0
}
trap cleanup EXIT

# start_broker [base-]memory|[base-]durable [PARTITIONS]: starts a fresh broker (BASE_BIN for
# the base- kinds), sets BROKER_ADDR.
start_broker() {
    local bin=$BROKER_BIN
    [[ $1 == base-* ]] && bin=$BASE_BIN
    local args=(--listen 127.0.0.1:0 --default-partitions "${2:-1}")
    case ${1#base-} in
    memory) args+=(--in-memory) ;;
    memory-5m)
        args+=(--in-memory --segment-bytes 4194304 --log-retention-bytes 5242880
            --log-retention-check-interval-ms 100)
        ;;
    *)
        DATA_DIR=$(mktemp -d "$WORK/data.XXXXXX")
        args+=(--data-dir "$DATA_DIR" --fsync every-batch)
        ;;
    esac
    local out=$WORK/broker.out
    : >"$out"
    "$bin" "${args[@]}" >"$out" 2>"$WORK/broker.err" &
    BROKER_PID=$!
    for _ in $(seq 200); do
        if grep -q "listening on" "$out"; then
            BROKER_ADDR=$(sed -n 's/^listening on //p' "$out")
            return 0
        fi
        kill -0 "$BROKER_PID" 2>/dev/null || break
        sleep 0.05
    done
    echo "broker did not start:" >&2
    cat "$WORK/broker.err" >&2
    exit 1
}

# start_mock TOPIC PARTITIONS: a standalone mock cluster process with the topic, sets MOCK_ADDR.
start_mock() {
    local out=$WORK/mock.out
    : >"$out"
    "$MOCK" "$1" "$2" >"$out" 2>"$WORK/mock.err" &
    MOCK_PID=$!
    for _ in $(seq 200); do
        if [[ -s $out ]]; then
            MOCK_ADDR=$(head -1 "$out")
            return 0
        fi
        sleep 0.05
    done
    echo "mock cluster did not start" >&2
    exit 1
}

# The records/s of a finished rdkafka_performance run (its last summary line), or FAIL.
rate_of() {
    local line
    line=$(grep -E "msgs/s" "$1" | tail -1 || true)
    if [[ -z $line ]]; then
        echo FAIL
        return
    fi
    if [[ $line == *"produced"* ]]; then
        # "... N delivered (offset O, F failed) in T ms: R msgs/s ..." must deliver everything.
        local delivered failed
        delivered=$(sed -E 's/.* ([0-9]+) delivered.*/\1/' <<<"$line")
        failed=$(sed -E 's/.*, ([0-9]+) failed\).*/\1/' <<<"$line")
        if [[ $delivered != "$2" || $failed != 0 ]]; then
            echo FAIL
            return
        fi
    elif [[ $(sed -E 's/^% ([0-9]+) messages.*/\1/' <<<"$line") != "$2" ]]; then
        echo FAIL
        return
    fi
    sed -E 's/.*: ([0-9]+) msgs\/s.*/\1/' <<<"$line"
}

PRODUCER_OPTS=(-X enable.idempotence=true -X linger.ms=5)

# produce SIZE COUNT TOPIC ADDR|mock LOG [PARTITION ARGS]: one partition (-p 0) by default.
produce() {
    local target=(-b "$4")
    [[ $4 == mock ]] && target=(-X test.mock.num.brokers=1)
    local partitions=("${@:6}")
    [[ $# -lt 6 ]] && partitions=(-p 0)
    timeout "$RUN_TIMEOUT" "$PERF" -P -t "$3" "${partitions[@]}" -s "$1" -c "$2" \
        "${PRODUCER_OPTS[@]}" "${target[@]}" >"$5" 2>&1 || true
}

# consume COUNT TOPIC ADDR LOG: reads COUNT records from every partition of the topic.
consume() {
    local partitions=()
    for p in $(seq 0 $((FETCH_PARTITIONS - 1))); do partitions+=(-p "$p"); done
    timeout "$RUN_TIMEOUT" "$PERF" -C -t "$2" "${partitions[@]}" -o beginning -c "$1" -b "$3" \
        >"$4" 2>&1 || true
}

declare -A RESULTS
record() { RESULTS[$1]="${RESULTS[$1]:-} $2"; }

# --- runs -----------------------------------------------------------------------------------
echo "rdkafka_performance: $("$PERF" -h 2>&1 | grep -m1 'librdkafka version' || true)"
echo "broker: $BROKER_BIN"
KINDS=(memory memory-5m durable)
if [[ -n ${BASE_BIN:-} ]]; then
    echo "base broker: $BASE_BIN"
    KINDS=(base-memory memory base-memory-5m memory-5m base-durable durable)
fi
for rep in $(seq "$REPEATS"); do
    for size in 100 1024; do
        count=$COUNT_SMALL
        [[ $size == 1024 ]] && count=$COUNT_LARGE
        log=$WORK/run.log
        produce "$size" "$count" "perf-$size" mock "$log"
        record "produce $size B|mock" "$(rate_of "$log" "$count")"
        for kind in "${KINDS[@]}"; do
            start_broker "$kind"
            produce "$size" "$count" "perf-$size" "$BROKER_ADDR" "$log"
            record "produce $size B|$kind" "$(rate_of "$log" "$count")"
            cleanup
        done
    done
    # Fetch: fill a many-partition topic (records spread at random), then read it all.
    for kind in mock "${KINDS[@]}"; do
        # A bounded log has dropped the beginning a consumer reads from.
        [[ $kind == *-5m ]] && continue
        if [[ $kind == mock ]]; then
            start_mock perf-fetch "$FETCH_PARTITIONS"
            addr=$MOCK_ADDR
        else
            start_broker "$kind" "$FETCH_PARTITIONS"
            addr=$BROKER_ADDR
        fi
        produce 1024 "$COUNT_FETCH" perf-fetch "$addr" "$WORK/fill.log" -X partitioner=random
        if [[ $(rate_of "$WORK/fill.log" "$COUNT_FETCH") == FAIL ]]; then
            record "fetch 1024 B|$kind" FAIL
        else
            consume "$COUNT_FETCH" perf-fetch "$addr" "$log"
            record "fetch 1024 B|$kind" "$(rate_of "$log" "$COUNT_FETCH")"
        fi
        cleanup
    done
done

# --- table ----------------------------------------------------------------------------------
median() { tr ' ' '\n' | { grep -E '^[0-9]+$' || true; } | sort -n | awk '{a[NR]=$1} END {if (NR==0) print 0; else print a[int((NR+1)/2)]}'; }
echo
echo "records/s per run; median; MB/s of payload at the median; ratio = median / mock's median"
echo "(machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); other processes may share it)"
printf '%-28s %-15s %-32s %10s %8s %7s\n' case target runs median MB/s ratio
for case_ in "produce 100 B" "produce 1024 B" "fetch 1024 B"; do
    size=100
    [[ $case_ == *1024* ]] && size=1024
    mock_median=$(echo "${RESULTS["$case_|mock"]:-}" | median)
    for kind in mock "${KINDS[@]}"; do
        runs=${RESULTS["$case_|$kind"]:-}
        [[ -z $runs ]] && continue
        m=$(echo "$runs" | median)
        mbs=$(awk -v r="$m" -v s="$size" 'BEGIN {printf "%.1f", r * s / 1e6}')
        ratio=-
        if [[ $mock_median != 0 ]]; then
            ratio=$(awk -v r="$m" -v b="$mock_median" 'BEGIN {printf "%.2fx", r / b}')
        fi
        printf '%-28s %-15s %-32s %10s %8s %7s\n' "$case_" "$kind" "${runs# }" "$m" "$mbs" "$ratio"
    done
done
