#!/usr/bin/env bash
# compose/up.sh TOPOLOGY... : start lockkit's test backends on 127.0.0.1 and wait until they are ready.
#   TOPOLOGY: redis | sentinel | redlock | redis-cluster | etcd | zk | postgres | all
#   (ports: shared/BACKENDS.md §1 and, for postgres, compose/README.md)
# Installs missing Debian packages (needs root), starts the requested topologies in parallel, waits for each
# (bounded by LOCKKIT_COMPOSE_TIMEOUT, default 60 s), prints the bring-up times, and merges the URLs of the
# topologies that are up into $LK/endpoints.env (LK=${LOCKKIT_COMPOSE_DIR:-<repo>/target/compose}).
# Idempotent: running members are left alone; a member whose process is gone (stale PID file) is restarted
# with its data; a topology with no running member starts fresh from empty data dirs.
# Exit: 0 all ready; 1 some topology failed (why, and the tail of the member's log, on stderr); 2 usage.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

up_one() { # TOPOLOGY: start whatever is missing, wait until ready, report the time
  local t=$1 start m alive=0 dead=() note
  start=$(lk_now)
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
  for m in "${dead[@]}"; do
    lk_prepare "$m"
    lk_start "$m" || { lk_tail "$m"; ((alive)) || lk_stop "${dead[@]}"; return 1; }
  done
  if ! lk_wait_ready "$t"; then
    ((alive)) || { echo "$t: stopping what was started (logs kept in $LK_LOGS)" >&2; lk_stop "${dead[@]}"; }
    return 1
  fi
  echo "$t: ready in $(lk_since "$start") s ($note)"
}

(($#)) || { sed -n '2,/^set /s/^# \{0,1\}//p' "$0" >&2; exit 2; }
topos=$(lk_topologies "$@") || exit 2
# shellcheck disable=SC2086  # word splitting intended
lk_ensure_packages $topos
start=$(lk_now)
declare -A job
for t in $topos; do
  up_one "$t" &
  job[$t]=$!
done
ok=() failed=()
for t in $topos; do
  if wait "${job[$t]}"; then ok+=("$t"); else failed+=("$t"); fi
done
lk_env_update add "${ok[@]}"
echo "up: ${ok[*]:-nothing} ready, $(lk_since "$start") s in total; endpoints in $LK_ENV"
((${#failed[@]} == 0)) || { echo "up: FAILED: ${failed[*]}" >&2; exit 1; }
