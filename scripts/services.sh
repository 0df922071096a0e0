#!/usr/bin/env bash
# Start PostgreSQL and Redis on this machine if they are not already answering (idempotent).
# Used by scripts/test.sh and .ci/run; the platform itself needs neither in embedded mode.
set -uo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
pg_up && echo "services: PostgreSQL up" || echo "services: PostgreSQL NOT reachable on 127.0.0.1:5432"

if ! redis_up; then
  echo "services: starting Redis"
  if command -v redis-server >/dev/null 2>&1; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi
redis_up && echo "services: Redis up" || echo "services: Redis NOT reachable on 127.0.0.1:6379"
exit 0
