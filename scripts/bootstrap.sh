#!/usr/bin/env bash
# Sets up a fresh Debian machine for strom: system packages, then the project virtualenv.
# Idempotent: every step checks before it acts, so `make test` can call it every time.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(etcd-server etcd-client prometheus nodejs npm)
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "bootstrap: installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}" >/dev/null
  # Debian starts the packaged daemons; strom starts its own on free ports, so stop those.
  for svc in etcd prometheus prometheus-node-exporter; do
    $SUDO systemctl stop "$svc" >/dev/null 2>&1 || true
  done
fi

stamp="$VENV/.installed"
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
fi
# Reinstall only when the dependency files changed since the last install.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  echo "bootstrap: installing Python dependencies into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev${STROM_EXTRAS:+,$STROM_EXTRAS}]"
  touch "$stamp"
fi

# Node.js test client (tests/node: RecordService from @grpc/grpc-js, driven by pytest).
# `npm ci` installs exactly package-lock.json; only when the lock changed since the last
# install. --ignore-scripts: the packages need no install scripts (protobufjs's only checks
# its CLI). Skipped with a notice where Node.js is missing (the Node tests then fail, saying so).
NODE_DIR=tests/node
if command -v npm >/dev/null 2>&1; then
  node_stamp="$NODE_DIR/node_modules/.strom-installed"
  if [ ! -f "$node_stamp" ] || [ "$NODE_DIR/package-lock.json" -nt "$node_stamp" ]; then
    echo "bootstrap: installing the Node.js test client's packages (npm ci in $NODE_DIR)"
    (cd "$NODE_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    touch "$node_stamp"
  fi
else
  echo "bootstrap: npm not found; install Node.js (Debian: nodejs npm) for the Node.js tests"
fi
