#!/usr/bin/env bash
# Runs examples/jvm/Demo.java against target/release/libcorrex.so with the first JDK >= 22 found
# (JAVA_HOME, java on PATH, or /usr/lib/jvm/*), then examples/jvm/Tail.java following the C
# demo's event log from another process while the demo writes it. Exits 0 with a note when
# there is no such JDK.
set -euo pipefail
cd "$(dirname "$0")/.."

java_version() { "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }
java=""
for candidate in "${JAVA_HOME:-}/bin/java" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
  if [ -x "$candidate" ] && [ "$(java_version "$candidate")" -ge 22 ] 2>/dev/null; then
    java="$candidate"
    break
  fi
done
if [ -z "$java" ]; then
  echo "jvm-demo: no JDK >= 22 found; skipping the Panama demo"
  exit 0
fi
cargo build --release --lib --quiet
bash scripts/install-llama.sh >/dev/null
run_java() { "$java" --enable-native-access=ALL-UNNAMED -Dcorrex.lib=target/release/libcorrex.so "$@"; }
run_java examples/jvm/Demo.java

echo "== java tails the C demo's log, across processes"
make -C examples/c build/demo >/dev/null
dir=$(mktemp -d /tmp/correx-tail-demo-XXXXXX)
trap 'rm -rf "$dir"' EXIT
run_java examples/jvm/Tail.java "$dir/events.db" model.unloaded > "$dir/tail.out" &
tail_pid=$!
CORREX_DEMO_DIR="$dir" ./examples/c/build/demo > "$dir/demo.out"
wait "$tail_pid"
cat "$dir/tail.out"
# The tail saw what the demo wrote, in order: the load first, the unload last.
grep -q 'model.loaded' "$dir/tail.out" && grep -q 'tool.execution_completed' "$dir/tail.out"
tail -n 1 "$dir/tail.out" | grep -q 'stopped at model.unloaded'
