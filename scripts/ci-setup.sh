#!/usr/bin/env bash
# Installs what the build and the external-client tests need, if missing:
#   - libssl-dev and pkg-config: librdkafka is built with TLS and SCRAM (rdkafka's `ssl`
#     feature links OpenSSL)
#   - kcat (Debian package) for broker/tests/kcat.rs
#   - a Python venv at .venv with kafka-python (PyPI) for broker/tests/python_clients.rs
#   - Java 17 and Maven, and Apache Kafka 4.4's jars resolved by Maven from
#     testkit/apache-kafka/pom.xml into the local Maven repository, for tests/apache_kafka.rs
#     (scripts/apache-kafka.sh)
#   - Prometheus (Debian package: promtool and the server) for tests/deploy.rs, which checks
#     the alert rules and evaluates them and the dashboard's queries against a running job,
#     and systemd-analyze (Debian's systemd package) with which it verifies the unit
# Idempotent: a second run changes nothing and says so. Prints what it did.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "ci-setup: not root and no sudo; apt-get installs will likely fail" >&2
    fi
fi

apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        echo "ci-setup: apt-get update"
        $SUDO apt-get update -qq
        apt_updated=1
    fi
    echo "ci-setup: apt-get install $*"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# OpenSSL headers for librdkafka's TLS and SASL SCRAM support.
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; then
    echo "ci-setup: OpenSSL development files already installed: $(pkg-config --modversion openssl)"
else
    apt_install libssl-dev pkg-config
    echo "ci-setup: installed libssl-dev and pkg-config"
fi

# kcat (the Debian package; older releases named the binary kafkacat).
if command -v kcat >/dev/null 2>&1; then
    echo "ci-setup: kcat already installed: $(command -v kcat)"
else
    if apt_install kcat; then
        echo "ci-setup: installed kcat: $(command -v kcat || echo 'NOT FOUND')"
    else
        echo "ci-setup: WARNING: could not install kcat; kcat tests will be skipped" >&2
    fi
fi

# Python venv with kafka-python.
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    apt_install python3 python3-venv || true
fi
VENV=.venv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import kafka' >/dev/null 2>&1; then
    echo "ci-setup: $VENV already has kafka-python $("$VENV/bin/python" -c 'import kafka; print(kafka.__version__)')"
else
    if [ ! -x "$VENV/bin/python" ]; then
        echo "ci-setup: creating venv $VENV"
        if ! "$PYTHON" -m venv "$VENV"; then
            # Debian's python3 needs python3-venv for ensurepip.
            apt_install python3-venv
            rm -rf "$VENV"
            "$PYTHON" -m venv "$VENV"
        fi
    fi
    echo "ci-setup: pip install kafka-python into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check kafka-python
    echo "ci-setup: installed kafka-python $("$VENV/bin/python" -c 'import kafka; print(kafka.__version__)')"
fi
# Java and Maven for Apache Kafka 4.4 as a test broker (tests/apache_kafka.rs).
if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
    echo "ci-setup: java and mvn already installed: $(java -version 2>&1 | head -1); $(mvn -B -v 2>/dev/null | head -1 | sed "s/\x1b\[[0-9;]*m//g")"
else
    apt_install openjdk-17-jre-headless maven
    echo "ci-setup: installed $(java -version 2>&1 | head -1)"
fi
# Prometheus server and promtool for tests/deploy.rs (no recommends: the node exporter and
# the web console libraries are not needed).
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    echo "ci-setup: prometheus already installed: $(promtool --version 2>&1 | head -1)"
else
    apt_install --no-install-recommends prometheus
    echo "ci-setup: installed $(promtool --version 2>&1 | head -1)"
fi
if command -v systemd-analyze >/dev/null 2>&1; then
    echo "ci-setup: systemd-analyze already installed: $(systemd-analyze --version | head -1)"
else
    apt_install --no-install-recommends systemd
    echo "ci-setup: installed $(systemd-analyze --version | head -1)"
fi
if ! command -v openssl >/dev/null 2>&1; then
    apt_install openssl
fi
# Resolve Kafka's jars now, so that the first Kafka test does not wait for the download
# (a second run finds them in ~/.m2 and downloads nothing).
t0=$SECONDS
cp_file="$(bash scripts/apache-kafka.sh classpath)"
echo "ci-setup: Apache Kafka 4.4 class path ready in $((SECONDS - t0)) s: $(tr ':' '\n' <"$cp_file" | wc -l) jars ($cp_file)"
echo "ci-setup: done"
