#!/usr/bin/env bash
# The test command: installs what the tests need (llama-server and the Gemma model, into a cache
# outside the repo; the MCP servers and the Prometheus and OTLP parsers the tests check with; a
# PostgreSQL server from the distribution's packages, started in a temp dir), then
# runs every test: the Rust suites, the C hosts (plain, under valgrind,
# under ASan/UBSan, and built through pkg-config), the Rust embedding example, the Java library
# (its tests and demo on JDK 17 and on a JDK >= 22 when present) and the Java (Panama) demo when
# a JDK >= 22 is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# A throwaway PostgreSQL cluster for the PostgreSQL store's tests (unless the caller, such as
# .ci/run, started one and exported its CORREX_TEST_PG_* variables).
if [ -z "${CORREX_TEST_PG_URL:-}" ]; then
  pgdir=$(mktemp -d /tmp/correx-pg-XXXXXX)
  trap 'bash scripts/postgres.sh stop "$pgdir"' EXIT
  eval "$(bash scripts/postgres.sh start "$pgdir")"
  export PGPASSFILE=$CORREX_TEST_PG_PASSFILE
fi
bash scripts/install-llama.sh >/dev/null
bash scripts/install-mcp.sh >/dev/null
bash scripts/install-checkers.sh >/dev/null
# Benchmarks run in .ci/run with `cargo bench`, not here.
cargo test --lib --tests --examples
cargo test --doc
bash scripts/conformance.sh
make -C examples/c test
echo "== rust embed example"
cargo run --release --quiet --example embed
echo "== java library (JNI): tests and demo"
make -C java test demo
echo "== java (panama) demo"
bash scripts/jvm-demo.sh
