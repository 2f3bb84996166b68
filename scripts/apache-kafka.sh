#!/usr/bin/env bash
# Apache Kafka 4.4 as a test broker: one KRaft node (broker and controller in one process) on
# loopback, its jars resolved by Maven from testkit/apache-kafka/pom.xml into the local Maven
# repository (so the second run downloads nothing).
#
#   scripts/apache-kafka.sh start [OPTIONS]   format (first time) and start in the background;
#                                            prints "bootstrap 127.0.0.1:PORT" once it serves
#   scripts/apache-kafka.sh run [OPTIONS]     the same in the foreground (exec java; the test
#                                            kit's launcher: kill -9 of this pid kills Kafka)
#   scripts/apache-kafka.sh stop [--dir DIR] [--kill]   SIGTERM (or SIGKILL) and wait
#   scripts/apache-kafka.sh status [--dir DIR]          "running pid N bootstrap ..." or exit 1
#   scripts/apache-kafka.sh tool CLASS|NAME ARGS...      a Kafka command-line tool, e.g.
#                                            `tool kafka-transactions --bootstrap-server A list`
#   scripts/apache-kafka.sh classpath         resolve the jars, print the class path file
#
# OPTIONS (start and run):
#   --dir DIR                  node directory: server.properties, data/, kafka.log, kafka.pid
#                              (default: $ONCEFLOW_KAFKA_DIR or target/apache-kafka/node)
#   --port PORT                client listener port (default: a free port; kept in DIR on
#                              restarts so clients keep their bootstrap address)
#   --controller-port PORT     KRaft controller port (default: a free port, kept likewise)
#   --transaction-version N    the cluster's transaction.version feature at format time:
#                              2 (KIP-890 transactions v2, Kafka 4.x's default) or 0 (as 3.x)
#   --security sasl-ssl        the client listener speaks SASL_SSL (SCRAM-SHA-256/512 and
#                              PLAIN) with the StandardAuthorizer; needs --tls-dir and
#                              --jaas-users (see testkit/src/apache_kafka.rs)
#   --tls-dir DIR              server.keystore.p12 / server.truststore.p12 (password
#                              "onceflow"), or PEM files server.pem, server.key (PKCS#8) and
#                              ca.pem, converted to those with openssl and keytool; SCRAM users
#                              in scram-users.txt (lines "SCRAM-SHA-512 NAME PASSWORD", written
#                              at format time), PLAIN users in plain-users.jaas (user_NAME="PW")
#   --super-user NAME          a super user (repeatable; "admin" by default with --security)
#   --plaintext-port PORT      with --security: an extra PLAINTEXT listener for the harness
#                              (its principal is ANONYMOUS, made a super user)
#   --set KEY=VALUE            an extra server property (repeatable)
#
# Environment: KAFKA_HEAP_OPTS (default -Xms256m -Xmx1g), KAFKA_JVM_OPTS (extra JVM flags),
# KAFKA_LOG_LEVEL (stdout log level, default WARN), KAFKA_LOG_FILE (a file that gets the log at
# KAFKA_FILE_LOG_LEVEL, default INFO), ONCEFLOW_KAFKA_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
POM_DIR="$ROOT/testkit/apache-kafka"
CACHE="${ONCEFLOW_KAFKA_CACHE:-$ROOT/target/apache-kafka}"
KAFKA_VERSION=4.4.0

die() { echo "apache-kafka: $*" >&2; exit 1; }

