#!/usr/bin/env bash
# Runs the official MCP conformance suite's client scenarios against correx's client
# (examples/mcp_conformance.rs, which drives a runtime with the scenario's server as a remote
# MCP server, and plays the user's browser for OAuth). It runs every client scenario the
# 2025-11-25 and the 2026-07-28 revisions require (--requirements: the suite exits non-zero
# when one of them fails; the extensions it also runs are reported, not scored), and so does
# this.
# Needs scripts/install-mcp.sh first (the suite and the Node 22 it runs on).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${CORREX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/correx}"
ENV="$CACHE/mcp/env"
[ -f "$ENV" ] || { echo "conformance: run scripts/install-mcp.sh first" >&2; exit 1; }
node22=$(sed -n 's/^node22=//p' "$ENV")
suite=$(sed -n 's/^conformance=//p' "$ENV")
cargo build --quiet --example mcp_conformance
client="$PWD/target/debug/examples/mcp_conformance"
out=$(mktemp -d /tmp/correx-conformance-XXXXXX)
trap 'rm -rf "$out"' EXIT
for revision in 2025-11-25 2026-07-28; do
  echo "== conformance client --requirements $revision"
  if ! (cd "$out" && "$node22" "$suite" client --command "$client" --requirements "$revision" \
    -o "$out/$revision" >"$out/$revision.log" 2>&1); then
    cat "$out/$revision.log"
    exit 1
  fi
  grep -E "^(✓|✗)|Total:|Not scored" "$out/$revision.log"
done
