#!/usr/bin/env bash
# Makes sure the services the tests and the demo need are up on loopback: NATS with JetStream on
# 127.0.0.1:4222 and PostgreSQL on 127.0.0.1:5432 with a database `test`. Starts whichever is not
# running, with the binaries a machine of this kind has (nats-server, pg_ctlcluster); leaves running
# ones alone. Every wait is bounded. Honours NATS_URL / DATABASE_URL only in that it checks the
# default loopback ports: point those variables elsewhere and this script is not needed.
set -euo pipefail

JW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[services] %s\n' "$*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do port_open "$1" && return 0; sleep 0.1; done
  return 1
}

ensure_nats() {
  if port_open 4222; then return; fi
  command -v nats-server >/dev/null || { log "nats-server is not installed"; exit 1; }
  local store=/var/lib/nats-server logfile=/var/log/nats-server.log
  if ! { mkdir -p "$store" && [ -w "$store" ]; } 2>/dev/null; then store="$JW_ROOT/.tmp/nats"; mkdir -p "$store"; fi
  if ! { touch "$logfile"; } 2>/dev/null; then logfile="$JW_ROOT/.tmp/nats-server.log"; fi
  log "starting nats-server with JetStream on 127.0.0.1:4222 (store $store)"
  if command -v start-stop-daemon >/dev/null && [ "$(id -u)" = 0 ]; then
    start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
      -a 127.0.0.1 -p 4222 -js -sd "$store" -l "$logfile"
  else
    nohup nats-server -a 127.0.0.1 -p 4222 -js -sd "$store" -l "$logfile" >/dev/null 2>&1 &
  fi
  wait_port 4222 20 || { log "nats-server did not open 127.0.0.1:4222 within 20 s (see $logfile)"; exit 1; }
}

ensure_postgres() {
  if ! port_open 5432; then
    command -v pg_ctlcluster >/dev/null || { log "pg_ctlcluster is not installed"; exit 1; }
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n1)
    log "starting PostgreSQL $version/main on 127.0.0.1:5432"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    wait_port 5432 30 || { log "PostgreSQL did not open 127.0.0.1:5432 within 30 s"; exit 1; }
  fi
  local i
  for ((i = 0; i < 100; i++)); do
    psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1 && break
    sleep 0.1
  done
  if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "select 1 from pg_database where datname = 'test'")" != 1 ]; then
    log "creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'create database test' >/dev/null
  fi
}

ensure_nats
ensure_postgres