# The class path of Kafka's jars, resolved once per pom (keyed by the pom's hash).
classpath_file() {
    local hash file
    hash="$(sha256sum "$POM_DIR/pom.xml" | cut -c1-16)"
    file="$CACHE/classpath-$hash.txt"
    if [ ! -s "$file" ]; then
        command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
        command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
        mkdir -p "$CACHE"
        echo "apache-kafka: resolving Apache Kafka $KAFKA_VERSION with Maven (first run downloads it)" >&2
        if ! mvn -B -q -f "$POM_DIR/pom.xml" dependency:build-classpath \
            -Dmdep.outputFile="$file.tmp" >"$CACHE/maven.log" 2>&1; then
            tail -30 "$CACHE/maven.log" >&2
            die "Maven could not resolve Kafka's jars (log: $CACHE/maven.log)"
        fi
        mv "$file.tmp" "$file"
    fi
    echo "$file"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The KRaft cluster id format (16 random bytes, base64url without padding). Like Kafka's own
# Uuid.randomUuid, never one that starts with "-": the storage tool would read it as an option.
cluster_id() {
    python3 -c '
import base64, os
while True:
    s = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break'
}

java_cp() {
    local cp
    cp="$(cat "$(classpath_file)")"
    # shellcheck disable=SC2086
    exec_or_run=("java" ${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g} ${KAFKA_JVM_OPTS:-}
        "-Dlog4j2.configurationFile=$POM_DIR/log4j2.properties" -cp "$cp")
}

DIR="${ONCEFLOW_KAFKA_DIR:-$ROOT/target/apache-kafka/node}"
PORT="" CPORT="" PPORT="" TXN_VERSION=2 SECURITY="" TLS_DIR="" KILL=0
SUPER_USERS=() EXTRA=()

parse_opts() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --dir) DIR="$2"; shift 2 ;;
            --port) PORT="$2"; shift 2 ;;
            --controller-port) CPORT="$2"; shift 2 ;;
            --plaintext-port) PPORT="$2"; shift 2 ;;
            --transaction-version) TXN_VERSION="$2"; shift 2 ;;
            --security) SECURITY="$2"; shift 2 ;;
            --tls-dir) TLS_DIR="$2"; shift 2 ;;
            --super-user) SUPER_USERS+=("$2"); shift 2 ;;
            --set) EXTRA+=("$2"); shift 2 ;;
            --kill) KILL=1; shift ;;
            *) die "unknown option $1 (see the comment at the top of $0)" ;;
        esac
    done
    case "$TXN_VERSION" in 0|1|2) ;; *) die "--transaction-version must be 0, 1 or 2" ;; esac
    case "$SECURITY" in ""|sasl-ssl) ;; *) die "--security must be sasl-ssl" ;; esac
    if [ -n "$SECURITY" ] && [ -z "$TLS_DIR" ]; then die "--security sasl-ssl needs --tls-dir"; fi
}

# A saved setting of the node directory (ports are kept so a restart serves the same address).
saved() { [ -f "$DIR/ports" ] && sed -n "s/^$1=//p" "$DIR/ports" || true; }

# PKCS#12 stores from PEM files (a test's certificates are PEM), once per TLS directory.
tls_stores() {
    [ -f "$TLS_DIR/server.keystore.p12" ] && return 0
    [ -f "$TLS_DIR/server.pem" ] && [ -f "$TLS_DIR/server.key" ] \
        || die "--tls-dir $TLS_DIR has neither server.keystore.p12 nor server.pem + server.key"
    openssl pkcs12 -export -in "$TLS_DIR/server.pem" -inkey "$TLS_DIR/server.key" \
        -name kafka -passout pass:onceflow -out "$TLS_DIR/server.keystore.p12.tmp" \
        || die "openssl could not build the keystore from $TLS_DIR/server.pem"
    mv "$TLS_DIR/server.keystore.p12.tmp" "$TLS_DIR/server.keystore.p12"
    if [ ! -f "$TLS_DIR/server.truststore.p12" ] && [ -f "$TLS_DIR/ca.pem" ]; then
        keytool -importcert -noprompt -storetype PKCS12 -alias ca -file "$TLS_DIR/ca.pem" \
            -keystore "$TLS_DIR/server.truststore.p12" -storepass onceflow >/dev/null \
            || die "keytool could not build the truststore from $TLS_DIR/ca.pem"
    fi
}

