#!/usr/bin/env bash
# Installs the official parsers the observability tests check correx's output with, from PyPI,
# into a venv in a cache outside the repo: prometheus-client (the Prometheus text-format parser)
# and opentelemetry-proto (OTLP's protobuf definitions, with protobuf). Versions are pinned.
# Idempotent: a later run only checks what is there. Prints `python=...` and writes it to
# $CACHE/checkers/env, where the tests find it.
set -euo pipefail

PROMETHEUS_VERSION=0.26.0
OTLP_PROTO_VERSION=1.45.2

CACHE="${CORREX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/correx}"
DIR="$CACHE/checkers"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$DIR"
if ! "$DIR/venv/bin/python" -c "import importlib.metadata as m; assert m.version('prometheus-client') == '$PROMETHEUS_VERSION' and m.version('opentelemetry-proto') == '$OTLP_PROTO_VERSION'" 2>/dev/null; then
  echo "install-checkers: installing prometheus-client $PROMETHEUS_VERSION and opentelemetry-proto $OTLP_PROTO_VERSION" >&2
  rm -rf "$DIR/venv"
  "$PY" -m venv "$DIR/venv"
  "$DIR/venv/bin/pip" install -q "prometheus-client==$PROMETHEUS_VERSION" "opentelemetry-proto==$OTLP_PROTO_VERSION"
fi
echo "python=$DIR/venv/bin/python" | tee "$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"
