#!/usr/bin/env bash
# Installs what the build and the external-client tests need, if missing:
#   - libssl-dev and pkg-config: librdkafka is built with TLS and SCRAM (rdkafka's `ssl`
#     feature links OpenSSL)
#   - kcat (Debian package) for broker/tests/kcat.rs
#   - a Python venv at .venv with kafka-python (PyPI) for broker/tests/python_clients.rs
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
echo "ci-setup: done"