write_config() {
    mkdir -p "$DIR/data"
    [ -n "$SECURITY" ] && tls_stores
    PORT="${PORT:-$(saved port)}"; PORT="${PORT:-$(free_port)}"
    CPORT="${CPORT:-$(saved controller)}"; CPORT="${CPORT:-$(free_port)}"
    if [ -n "$SECURITY" ]; then
        PPORT="${PPORT:-$(saved plaintext)}"
    fi
    printf 'port=%s\ncontroller=%s\nplaintext=%s\n' "$PORT" "$CPORT" "$PPORT" >"$DIR/ports"
    local listeners="CLIENT://127.0.0.1:$PORT" advertised="CLIENT://127.0.0.1:$PORT"
    local protocols="CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT"
    if [ -n "$SECURITY" ]; then
        protocols="CONTROLLER:PLAINTEXT,CLIENT:SASL_SSL,HARNESS:PLAINTEXT"
        if [ -n "$PPORT" ]; then
            listeners="$listeners,HARNESS://127.0.0.1:$PPORT"
            advertised="$advertised,HARNESS://127.0.0.1:$PPORT"
        fi
    fi
    {
        echo "# Written by scripts/apache-kafka.sh: one KRaft node for tests, on loopback."
        echo "process.roles=broker,controller"
        echo "node.id=1"
        echo "controller.quorum.bootstrap.servers=127.0.0.1:$CPORT"
        echo "controller.listener.names=CONTROLLER"
        echo "listeners=$listeners,CONTROLLER://127.0.0.1:$CPORT"
        echo "advertised.listeners=$advertised"
        echo "listener.security.protocol.map=$protocols"
        echo "inter.broker.listener.name=CLIENT"
        echo "log.dirs=$DIR/data"
        # what the bundled broker's scenarios use for auto-created topics
        echo "num.partitions=4"
        echo "auto.create.topics.enable=true"
        # one node: every internal topic has one replica
        echo "offsets.topic.replication.factor=1"
        echo "offsets.topic.num.partitions=10"
        echo "transaction.state.log.replication.factor=1"
        echo "transaction.state.log.min.isr=1"
        echo "transaction.state.log.num.partitions=10"
        echo "share.coordinator.state.topic.replication.factor=1"
        echo "share.coordinator.state.topic.min.isr=1"
        echo "group.initial.rebalance.delay.ms=0"
        # a timed-out transaction is aborted within a second of its timeout (Kafka checks
        # every 10 s by default), as the bundled broker does: the stall tests freeze a job
        # just past its transaction timeout
        echo "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000"
        if [ -n "$SECURITY" ]; then
            local supers="User:admin"
            for u in "${SUPER_USERS[@]}"; do supers="$supers;User:$u"; done
            [ -n "$PPORT" ] && supers="$supers;User:ANONYMOUS"
            # the broker talks to itself over CLIENT: its own SCRAM user is a super user
            echo "inter.broker.listener.name=HARNESS"
            echo "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"
            echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            echo "super.users=$supers"
            echo "allow.everyone.if.no.acl.found=false"
            echo "ssl.keystore.type=PKCS12"
            echo "ssl.keystore.location=$TLS_DIR/server.keystore.p12"
            echo "ssl.keystore.password=onceflow"
            echo "ssl.key.password=onceflow"
            if [ -f "$TLS_DIR/server.truststore.p12" ]; then
                echo "ssl.truststore.type=PKCS12"
                echo "ssl.truststore.location=$TLS_DIR/server.truststore.p12"
                echo "ssl.truststore.password=onceflow"
            fi
            echo "ssl.endpoint.identification.algorithm="
            # PLAIN users come from the JAAS file; SCRAM users are written at format time
            echo "listener.name.client.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $(cat "$TLS_DIR/plain-users.jaas" 2>/dev/null || true);"
            echo "listener.name.client.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
            echo "listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
        fi
        for kv in "${EXTRA[@]}"; do echo "$kv"; done
    } >"$DIR/server.properties"
    # later lines win in a properties file: the security block's inter-broker listener
    # replaces the plain one when there is a PLAINTEXT harness listener, else keep CLIENT
    if [ -n "$SECURITY" ] && [ -z "$PPORT" ]; then
        sed -i 's/^inter.broker.listener.name=HARNESS$/inter.broker.listener.name=CLIENT/' "$DIR/server.properties"
    fi
}

format_once() {
    [ -f "$DIR/data/meta.properties" ] && return 0
    local scram=()
    if [ -n "$SECURITY" ] && [ -f "$TLS_DIR/scram-users.txt" ]; then
        # one line per user: MECHANISM NAME PASSWORD
        while read -r mech name pass; do
            [ -n "$mech" ] && scram+=(--add-scram "$mech=[name=$name,password=$pass]")
        done <"$TLS_DIR/scram-users.txt"
    fi
    java_cp
    "${exec_or_run[@]}" kafka.tools.StorageTool format --cluster-id="$(cluster_id)" \
        --config "$DIR/server.properties" --standalone \
        --feature "transaction.version=$TXN_VERSION" "${scram[@]}" >"$DIR/format.log" 2>&1 \
        || { cat "$DIR/format.log" >&2; die "kafka-storage format failed"; }
}

cmd_run() {
    parse_opts "$@"
    write_config
    format_once
    java_cp
    echo "apache-kafka: Apache Kafka $KAFKA_VERSION node in $DIR, bootstrap 127.0.0.1:$PORT, transaction.version=$TXN_VERSION${SECURITY:+, $SECURITY}"
    exec "${exec_or_run[@]}" kafka.Kafka "$DIR/server.properties"
}

