#!/usr/bin/env bash
# compose/member.sh ACTION NAME : fault injection on one member of a topology started by compose/up.sh.
#   kill      SIGKILL, wait until it is gone            pause    SIGSTOP         resume   SIGCONT
#   stop      SIGTERM, wait (SIGKILL after LOCKKIT_COMPOSE_STOP_TIMEOUT s, default 3)
#   restart   stop it if running, start it again with its existing data dir and config, and wait until it
#             answers (etcd/ZK: until it serves, if at least 2 of the 3 members run; else only until it
#             listens: a lone etcd member opens its client port only once it has a quorum)
#   promote   pg-standby: `pg_ctl promote -D` on its data dir, as the server's user; waits until it takes
#             writes. pg-primary is left alone (kill it first for a failover). The next compose/up.sh
#             postgres-ha sees the promoted standby, stops the pair and starts a fresh one
#   pid       print its PID
#   status    print "NAME up|paused|down pid PID port PORT"; without NAME: every member
# compose/member.sh leader etcd|zk|sentinel : print the NAME that currently leads: the etcd leader, the ZK
#   leader, or Sentinel's current master (sentinel-primary or sentinel-replica). Waits up to 10 s for one.
# compose/member.sh leader redis-cluster SLOT : print the NAME of the primary that serves hash slot SLOT
#   (0-16383) now, as the running nodes see it. Waits up to 10 s for one (during a failover).
# NAME: redis, sentinel-primary, sentinel-replica, sentinel-1..3, redlock-1..5, cluster-1..6, etcd-1..3, zk-1..3,
#   postgres, pg-primary, pg-standby (a postmaster: kill/pause act on it alone, its backends exit once it is
#   gone; stop is a fast shutdown, SIGINT; restart runs pg_ctl start on its data), pgbouncer
# Exit: 0 ok; 1 failed (did not come back in time: why and log tail on stderr); 2 usage (unknown action or
#       name); 3 the member is not up (status: down; restart: never started; leader: none found).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0" >&2; exit 2; }
die() { echo "error: $2" >&2; exit "$1"; }

status() { # NAME
  local pid
  pid=$(lk_pid "$1") || pid=-
  echo "$1 $(lk_state "$1") pid $pid port $(lk_port "$1")"
}

restart() { # NAME
  local name=$1 t running=0 m end
  t=$(lk_topology_of "$name")
  [ -e "$LK_DATA/$name" ] || die 3 "$name was never started (or was taken down): run compose/up.sh $t"
  lk_stop "$name"
  lk_prepare "$name"
  lk_start "$name" || { lk_tail "$name"; exit 1; }
  for m in $(lk_members "$t"); do ! lk_pid "$m" >/dev/null || running=$((running + 1)); done
  end=$((SECONDS + LK_TIMEOUT))
  until if ((running >= 2)); then lk_member_serving "$name"; else lk_member_answers "$name"; fi; do
    lk_pid "$name" >/dev/null || { echo "error: $name exited" >&2; lk_tail "$name"; exit 1; }
    ((SECONDS < end)) || { echo "error: $name did not answer within ${LK_TIMEOUT}s" >&2; lk_tail "$name"; exit 1; }
    sleep 0.1
  done
  [[ $t != etcd && $t != zk ]] || ((running >= 2)) || echo "note: $name answers but has no quorum ($running of 3 running)" >&2
  echo "$name restarted (pid $(lk_pid "$name"))"
}

(($# >= 1)) || usage
action=$1 name=${2:-}
if [ "$action" = leader ]; then
  [[ $name =~ ^(etcd|zk|sentinel|redis-cluster)$ ]] || die 2 "leader needs etcd, zk, sentinel or redis-cluster, not '$name'"
  slot=${3:-}
  [[ $name != redis-cluster ]] || { [[ $slot =~ ^[0-9]+$ ]] && ((slot < 16384)); } ||
    die 2 "leader redis-cluster needs a slot, 0-16383"
  for ((i = 0; i < 100; i++)); do
    lk_leader "$name" "$slot" && exit 0
    sleep 0.1
  done
  die 3 "no $name leader found"
fi
if [ "$action" = status ] && [ -z "$name" ]; then
  for t in $LK_TOPOLOGIES; do for m in $(lk_members "$t"); do status "$m"; done; done
  exit 0
fi
[[ $action =~ ^(kill|stop|pause|resume|restart|promote|pid|status)$ ]] || die 2 "unknown action '$action'"
[ -n "$name" ] || usage
lk_topology_of "$name" >/dev/null || die 2 "unknown member '$name' (redis, sentinel-primary, sentinel-replica, sentinel-1..3, redlock-1..5, cluster-1..6, etcd-1..3, zk-1..3, postgres, pg-primary, pg-standby, pgbouncer)"
[[ $action != promote || $name == pg-standby ]] || die 2 "promote needs pg-standby, not '$name'"
[ "$action" = restart ] && { restart "$name"; exit 0; }
[ "$action" = status ] && { status "$name"; [ "$(lk_state "$name")" != down ] || exit 3; exit 0; }
pid=$(lk_pid "$name") || die 3 "$name is not up"
case $action in
  pid) echo "$pid" ;;
  kill)
    kill -KILL "$pid"
    while lk_is_ours "$pid" "$name"; do sleep 0.02; done
    rm -f "$LK_PIDS/$name.pid"
    echo "$name killed (pid $pid)" ;;
  stop) lk_stop "$name"; echo "$name stopped (pid $pid)" ;;
  pause) kill -STOP "$pid"; echo "$name paused (pid $pid)" ;;
  resume) kill -CONT "$pid"; echo "$name resumed (pid $pid)" ;;
  promote)
    [ "$(lk_state "$name")" = up ] || die 1 "$name is paused (compose/member.sh resume $name)"
    lk_pg_promote "$name" || exit 1
    echo "$name promoted (pid $pid)" ;;
esac
