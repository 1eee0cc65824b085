#!/usr/bin/env bash
# The test command: installs what the tests need (llama-server and the Gemma model, into a cache
# outside the repo; the MCP servers and the Prometheus and OTLP parsers the tests check with), then
# runs every test: the Rust suites, the C hosts (plain, under valgrind,
# under ASan/UBSan, and built through pkg-config), the Rust embedding example, the Java library
# (its tests and demo on JDK 17 and on a JDK >= 22 when present) and the Java (Panama) demo when
# a JDK >= 22 is present.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-llama.sh >/dev/null
bash scripts/install-mcp.sh >/dev/null
bash scripts/install-checkers.sh >/dev/null
# Benchmarks run in .ci/run with `cargo bench`, not here.
cargo test --lib --tests --examples
cargo test --doc
make -C examples/c test
echo "== rust embed example"
cargo run --release --quiet --example embed
echo "== java library (JNI): tests and demo"
make -C java test demo
echo "== java (panama) demo"
bash scripts/jvm-demo.sh