cmd_start() {
    parse_opts "$@"
    if pid="$(cat "$DIR/kafka.pid" 2>/dev/null)" && kill -0 "$pid" 2>/dev/null; then
        die "already running (pid $pid, $DIR); stop it first"
    fi
    write_config
    format_once
    local args=(--dir "$DIR" --port "$PORT" --controller-port "$CPORT" --transaction-version "$TXN_VERSION")
    [ -n "$SECURITY" ] && args+=(--security "$SECURITY" --tls-dir "$TLS_DIR")
    [ -n "$PPORT" ] && args+=(--plaintext-port "$PPORT")
    for u in "${SUPER_USERS[@]}"; do args+=(--super-user "$u"); done
    for kv in "${EXTRA[@]}"; do args+=(--set "$kv"); done
    : >"$DIR/kafka.log"
    nohup "$0" run "${args[@]}" >>"$DIR/kafka.log" 2>&1 </dev/null &
    echo $! >"$DIR/kafka.pid"
    local deadline=$((SECONDS + 180))
    until grep -q "Kafka Server started" "$DIR/kafka.log"; do
        if ! kill -0 "$(cat "$DIR/kafka.pid")" 2>/dev/null; then
            tail -40 "$DIR/kafka.log" >&2
            die "Kafka exited during start-up (log: $DIR/kafka.log)"
        fi
        [ $SECONDS -lt $deadline ] || die "Kafka did not start within 180 s (log: $DIR/kafka.log)"
        sleep 0.2
    done
    echo "bootstrap 127.0.0.1:$PORT"
}

cmd_stop() {
    parse_opts "$@"
    local pid
    pid="$(cat "$DIR/kafka.pid" 2>/dev/null)" || die "no kafka.pid in $DIR"
    if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$DIR/kafka.pid"; echo "apache-kafka: not running"; return 0
    fi
    if [ "$KILL" -eq 1 ]; then kill -9 "$pid"; else kill "$pid"; fi
    local deadline=$((SECONDS + 120))
    while kill -0 "$pid" 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || { kill -9 "$pid"; echo "apache-kafka: SIGKILLed after 120 s" >&2; }
        sleep 0.2
    done
    rm -f "$DIR/kafka.pid"
    echo "apache-kafka: stopped (pid $pid)"
}

cmd_status() {
    parse_opts "$@"
    local pid
    if pid="$(cat "$DIR/kafka.pid" 2>/dev/null)" && kill -0 "$pid" 2>/dev/null; then
        echo "running pid $pid bootstrap 127.0.0.1:$(saved port) dir $DIR"
    else
        echo "not running ($DIR)"; return 1
    fi
}

# Kafka's shell wrappers by name (bin/kafka-*.sh in a Kafka release) and their classes.
tool_class() {
    case "$1" in
        kafka-topics) echo org.apache.kafka.tools.TopicCommand ;;
        kafka-configs) echo org.apache.kafka.tools.ConfigCommand ;;
        kafka-acls) echo org.apache.kafka.tools.AclCommand ;;
        kafka-consumer-groups) echo org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
        kafka-transactions) echo org.apache.kafka.tools.TransactionsCommand ;;
        kafka-features) echo org.apache.kafka.tools.FeatureCommand ;;
        kafka-console-producer) echo org.apache.kafka.tools.ConsoleProducer ;;
        kafka-console-consumer) echo org.apache.kafka.tools.consumer.ConsoleConsumer ;;
        kafka-producer-perf-test) echo org.apache.kafka.tools.ProducerPerformance ;;
        kafka-consumer-perf-test) echo org.apache.kafka.tools.ConsumerPerformance ;;
        kafka-storage) echo kafka.tools.StorageTool ;;
        *) echo "$1" ;;
    esac
}

cmd_tool() {
    [ $# -ge 1 ] || die "tool needs a tool name or class"
    local class
    class="$(tool_class "$1")"; shift
    KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx256m}"
    java_cp
    exec "${exec_or_run[@]}" "$class" "$@"
}

case "${1:-}" in
    start) shift; cmd_start "$@" ;;
    run) shift; cmd_run "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    status) shift; cmd_status "$@" ;;
    tool) shift; cmd_tool "$@" ;;
    classpath) classpath_file ;;
    *) sed -n '2,35p' "$0"; exit 2 ;;
esac
