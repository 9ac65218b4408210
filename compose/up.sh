#!/usr/bin/env bash
# compose/up.sh TOPOLOGY... : start lockkit's test backends on 127.0.0.1 and wait until they are ready.
#   TOPOLOGY: redis | sentinel | redlock | redis-cluster | etcd | zk | postgres | postgres-ha | pgbouncer | all
#   (ports: shared/BACKENDS.md §1 and, for the PostgreSQL ones, compose/README.md)
#   pgbouncer stands in front of postgres's server: it brings postgres up too, and starts once that is ready.
# Installs missing Debian packages (needs root), starts the requested topologies in parallel, waits for each
# (bounded by LOCKKIT_COMPOSE_TIMEOUT, default 60 s), prints the bring-up times, and merges the URLs of the
# topologies that are up into $LK/endpoints.env (LK=${LOCKKIT_COMPOSE_DIR:-<repo>/target/compose}).
# Idempotent: running members are left alone; a member whose process is gone (stale PID file) is restarted
# with its data; a topology with no running member starts fresh from empty data dirs, and so does a
# postgres-ha pair whose standby was promoted (its running members stopped first).
# Exit: 0 all ready; 1 some topology failed (why, and the tail of the member's log, on stderr); 2 usage.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

up_one() { # TOPOLOGY: start whatever is missing, wait until ready, report the time
  local t=$1 start m alive=0 dead=() note stopped
  start=$(lk_now)
  if [ "$t" = postgres-ha ] && lk_pg_ha_diverged; then # a test promoted the standby: a new pair
    echo "$t: $LK_WHY: stopping it, to start a fresh pair"
    # shellcheck disable=SC2046  # a word list
    lk_pg_stop $(lk_members "$t")
    stopped=("${LK_STOPPED_PIDS[@]}")
    # shellcheck disable=SC2046
    lk_stop $(lk_members "$t") # should pg_ctl have failed
    lk_wait_reaped "${stopped[@]}" "${LK_STOPPED_PIDS[@]}"
  fi
  for m in $(lk_members "$t"); do
    if lk_pid "$m" >/dev/null; then alive=$((alive + 1)); else dead+=("$m"); fi
  done
  if ((alive == 0)); then # fresh start: empty data dirs, new logs
    for m in "${dead[@]}"; do rm -rf "${LK_DATA:?}/$m"; : >"$LK_LOGS/$m.log"; done
    note="started fresh"
  elif ((${#dead[@]})); then
    note="restarted ${dead[*]}"
  else
    note="already up"
  fi
  for m in "${dead[@]}"; do # in lk_members order: pg-standby is copied from the running pg-primary
    { lk_prepare "$m" && lk_start "$m"; } || { lk_tail "$m"; ((alive)) || lk_stop "${dead[@]}"; return 1; }
  done
  if ! lk_wait_ready "$t"; then
    ((alive)) || { echo "$t: stopping what was started (logs kept in $LK_LOGS)" >&2; lk_stop "${dead[@]}"; }
    return 1
  fi
  echo "$t: ready in $(lk_since "$start") s ($note)"
}

(($#)) || { sed -n '2,/^set /s/^# \{0,1\}//p' "$0" >&2; exit 2; }
topos=$(lk_topologies "$@") || exit 2
[[ " $topos " != *" pgbouncer "* || " $topos " == *" postgres "* ]] || topos+=" postgres"
# shellcheck disable=SC2086  # word splitting intended
lk_ensure_packages $topos
start=$(lk_now)
declare -A job
for t in $topos; do
  [ "$t" = pgbouncer ] && continue
  up_one "$t" &
  job[$t]=$!
done
# pgbouncer once postgres's bring-up has ended (ready or failed: then pgbouncer's readiness fails at once).
if [[ " $topos " == *" pgbouncer "* ]]; then
  { while kill -0 "${job[postgres]}" 2>/dev/null; do sleep 0.05; done; up_one pgbouncer; } &
  job[pgbouncer]=$!
fi
ok=() failed=()
for t in $topos; do
  if wait "${job[$t]}"; then ok+=("$t"); else failed+=("$t"); fi
done
lk_env_update add "${ok[@]}"
echo "up: ${ok[*]:-nothing} ready, $(lk_since "$start") s in total; endpoints in $LK_ENV"
((${#failed[@]} == 0)) || { echo "up: FAILED: ${failed[*]}" >&2; exit 1; }
