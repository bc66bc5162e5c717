#!/usr/bin/env bash
# A throw-away PostgreSQL 16 + pgvector for tests and demos (from scripts/fetch-postgres.sh).
#
#   scripts/pg-test-server.sh start [DIR]   initdb in DIR (default: a new temporary folder), start it
#                                           on a free loopback port, create the extension, print ONE
#                                           line on stdout: the URL (postgres://forge@127.0.0.1:PORT/forge)
#   scripts/pg-test-server.sh stop DIR      stop it (immediate shutdown) and delete DIR
#   scripts/pg-test-server.sh pause DIR     stop the server, keep DIR (tests of a lost database)
#   scripts/pg-test-server.sh resume DIR    start it again on the same port
#
# The server listens on 127.0.0.1 only (trust authentication, user `forge`, database `forge`), with
# its Unix socket inside DIR; fsync is off (the data is thrown away). `initdb` and `postgres` refuse
# to run as root, so as root they run as `nobody` (setpriv) in a DIR that user owns. Everything
# else goes to stderr and DIR/log; a start that fails prints the log's tail and exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG="${FORGE_POSTGRES_DIR:-$ROOT/.postgres}/pgserver/pginstall"
die() { echo "pg-test-server: error: $*" >&2; exit 1; }

as_owner() {
  if [[ "$(id -u)" == 0 ]]; then
    setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all env HOME="$DIR" "$@"
  else
    "$@"
  fi
}

# As root the server runs as `nobody`, which must be able to reach the binaries: a checkout under
# a private folder (/root/...) is not, so the install is copied once to a world-readable place.
usable_install() {
  [[ "$(id -u)" == 0 ]] || return 0
  DIR=/ as_owner test -x "$PG/bin/postgres" && return 0
  local base="${FORGE_POSTGRES_DIR:-$ROOT/.postgres}"
  local copy="${TMPDIR:-/tmp}/forge-postgres-$(cat "$base/stamp" 2>/dev/null | cut -c1-12)"
  if [[ ! -x "$copy/pgserver/pginstall/bin/postgres" ]]; then
    rm -rf "$copy.new" && cp -a "$base" "$copy.new" && chmod -R a+rX "$copy.new" && rm -rf "$copy" && mv "$copy.new" "$copy"
  fi
  PG="$copy/pgserver/pginstall"
}

cmd="${1:-}"
case "$cmd" in
  start)
    [[ -x "$PG/bin/postgres" ]] || die "no PostgreSQL in $PG: run scripts/fetch-postgres.sh (or scripts/fetch-test-clients.sh)"
    usable_install
    DIR="${2:-$(mktemp -d "${TMPDIR:-/tmp}/forge-pg.XXXXXX")}"
    mkdir -p "$DIR"
    [[ "$(id -u)" == 0 ]] && chown nobody:nogroup "$DIR"
    chmod 0700 "$DIR"
    as_owner test -w "$DIR" || die "$DIR cannot be reached by the server's user (nobody): a parent folder is private; use a folder under /tmp"
    PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    as_owner "$PG/bin/initdb" -D "$DIR/data" -U forge --auth=trust -E UTF8 --locale=C --no-sync >"$DIR/initdb.log" 2>&1 \
      || { tail -20 "$DIR/initdb.log" >&2; die "initdb failed in $DIR"; }
    as_owner "$PG/bin/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -t 60 \
      -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200" start >&2 \
      || { tail -20 "$DIR/log" >&2 2>/dev/null; die "postgres did not start (log: $DIR/log)"; }
    echo "$PORT" > "$DIR/port"
    as_owner "$PG/bin/psql" -h "$DIR" -p "$PORT" -U forge -d postgres -v ON_ERROR_STOP=1 -q \
      -c "CREATE DATABASE forge" >&2 || die "creating the database failed"
    echo "postgres://forge@127.0.0.1:$PORT/forge"
    ;;
  pause)
    DIR="${2:?usage: pg-test-server.sh pause DIR}"
    usable_install
    as_owner "$PG/bin/pg_ctl" -D "$DIR/data" -m immediate -w stop >&2
    ;;
  resume)
    DIR="${2:?usage: pg-test-server.sh resume DIR}"
    usable_install
    PORT="$(cat "$DIR/port")"
    as_owner "$PG/bin/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -t 60 \
      -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200" start >&2 \
      || { tail -20 "$DIR/log" >&2 2>/dev/null; die "postgres did not start again (log: $DIR/log)"; }
    ;;
  stop)
    DIR="${2:?usage: pg-test-server.sh stop DIR}"
    usable_install
    if [[ -f "$DIR/data/postmaster.pid" ]]; then
      as_owner "$PG/bin/pg_ctl" -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
    ;;
  *)
    echo "usage: $0 start [DIR] | stop DIR | pause DIR | resume DIR" >&2
    exit 2
    ;;
esac
