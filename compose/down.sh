#!/usr/bin/env bash
# compose/down.sh [TOPOLOGY...] : stop the backends that compose/up.sh started (default: all topologies).
#   TOPOLOGY: redis | sentinel | redlock | redis-cluster | etcd | zk | postgres | postgres-ha | pgbouncer | all
#   postgres takes pgbouncer (which stands in front of it) down too; pgbouncer alone leaves postgres up.
# Signals only the PIDs recorded in $LK/pids, after checking that each still is our server (PID-reuse guard):
# SIGTERM (+SIGCONT for paused ones), SIGKILL after LOCKKIT_COMPOSE_STOP_TIMEOUT s (default 3; an etcd leader
# hangs ~7 s on SIGTERM when all members stop). A PostgreSQL server first gets `pg_ctl -m fast -w stop` on its
# own data dir (bounded by LOCKKIT_COMPOSE_TIMEOUT), then the same fallback (SIGINT, its fast shutdown, then
# SIGKILL); PgBouncer's SIGTERM is its immediate shutdown.
# Removes their data dirs (throwaway; logs are kept) and their lines from $LK/endpoints.env. Safe to run when
# nothing is up.
# Exit: 0 done; 2 usage.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

topos=$(lk_topologies "${@:-all}") || exit 2
[[ " $topos " != *" postgres "* || " $topos " == *" pgbouncer "* ]] || topos+=" pgbouncer"
start=$(lk_now)
members=() stopped=()
for t in $topos; do
  for m in $(lk_members "$t"); do
    members+=("$m")
    ! lk_pid "$m" >/dev/null || stopped+=("$m")
  done
done
# The etcd leader goes last: with its followers gone it stops at once instead of trying to hand over for ~7 s.
leader=''
[[ " $topos " != *" etcd "* ]] || leader=$(lk_leader etcd) || true
first=()
for m in "${members[@]}"; do [ "$m" = "$leader" ] || first+=("$m"); done
pids=() pg=()
# PostgreSQL: pg_ctl's fast shutdown of our postmasters; lk_stop below only acts should that have failed.
for m in "${members[@]}"; do ! lk_is_pg "$m" || pg+=("$m"); done
((${#pg[@]} == 0)) || { lk_pg_stop "${pg[@]}"; pids+=("${LK_STOPPED_PIDS[@]}"); }
lk_stop "${first[@]}"
pids+=("${LK_STOPPED_PIDS[@]}")
[ -z "$leader" ] || { lk_stop "$leader"; pids+=("${LK_STOPPED_PIDS[@]}"); }
lk_wait_reaped "${pids[@]}"
for m in "${members[@]}"; do rm -rf "${LK_DATA:?}/$m"; done
# shellcheck disable=SC2086  # word splitting intended
lk_env_update remove $topos
echo "down: stopped ${#stopped[@]} process(es) of ${topos// /, } in $(lk_since "$start") s"
