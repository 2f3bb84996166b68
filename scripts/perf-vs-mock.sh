#!/usr/bin/env bash
# Produce and fetch throughput of the onceflow broker next to librdkafka's mock cluster, both
# driven by librdkafka's own perf tool (rdkafka_performance) over loopback.
#
# Rows (each repeated REPEATS times, targets interleaved so that machine noise hits all alike):
#   produce 100 B and 1 KiB, idempotent, linger.ms=5, one partition, against
#     mock        the mock cluster inside the perf tool (-X test.mock.num.brokers=1)
#     memory      onceflow-broker --in-memory (keeps every record)
#     memory-5m   onceflow-broker --in-memory with the mock's bound: 5 MiB per partition
#                 (retention.bytes, 4 MiB segments), so the in-memory log reuses its memory as
#                 the mock does (the mock trims on every append; the broker trims a partition
#                 when a roll takes it past retention.bytes). For a BASE_BIN built before the
#                 broker did that, set RETENTION_CHECK_MS=10 (a pass every 10 ms for both
#                 builds; every 100 ms let ~130 MB pile up between passes at 1.3 GB/s).
#     durable     onceflow-broker --data-dir D --fsync every-batch
#     durable-1s  onceflow-broker --data-dir D --fsync interval-ms:1000: the same files, synced
#                 once a second instead of before each answer (what an acknowledged batch then
#                 survives: a kill -9 of the broker, not a power loss), which sets the file
#                 path apart from the disk's fdatasync
#   produce 1 KiB pipelined: the same targets, a producer that is not idempotent (acks=all,
#     max.in.flight=5). librdkafka's idempotent producer sends a partition's next request only
#     once the last one is answered (2.12 compares the messages in flight with the limit of 5
#     requests), so the rows above time one request at a time; these show a client that keeps
#     several in flight, which is what lets the broker share an fsync among requests.
#   fetch 1 KiB  (mock, memory, durable) a consumer reading, from the beginning, what a producer wrote ahead into a
#                topic of FETCH_PARTITIONS partitions, from a standalone mock cluster process and
#                from ours (the mock keeps only the last 5 MB of each partition, so the records
#                are spread over many partitions to fit)
# After the rates, the CPU seconds of each produce run: the perf tool's (the mock's thread
# included when the mock is the target) and the broker's (from /proc), medians.
# A fresh broker (and data directory) per run keeps runs independent.
# With BASE_BIN set, a second broker build (e.g. the previous commit's) runs beside the first
# in every repetition, as targets base-memory, base-memory-5m, base-durable and
# base-durable-1s, for before/after ratios taken side by side.
#
# Usage: scripts/perf-vs-mock.sh [-n REPEATS] [-s COUNT_100B] [-l COUNT_1KIB] [-f COUNT_FETCH]
# Environment: LIBRDKAFKA_DIR (default /work/librdkafka: a built librdkafka tree with
# src/librdkafka.so and examples/rdkafka_performance.c), BROKER_BIN (skip the cargo build),
# BASE_BIN (a second broker build to compare, see above), RETENTION_CHECK_MS (the memory-5m
# rows' retention interval, see above), RUN_TIMEOUT seconds per run (default 120).
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
        args+=(--in-memory --segment-bytes 4194304 --log-retention-bytes 5242880)
        if [[ -n ${RETENTION_CHECK_MS:-} ]]; then
            args+=(--log-retention-check-interval-ms "$RETENTION_CHECK_MS")
        fi
        ;;
    *)
        local fsync=every-batch
        [[ ${1#base-} == durable-1s ]] && fsync=interval-ms:1000
        DATA_DIR=$(mktemp -d "$WORK/data.XXXXXX")
        args+=(--data-dir "$DATA_DIR" --fsync "$fsync")
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
PIPELINED_OPTS=(-p 0 -X enable.idempotence=false -X acks=all -X max.in.flight=5)

# CPU seconds (user + system) a running process has used so far.
TICKS_PER_S=$(getconf CLK_TCK)
cpu_of() { awk -v hz="$TICKS_PER_S" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }

# produce SIZE COUNT TOPIC ADDR|mock LOG [PARTITION ARGS]: one partition (-p 0) by default.
# Sets CLIENT_CPU (the perf tool's CPU seconds, the mock's included when it is the target) and
# BROKER_CPU (the broker's during the run, when BROKER_PID is set).
produce() {
    local target=(-b "$4")
    [[ $4 == mock ]] && target=(-X test.mock.num.brokers=1)
    local partitions=("${@:6}")
    [[ $# -lt 6 ]] && partitions=(-p 0)
    local before=0
    [[ -n $BROKER_PID ]] && before=$(cpu_of "$BROKER_PID")
    local TIMEFORMAT='%U %S'
    # The extra arguments come last: a later -X overrides an earlier one.
    local times
    times=$({ time timeout "$RUN_TIMEOUT" "$PERF" -P -t "$3" -s "$1" -c "$2" \
        "${PRODUCER_OPTS[@]}" "${target[@]}" "${partitions[@]}" >"$5" 2>&1 || true; } 2>&1)
    CLIENT_CPU=$(awk '{printf "%.2f", $1 + $2}' <<<"$times")
    BROKER_CPU=-
    [[ -n $BROKER_PID ]] && BROKER_CPU=$(awk -v a="$before" -v b="$(cpu_of "$BROKER_PID")" 'BEGIN {printf "%.2f", b - a}')
    return 0
}

# consume COUNT TOPIC ADDR LOG: reads COUNT records from every partition of the topic.
consume() {
    local partitions=()
    for p in $(seq 0 $((FETCH_PARTITIONS - 1))); do partitions+=(-p "$p"); done
    timeout "$RUN_TIMEOUT" "$PERF" -C -t "$2" "${partitions[@]}" -o beginning -c "$1" -b "$3" \
        >"$4" 2>&1 || true
    CLIENT_CPU=- BROKER_CPU=-
}

declare -A RESULTS CLIENT_CPUS BROKER_CPUS
# record CASE|TARGET RATE: a run's rate, with the CPU seconds of the produce run before it.
record() {
    RESULTS[$1]="${RESULTS[$1]:-} $2"
    CLIENT_CPUS[$1]="${CLIENT_CPUS[$1]:-} ${CLIENT_CPU:--}"
    BROKER_CPUS[$1]="${BROKER_CPUS[$1]:-} ${BROKER_CPU:--}"
}

# --- runs -----------------------------------------------------------------------------------
echo "rdkafka_performance: $("$PERF" -h 2>&1 | grep -m1 'librdkafka version' || true)"
echo "broker: $BROKER_BIN"
KINDS=(memory memory-5m durable durable-1s)
if [[ -n ${BASE_BIN:-} ]]; then
    echo "base broker: $BASE_BIN"
    KINDS=(base-memory memory base-memory-5m memory-5m base-durable durable base-durable-1s durable-1s)
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
    # The same 1 KiB records from a producer that keeps several requests in flight.
    count=$COUNT_LARGE
    produce 1024 "$count" perf-pipe mock "$log" "${PIPELINED_OPTS[@]}"
    record "produce 1024 B pipelined|mock" "$(rate_of "$log" "$count")"
    for kind in "${KINDS[@]}"; do
        start_broker "$kind"
        produce 1024 "$count" perf-pipe "$BROKER_ADDR" "$log" "${PIPELINED_OPTS[@]}"
        record "produce 1024 B pipelined|$kind" "$(rate_of "$log" "$count")"
        cleanup
    done
    # Fetch: fill a many-partition topic (records spread at random), then read it all.
    for kind in mock "${KINDS[@]}"; do
        # A bounded log has dropped the beginning a consumer reads from; a fetch reads the
        # same files whatever the fsync policy.
        [[ $kind == *-5m || $kind == *durable-1s ]] && continue
        if [[ $kind == mock ]]; then
            start_mock perf-fetch "$FETCH_PARTITIONS"
            addr=$MOCK_ADDR
        else
            start_broker "$kind" "$FETCH_PARTITIONS"
            addr=$BROKER_ADDR
        fi
        # One random partition per record: librdkafka's sticky partitioning (the default
        # for records without a key) would put thousands in a row into one partition, past
        # the mock's 5 MB, and the consumer could not read them from the beginning.
        produce 1024 "$COUNT_FETCH" perf-fetch "$addr" "$WORK/fill.log" -X partitioner=random \
            -X sticky.partitioning.linger.ms=0
        if [[ $(rate_of "$WORK/fill.log" "$COUNT_FETCH") == FAIL ]]; then
            CLIENT_CPU=- BROKER_CPU=-
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
for case_ in "produce 100 B" "produce 1024 B" "produce 1024 B pipelined" "fetch 1024 B"; do
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

# CPU of the produce rows: the perf tool's (with the mock's thread when the mock is the
# target) and the broker's, per run; the pair's total is what the two cores share.
median_f() { tr ' ' '\n' | { grep -E '^[0-9.]+$' || true; } | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else print a[int((NR+1)/2)]}'; }
echo
echo "CPU seconds per produce run, median: client = the perf tool (the mock included for mock), broker = onceflow-broker"
printf '%-28s %-15s %8s %8s %8s\n' case target client broker total
for case_ in "produce 100 B" "produce 1024 B" "produce 1024 B pipelined"; do
    for kind in mock "${KINDS[@]}"; do
        [[ -z ${RESULTS["$case_|$kind"]:-} ]] && continue
        c=$(echo "${CLIENT_CPUS["$case_|$kind"]}" | median_f)
        b=$(echo "${BROKER_CPUS["$case_|$kind"]}" | median_f)
        t=$(awk -v c="$c" -v b="$b" 'BEGIN {printf "%.2f", c + (b == "-" ? 0 : b)}')
        printf '%-28s %-15s %8s %8s %8s\n' "$case_" "$kind" "$c" "$b" "$t"
    done
done
