#!/usr/bin/env bash
# Sets up a fresh Debian machine for strom: system packages, then the project virtualenv.
# Idempotent: every step checks before it acts, so `make test` can call it every time.
#
# STROM_EXTRAS (comma-separated pyproject extras beside dev) adds optional parts; the Makefile
# asks for "spark" (PySpark, and a Java runtime for it), which `make test` and `make demo` need.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${STROM_EXTRAS:-}

want_spark=0
case ",$EXTRAS," in *,spark,*) want_spark=1 ;; esac

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
if [ "$want_spark" = 1 ] && ! command -v java >/dev/null 2>&1; then
  need_apt+=(openjdk-17-jre-headless)  # PySpark runs Spark on a JVM (17 is what we test)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "bootstrap: installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
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
# Reinstall only when the dependency files changed since the last install, or an extra is
# asked for that the last install did not include (the stamp lists the installed extras).
installed=$(cat "$stamp" 2>/dev/null || true)
missing_extra=0
for extra in ${EXTRAS//,/ }; do
  case ",$installed," in *,"$extra",*) ;; *) missing_extra=1 ;; esac
done
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] \
  || [ "$missing_extra" = 1 ]; then
  all=$(printf '%s\n' ${EXTRAS//,/ } ${installed//,/ } | sort -u | paste -sd, -)
  echo "bootstrap: installing Python dependencies into $VENV${all:+ (extras: $all)}"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev${all:+,$all}]"
  printf '%s\n' "$all" >"$stamp"
fi
