#!/usr/bin/env bash
# Runs examples/jvm/Demo.java against target/release/libcorrex.so with the first JDK >= 22 found
# (JAVA_HOME, java on PATH, or /usr/lib/jvm/*). Exits 0 with a note when there is none.
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
"$java" --enable-native-access=ALL-UNNAMED -Dcorrex.lib=target/release/libcorrex.so examples/jvm/Demo.java
