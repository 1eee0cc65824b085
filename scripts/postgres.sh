#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: `start DIR` installs the server from the
# distribution's packages when it is missing, runs initdb in DIR as an unprivileged user (the
# server refuses to run as root), starts it listening on a UNIX socket in DIR and on loopback
# TCP, creates the database `correx`, and prints the environment the tests read:
#   CORREX_TEST_PG_URL      postgres://correx@127.0.0.1:PORT/correx (TCP, password auth)
#   CORREX_TEST_PG_SOCKET_URL  postgresql://correx@/correx?host=DIR&port=PORT (the UNIX socket)
#   CORREX_TEST_PG_PASSFILE    a libpq-style password file for the TCP URL
# `stop DIR` stops the server and removes DIR.
set -euo pipefail

cmd=${1:?usage: postgres.sh start|stop DIR}
dir=${2:?usage: postgres.sh start|stop DIR}

bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] && echo "$d"
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    # From /: the caller's directory may be closed to nobody (a clone under a 0700 temp dir).
    (cd / && setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@")
  else
    "$@"
  fi
}

case "$cmd" in
start)
  if [ -z "$(bindir)" ]; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  bin=$(bindir)
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown nobody:nogroup "$dir"
  chmod 700 "$dir"
  # A password for the TCP user, so the tests exercise password auth (SCRAM); the socket trusts
  # the local user.
  password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  pwfile="$dir/initdb-password"
  (umask 077 && printf '%s\n' "$password" > "$pwfile")
  [ "$(id -u)" = 0 ] && chown nobody:nogroup "$pwfile"
  as_owner "$bin/initdb" -D "$dir/data" -U correx --pwfile="$pwfile" -A scram-sha-256 \
    --auth-local=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c max_connections=200 -c fsync=on" \
    start >/dev/null
  as_owner "$bin/createdb" -h "$dir" -p "$port" -U correx correx
  passfile="$dir/pgpass"
  (umask 077 && printf '127.0.0.1:%s:*:correx:%s\n' "$port" "$password" > "$passfile")
  echo "export CORREX_TEST_PG_URL='postgres://correx@127.0.0.1:$port/correx'"
  echo "export CORREX_TEST_PG_SOCKET_URL='postgresql://correx@/correx?host=$dir&port=$port'"
  echo "export CORREX_TEST_PG_PASSFILE='$passfile'"
  echo "export CORREX_TEST_PG_DIR='$dir'"
  ;;
stop)
  bin=$(bindir)
  if [ -n "$bin" ] && [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null || true
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: postgres.sh start|stop DIR" >&2
  exit 2
  ;;
esac
