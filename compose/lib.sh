# shellcheck shell=bash
# compose/lib.sh: shared helpers for compose/{up,down,member}.sh. Sourced, not run; the callers set
# `set -euo pipefail`, and every function here returns non-zero rather than relying on errexit (so it can
# also be sourced by hand, e.g. `. compose/lib.sh; zk4 20201 mntr`).
# Defines the working folder $LK (LOCKKIT_COMPOSE_DIR, default <repo>/target/compose) with data/, pids/,
# logs/ and endpoints.env, the port plan of shared/BACKENDS.md §1 (plus PostgreSQL's), the members of each
# topology, and:
#   lk_ensure_packages  install missing Debian packages (root, apt-get update once, no service started)
#   lk_spawn / lk_is_ours / lk_pid / lk_stop   start detached with a recorded PID / PID-reuse guard / stop
#   lk_pg / lk_pg_start / lk_pg_stop   PostgreSQL's programs (as the user postgres when root) / pg_ctl start / stop
#   lk_pg_query / lk_pg_sql / lk_pg_promote   psql on a port / on member postgres / promote a standby
#   lk_pg_ha_diverged   the postgres-ha pair is no primary + standby any more (a test promoted the standby)
#   lk_pgbouncer_prepare / lk_pgbouncer_start   PgBouncer's config / start (as the user postgres when root)
#   zk4 PORT WORD       ZooKeeper four-letter word without nc
#   lk_prepare / lk_start / lk_wait_ready / lk_env_update   config, start, readiness, endpoints.env
# Knobs: LOCKKIT_COMPOSE_TIMEOUT (readiness bound, s, default 60), LOCKKIT_COMPOSE_STOP_TIMEOUT (SIGTERM to
# SIGKILL, s, default 3).

LK_COMPOSE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LK_ROOT=$(dirname "$LK_COMPOSE")
LK=$(realpath -m -- "${LOCKKIT_COMPOSE_DIR:-$LK_ROOT/target/compose}")
LK_DATA=$LK/data LK_PIDS=$LK/pids LK_LOGS=$LK/logs LK_ENV=$LK/endpoints.env
LK_TIMEOUT=${LOCKKIT_COMPOSE_TIMEOUT:-60}
LK_STOP_TIMEOUT=${LOCKKIT_COMPOSE_STOP_TIMEOUT:-3}
mkdir -p "$LK_DATA" "$LK_PIDS" "$LK_LOGS"

# Port plan (BACKENDS.md §1), everything on 127.0.0.1. LOCKKIT_COMPOSE_PORT_OFFSET (default 0) shifts
# every port, so a second set of topologies (with its own LOCKKIT_COMPOSE_DIR) can run beside the first.
LK_OFF=${LOCKKIT_COMPOSE_PORT_OFFSET:-0}
[[ $LK_OFF =~ ^[0-9]+$ ]] && ((LK_OFF <= 40000)) || { echo "LOCKKIT_COMPOSE_PORT_OFFSET must be 0-40000, got $LK_OFF" >&2; return 2 2>/dev/null || exit 2; }
lk_shift() { local p out=(); for p; do out+=($((p + LK_OFF))); done; echo "${out[*]}"; }
LK_REDIS_PORT=$((20000 + LK_OFF))
LK_SENTINEL_PRIMARY_PORT=$((20010 + LK_OFF)) LK_SENTINEL_REPLICA_PORT=$((20011 + LK_OFF))
read -ra LK_SENTINEL_PORTS <<<"$(lk_shift 20020 20021 20022)"
LK_SENTINEL_MASTER=lkprimary
read -ra LK_REDLOCK_PORTS <<<"$(lk_shift 20031 20032 20033 20034 20035)"
# Redis Cluster: 3 primaries + 3 replicas; the cluster bus on port + 100 (not Redis's + 10000, which
# a large offset would push past 65535).
read -ra LK_CLUSTER_PORTS <<<"$(lk_shift 20041 20042 20043 20044 20045 20046)"
read -ra LK_ETCD_CLIENT_PORTS <<<"$(lk_shift 20101 20102 20103)"
read -ra LK_ETCD_PEER_PORTS <<<"$(lk_shift 20111 20112 20113)"
read -ra LK_ZK_CLIENT_PORTS <<<"$(lk_shift 20201 20202 20203)"
read -ra LK_ZK_QUORUM_PORTS <<<"$(lk_shift 20211 20212 20213)"
read -ra LK_ZK_ELECTION_PORTS <<<"$(lk_shift 20221 20222 20223)"
# PostgreSQL (not in BACKENDS.md §1, which predates it): Debian's PostgreSQL 15, in a hundred of its own
# (20300-20399): the single server (topology postgres) on 20300, the synchronous pair (postgres-ha) on 20301
# (primary) and 20302 (standby), PgBouncer (pgbouncer, in front of the single server) on 20310. A server's
# member folder holds its cluster (data/, made by initdb or pg_basebackup) and its unix socket (-k).
LK_POSTGRES_PORT=$((20300 + LK_OFF))
LK_PG_PRIMARY_PORT=$((20301 + LK_OFF)) LK_PG_STANDBY_PORT=$((20302 + LK_OFF))
LK_PGBOUNCER_PORT=$((20310 + LK_OFF))
LK_PG_BIN=/usr/lib/postgresql/15/bin
LK_PGBOUNCER_BIN=/usr/sbin/pgbouncer
LK_PG_PASSWORD=lockkit-test
# The standby's name for synchronous replication (its application_name, the primary's
# synchronous_standby_names).
LK_PG_STANDBY_NAME=standby
# pgbouncer after postgres: up.sh starts it once its server is up.
LK_TOPOLOGIES="redis sentinel redlock redis-cluster etcd zk postgres postgres-ha pgbouncer"
# The second set of every topology, for the tests that kill, pause or reconfigure a server
# (.config/nextest.toml): a compose folder of its own inside this one, every port 500 higher
# (the sets span 311 ports, 20000-20310; the tests' private servers use 21100-22499, unshifted).
# .ci/run's examples set is 250 higher: the sets' ranges interleave there, but no two ports meet.
LK_EXCLUSIVE_DIR=$LK/exclusive LK_EXCLUSIVE_OFFSET=$((LK_OFF + 500))

lk_hostports() { local p out=''; for p; do out+=${out:+,}127.0.0.1:$p; done; echo "$out"; }
LK_ETCD_ENDPOINTS=$(lk_hostports "${LK_ETCD_CLIENT_PORTS[@]}")
LK_ETCD_CLUSTER=''
for i in 1 2 3; do LK_ETCD_CLUSTER+=${LK_ETCD_CLUSTER:+,}etcd-$i=http://127.0.0.1:${LK_ETCD_PEER_PORTS[i - 1]}; done
LK_ZK_JAVA=(java -Xms32m -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=32m
  -XX:MaxMetaspaceSize=64m -XX:-UsePerfData -Djava.net.preferIPv4Stack=true
  -Dorg.slf4j.simpleLogger.defaultLogLevel=warn
  -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar org.apache.zookeeper.server.quorum.QuorumPeerMain)

lk_now() { echo "${EPOCHREALTIME//[.,]/}"; } # microseconds
lk_since() { local us=$(($(lk_now) - $1)); printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000)); }

# ---- topologies and members ------------------------------------------------------------------------
lk_members() { # TOPOLOGY -> its member names
  case $1 in
    redis) echo redis ;;
    sentinel) echo sentinel-primary sentinel-replica sentinel-1 sentinel-2 sentinel-3 ;;
    redlock) echo redlock-1 redlock-2 redlock-3 redlock-4 redlock-5 ;;
    redis-cluster) echo cluster-1 cluster-2 cluster-3 cluster-4 cluster-5 cluster-6 ;;
    etcd) echo etcd-1 etcd-2 etcd-3 ;;
    zk) echo zk-1 zk-2 zk-3 ;;
    postgres) echo postgres ;;
    postgres-ha) echo pg-primary pg-standby ;;
    pgbouncer) echo pgbouncer ;;
    *) return 1 ;;
  esac
}
lk_topology_of() { # NAME -> its topology; non-zero for an unknown name
  case $1 in
    redis) echo redis ;;
    sentinel-primary | sentinel-replica | sentinel-[123]) echo sentinel ;;
    redlock-[1-5]) echo redlock ;;
    cluster-[1-6]) echo redis-cluster ;;
    etcd-[123]) echo etcd ;;
    zk-[123]) echo zk ;;
    postgres) echo postgres ;;
    pg-primary | pg-standby) echo postgres-ha ;;
    pgbouncer) echo pgbouncer ;;
    *) return 1 ;;
  esac
}
lk_is_pg() { [[ $1 == postgres || $1 == pg-primary || $1 == pg-standby ]]; } # NAME: a PostgreSQL server
lk_topologies() { # ARG... -> validated, de-duplicated topologies ("all" expands)
  local a t out=" "
  for a; do
    if [ "$a" = all ]; then a=$LK_TOPOLOGIES
    elif ! lk_members "$a" >/dev/null; then echo "error: unknown topology '$a' (one of: $LK_TOPOLOGIES all)" >&2; return 2; fi
    for t in $a; do [[ $out == *" $t "* ]] || out+="$t "; done
  done
  out=${out# }
  echo "${out% }"
}
lk_port() { # NAME -> client port
  local i=${1##*-}
  case $1 in
    redis) echo "$LK_REDIS_PORT" ;;
    sentinel-primary) echo "$LK_SENTINEL_PRIMARY_PORT" ;;
    sentinel-replica) echo "$LK_SENTINEL_REPLICA_PORT" ;;
    sentinel-?) echo "${LK_SENTINEL_PORTS[i - 1]}" ;;
    redlock-?) echo "${LK_REDLOCK_PORTS[i - 1]}" ;;
    cluster-?) echo "${LK_CLUSTER_PORTS[i - 1]}" ;;
    etcd-?) echo "${LK_ETCD_CLIENT_PORTS[i - 1]}" ;;
    zk-?) echo "${LK_ZK_CLIENT_PORTS[i - 1]}" ;;
    postgres) echo "$LK_POSTGRES_PORT" ;;
    pg-primary) echo "$LK_PG_PRIMARY_PORT" ;;
    pg-standby) echo "$LK_PG_STANDBY_PORT" ;;
    pgbouncer) echo "$LK_PGBOUNCER_PORT" ;;
    *) return 1 ;;
  esac
}
lk_ports() { # NAME -> every port it listens on
  local i=${1##*-}
  case $1 in
    etcd-?) echo "${LK_ETCD_CLIENT_PORTS[i - 1]} ${LK_ETCD_PEER_PORTS[i - 1]}" ;;
    zk-?) echo "${LK_ZK_CLIENT_PORTS[i - 1]} ${LK_ZK_QUORUM_PORTS[i - 1]} ${LK_ZK_ELECTION_PORTS[i - 1]}" ;;
    cluster-?) echo "${LK_CLUSTER_PORTS[i - 1]} $((LK_CLUSTER_PORTS[i - 1] + 100))" ;;
    *) lk_port "$1" ;;
  esac
}

# ---- packages ----------------------------------------------------------------------------------------
lk_ensure_packages() { # [TOPOLOGY...] (default all): apt-get install whatever is missing; protoc, openssl always
  local t need=() guard=/usr/sbin/policy-rc.d made_guard='' rc=0
  command -v protoc >/dev/null || need+=(protobuf-compiler)
  # The TLS tests (Redis, etcd, ZooKeeper) make their certificates with the openssl command.
  command -v openssl >/dev/null || need+=(openssl)
  # shellcheck disable=SC2086  # a word list
  (($#)) || set -- $LK_TOPOLOGIES
  for t; do
    case $t in
      redis | sentinel | redlock | redis-cluster)
        command -v redis-server >/dev/null || need+=(redis-server)
        command -v redis-cli >/dev/null || need+=(redis-tools) ;;
      etcd)
        command -v etcd >/dev/null || need+=(etcd-server)
        command -v etcdctl >/dev/null || need+=(etcd-client) ;;
      zk)
        { command -v java >/dev/null && [ -e /usr/share/java/zookeeper.jar ]; } || need+=(zookeeper)
        [ -e /usr/share/java/slf4j-simple.jar ] || need+=(libslf4j-java)
        # The Curator interop test (lockkit-zk/tests/interop_curator.rs) compiles a Java contender.
        [ -e /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
        command -v javac >/dev/null || need+=(default-jdk-headless) ;;
      postgres | postgres-ha | pgbouncer)
        # postgresql pulls in postgresql-15 (postgres, initdb, pg_ctl) and postgresql-client-15 (psql,
        # pg_basebackup).
        { [ -x "$LK_PG_BIN/postgres" ] && [ -x "$LK_PG_BIN/psql" ]; } || need+=(postgresql)
        [ "$t" != pgbouncer ] || [ -x "$LK_PGBOUNCER_BIN" ] || need+=(pgbouncer) ;;
    esac
  done
  ((${#need[@]})) || return 0
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  if [ "$(id -u)" != 0 ]; then
    echo "error: missing packages: ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    return 1
  fi
  echo "installing ${need[*]} (log: $LK_LOGS/apt.log)"
  # A policy-rc.d that answers 101 keeps the packages' post-install from starting system services
  # (postgresql's still creates its cluster 15/main, port 5432: it stays down and is never touched; so
  # does pgbouncer's service, port 6432).
  if [ ! -e "$guard" ]; then printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod 755 "$guard" && made_guard=1; fi
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"; } >"$LK_LOGS/apt.log" 2>&1 || rc=$?
  [ -z "$made_guard" ] || rm -f "$guard"
  if ((rc)); then echo "error: apt-get failed (rc $rc):" >&2; tail -n 20 "$LK_LOGS/apt.log" >&2; return 1; fi
  # Should a system service have started anyway, leave it alone: our ports are different.
  if pgrep -x redis-server >/dev/null || pgrep -x etcd >/dev/null || pgrep -f QuorumPeerMain >/dev/null ||
    pgrep -x postgres >/dev/null || pgrep -x pgbouncer >/dev/null; then
    echo "note: a redis/etcd/zookeeper/postgres/pgbouncer process not started by compose/ may be running; left alone (other ports)"
  fi
}

# ---- processes -------------------------------------------------------------------------------------
lk_is_ours() { # PID NAME: PID is alive and is our server for member NAME (guard against PID reuse)
  local cmd
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  cmd+=" "
  case $2 in
    etcd-*) [[ $cmd == *etcd* && $cmd == *" --data-dir $LK_DATA/$2 "* ]] ;;
    zk-*) [[ $cmd == *QuorumPeerMain* && $cmd == *" $LK_DATA/$2/zoo.cfg "* ]] ;;
    # the postmaster (pg_ctl runs it as "postgres -D DATA -p PORT ..."; its children rename themselves)
    postgres | pg-primary | pg-standby) [[ $cmd == "$LK_PG_BIN/postgres "* && $cmd == *" -D $LK_DATA/$2/data "* ]] ;;
    pgbouncer) [[ $cmd == "$LK_PGBOUNCER_BIN "* && $cmd == *" $LK_DATA/pgbouncer/pgbouncer.ini "* ]] ;;
    *) [[ $cmd == *redis-server* && ($cmd == *"127.0.0.1:$(lk_port "$2") "* || $cmd == *" $LK_DATA/$2/"*) ]] ;;
  esac
}
lk_pid() { # NAME -> PID of our running member; a stale PID file is removed
  local f=$LK_PIDS/$1.pid pid
  if [ -s "$f" ]; then
    pid=$(<"$f")
    if lk_is_ours "$pid" "$1"; then echo "$pid"; return 0; fi
    rm -f "$f"
  fi
  # pg_ctl daemonizes the postmaster, which records itself in postmaster.pid: a postmaster of our data dir
  # whose PID file is missing (lk_pg_start interrupted before it wrote it) is ours, and adopted.
  if lk_is_pg "$1" && pid=$(head -n 1 "$LK_DATA/$1/data/postmaster.pid" 2>/dev/null) && lk_is_ours "$pid" "$1"; then
    echo "$pid" >"$f"
    echo "$pid"
    return 0
  fi
  return 1
}
lk_state() { # NAME -> up | paused | down
  local pid stat
  pid=$(lk_pid "$1") || { echo down; return 0; }
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo down; return 0; }
  stat=${stat##*) }
  [ "${stat%% *}" = T ] && echo paused || echo up
}
lk_spawn() { # NAME CMD...: run CMD detached in its own session, log to logs/NAME.log, record its real PID
  local name=$1 f=$LK_PIDS/$1.pid pid state end; shift
  rm -f "$f"
  # shellcheck disable=SC2016  # $$ and $@ are expanded by the inner bash
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$f" "$@" >>"$LK_LOGS/$name.log" 2>&1 </dev/null &
  # Bounded by time, not by a count of polls: on a loaded machine the exec itself can take
  # seconds. A process that is gone or a zombie has exited; one whose command line is not (yet)
  # the server's may still be inside its exec (its command line reads empty there).
  end=$(($(lk_now) + LK_TIMEOUT * 1000000))
  while (($(lk_now) < end)); do
    if [ -s "$f" ]; then
      pid=$(<"$f")
      lk_is_ours "$pid" "$name" && return 0
      state=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$pid/stat" 2>/dev/null) || state=''
      [[ -n $state && $state != Z ]] || { echo "error: $name exited at start" >&2; return 1; }
    fi
    sleep 0.02
  done
  echo "error: $name did not start within ${LK_TIMEOUT}s" >&2 # its PID file stays: lk_pid drops it once it is stale
  return 1
}
lk_stop() { # NAME...: SIGTERM (and SIGCONT, for paused ones), SIGKILL after LK_STOP_TIMEOUT s; remove PID files.
  # PostgreSQL gets SIGINT instead, its fast shutdown (SIGTERM waits for every client to leave; down.sh
  # uses lk_pg_stop first). Sets LK_STOPPED_PIDS.
  local m pid names=() pids=() i end
  for m; do
    pid=$(lk_pid "$m") || continue
    if lk_is_pg "$m"; then kill -INT "$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
    kill -CONT "$pid" 2>/dev/null || true
    names+=("$m") pids+=("$pid")
  done
  end=$(($(lk_now) + LK_STOP_TIMEOUT * 1000000))
  for ((i = 0; i < ${#pids[@]}; i++)); do
    while lk_is_ours "${pids[i]}" "${names[i]}" && (($(lk_now) < end)); do sleep 0.05; done
  done
  for ((i = 0; i < ${#pids[@]}; i++)); do
    if lk_is_ours "${pids[i]}" "${names[i]}"; then
      echo "${names[i]}: still running ${LK_STOP_TIMEOUT}s after SIGTERM, sending SIGKILL" >&2
      kill -KILL "${pids[i]}" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < ${#pids[@]}; i++)); do
    while lk_is_ours "${pids[i]}" "${names[i]}"; do sleep 0.02; done
    rm -f "$LK_PIDS/${names[i]}.pid"
  done
  # shellcheck disable=SC2034  # used by the callers
  LK_STOPPED_PIDS=("${pids[@]}")
}
lk_proc_state() { # PID -> its state letter (R, S, T, Z...), nothing if it is gone
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}
lk_wait_reaped() { # PID...: wait (at most 3 s) until these dead processes are no zombies any more, so that
  # pgrep shows nothing (an init that reaps lazily, like this sandbox's, keeps them for up to ~2 s)
  local p stat end=$(($(lk_now) + 3000000))
  for p; do
    while stat=$(cat "/proc/$p/stat" 2>/dev/null) && stat=${stat##*) } && [ "${stat%% *}" = Z ]; do
      (($(lk_now) < end)) || return 0
      sleep 0.05
    done
  done
}
lk_tail() { # NAME: the last lines of its log, on stderr
  [ -s "$LK_LOGS/$1.log" ] || return 0
  echo "--- last lines of $LK_LOGS/$1.log:" >&2
  tail -n "${2:-20}" "$LK_LOGS/$1.log" >&2 2>/dev/null || true
}

# ---- clients -----------------------------------------------------------------------------------------
zk4() { # PORT WORD: send a ZooKeeper four-letter word to 127.0.0.1:PORT and print the answer (2 s bound)
  # shellcheck disable=SC2016
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf %s "$1" >&3 && cat <&3' "$1" "$2" 2>/dev/null
}
lk_cli() { timeout 2 redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null | tr -d '\r'; }
lk_etcdctl() { ETCDCTL_API=3 timeout 10 etcdctl --dial-timeout=1s --command-timeout=2s "$@"; }
lk_zk_mode() { zk4 "$(lk_port "$1")" srvr | sed -n 's/^Mode: //p'; }
lk_ping() { [ "$(lk_cli "$(lk_port "$1")" PING)" = PONG ]; }

# ---- configuration and start -------------------------------------------------------------------------
lk_prepare() { # NAME: create the data dir and config of member NAME unless they exist
  local name=$1 dir=$LK_DATA/$1 port i=${1##*-}
  port=$(lk_port "$name")
  mkdir -p "$dir" && chmod 700 "$dir"
  case $name in
    etcd-?) ;; # etcd keeps everything in its data dir
    postgres | pg-primary | pg-standby) lk_pg_prepare "$name" ;;
    pgbouncer) lk_pgbouncer_prepare ;;
    sentinel-[123])
      [ -s "$dir/sentinel.conf" ] || cat >"$dir/sentinel.conf" <<EOF
bind 127.0.0.1
port $port
daemonize no
dir $dir
sentinel monitor $LK_SENTINEL_MASTER 127.0.0.1 $LK_SENTINEL_PRIMARY_PORT 2
sentinel down-after-milliseconds $LK_SENTINEL_MASTER 1000
sentinel failover-timeout $LK_SENTINEL_MASTER 3000
sentinel parallel-syncs $LK_SENTINEL_MASTER 1
EOF
      ;;
    zk-?)
      mkdir -p "$dir/data"
      [ -e "$dir/data/myid" ] || echo "$i" >"$dir/data/myid"
      [ -e "$dir/zoo.cfg" ] || cat >"$dir/zoo.cfg" <<EOF
tickTime=500
initLimit=20
syncLimit=10
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$dir/data
clientPortAddress=127.0.0.1
clientPort=$port
server.1=127.0.0.1:${LK_ZK_QUORUM_PORTS[0]}:${LK_ZK_ELECTION_PORTS[0]}
server.2=127.0.0.1:${LK_ZK_QUORUM_PORTS[1]}:${LK_ZK_ELECTION_PORTS[1]}
server.3=127.0.0.1:${LK_ZK_QUORUM_PORTS[2]}:${LK_ZK_ELECTION_PORTS[2]}
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr,stat,conf,cons,wchs,dump,envi
forceSync=no
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
      ;;
    *)
      [ -s "$dir/redis.conf" ] || {
        cat <<EOF
bind 127.0.0.1
port $port
protected-mode yes
daemonize no
logfile ""
dir $dir
save ""
appendonly no
repl-diskless-sync-delay 0
EOF
        [ "$name" != sentinel-replica ] || echo "replicaof 127.0.0.1 $LK_SENTINEL_PRIMARY_PORT"
        # A replica takes over 1 s after its primary stops answering, however long it was
        # cut off itself (validity factor 0): the failover tests need it to.
        [[ $name != cluster-? ]] || printf '%s\n' "cluster-enabled yes" "cluster-config-file $dir/nodes.conf" \
          "cluster-port $((port + 100))" "cluster-node-timeout 1000" "cluster-replica-validity-factor 0"
      } >"$dir/redis.conf"
      ;;
  esac
}
lk_start() { # NAME: start member NAME from its data dir and config (lk_prepare first)
  local name=$1 dir=$LK_DATA/$1 p i=${1##*-}
  for p in $(lk_ports "$name"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "error: $name: port $p is already in use by another process" >&2
      return 1
    fi
  done
  case $name in
    # bind and port on the command line too: a config that a full disk left empty must not
    # open a server on every interface at Redis's default port.
    sentinel-[123]) lk_spawn "$name" redis-server "$dir/sentinel.conf" --sentinel --bind 127.0.0.1 --port "$(lk_port "$name")" ;;
    etcd-?)
      lk_spawn "$name" etcd --name "$name" --data-dir "$dir" \
        --listen-client-urls "http://127.0.0.1:${LK_ETCD_CLIENT_PORTS[i - 1]}" \
        --advertise-client-urls "http://127.0.0.1:${LK_ETCD_CLIENT_PORTS[i - 1]}" \
        --listen-peer-urls "http://127.0.0.1:${LK_ETCD_PEER_PORTS[i - 1]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${LK_ETCD_PEER_PORTS[i - 1]}" \
        --initial-cluster "$LK_ETCD_CLUSTER" --initial-cluster-token lk-etcd --initial-cluster-state new \
        --logger zap --log-outputs stderr --log-level warn ;;
    zk-?) lk_spawn "$name" "${LK_ZK_JAVA[@]}" "$dir/zoo.cfg" ;;
    postgres | pg-primary | pg-standby) lk_pg_start "$name" ;;
    pgbouncer) lk_pgbouncer_start ;;
    *) lk_spawn "$name" redis-server "$dir/redis.conf" --bind 127.0.0.1 --port "$(lk_port "$name")" ;;
  esac
}

# ---- PostgreSQL ----------------------------------------------------------------------------------------
# Its servers (members postgres, pg-primary, pg-standby), started and stopped with pg_ctl (not lk_spawn:
# pg_ctl daemonizes the postmaster, in a session of its own), each PID taken from postmaster.pid. Member NAME's
# folder, data/NAME, holds its cluster (data/NAME/data) and its unix socket (-k). The server refuses to run as
# root: as root, those folders belong to the user postgres and initdb/pg_basebackup/pg_ctl run as that user
# (runuser); otherwise as the caller.
lk_pg() { # PROGRAM ARG...: run $LK_PG_BIN/PROGRAM, as the user postgres when root (from /, which it can read)
  local prog=$LK_PG_BIN/$1
  shift
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$prog" "$@"); else "$prog" "$@"; fi
}
lk_pg_query() { # PORT DATABASE SQL: run SQL at 127.0.0.1:PORT (one of our servers, or PgBouncer; TCP,
  # superuser postgres), print the rows unaligned; 5 s bound
  PGPASSWORD=$LK_PG_PASSWORD PGCONNECT_TIMEOUT=2 timeout 5 "$LK_PG_BIN/psql" -X -w -q -At -h 127.0.0.1 -p "$1" -U postgres \
    -d "$2" -c "$3" 2>/dev/null
}
lk_pg_sql() { lk_pg_query "$LK_POSTGRES_PORT" "$@"; } # DATABASE SQL: lk_pg_query on member postgres
lk_pg_prepare() { # [NAME] (default postgres): the cluster of PostgreSQL member NAME, unless it is made already:
  # initdb (postgres, pg-primary) or a base backup of the running pg-primary (pg-standby)
  local name=${1:-postgres} dir data conninfo
  dir=$LK_DATA/$name data=$LK_DATA/$name/data
  # The socket's path, DIR/.s.PGSQL.PORT, must fit in 107 bytes.
  ((${#dir} <= 90)) || { echo "error: $name: $dir is too long for the server's unix socket (90 bytes at most): use a shorter LOCKKIT_COMPOSE_DIR" >&2; return 1; }
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$dir" || return 1
    runuser -u postgres -- test -w "$dir" ||
      { echo "error: $name: the user postgres cannot write $dir (a folder above it closed to others?)" >&2; return 1; }
  fi
  if [ "$name" = pg-standby ]; then
    [ ! -e "$dir/basebackup.done" ] || return 0
    rm -rf "$data" # what an interrupted pg_basebackup left
    lk_pid pg-primary >/dev/null || { echo "error: pg-standby: its primary, pg-primary, is not running" >&2; return 1; }
    # A copy of the primary (a fast checkpoint, its WAL streamed alongside) that -R makes its standby:
    # standby.signal, and this conninfo (password and application_name included) as primary_conninfo in
    # postgresql.auto.conf. The primary's settings that make it synchronous are on its command line, not in
    # the files copied here. Not fsync'd (-N): the standby fsyncs its whole data dir as it starts (a copy of
    # a running server looks crashed to it), before it replays anything.
    conninfo="host=127.0.0.1 port=$LK_PG_PRIMARY_PORT user=postgres password=$LK_PG_PASSWORD application_name=$LK_PG_STANDBY_NAME"
    if ! lk_pg pg_basebackup -d "$conninfo" -D "$data" -R -X stream -c fast -N -w >>"$LK_LOGS/$name.log" 2>&1 </dev/null; then
      echo "error: pg-standby: pg_basebackup from pg-primary failed" >&2
      lk_tail "$name"
      return 1
    fi
    : >"$dir/basebackup.done"
    return 0
  fi
  [ ! -e "$dir/initdb.done" ] || return 0
  rm -rf "$data" # what an interrupted initdb left
  # Superuser postgres with the password $LK_PG_PASSWORD over TCP (SCRAM, so that the tests see wrong
  # credentials refused; replication connections too, which initdb's pg_hba.conf allows from 127.0.0.1),
  # trusted on its own socket only. No locale (C), UTF-8.
  printf '%s\n' "$LK_PG_PASSWORD" >"$dir/pwfile" && chmod 644 "$dir/pwfile" || return 1
  if ! lk_pg initdb -D "$data" --auth-host=scram-sha-256 --auth-local=trust --pwfile="$dir/pwfile" \
    -U postgres -E UTF8 --no-locale --no-instructions >>"$LK_LOGS/$name.log" 2>&1 </dev/null; then
    echo "error: $name: initdb failed" >&2
    lk_tail "$name"
    return 1
  fi
  : >"$dir/initdb.done"
}
lk_pg_start() { # [NAME] (default postgres): start PostgreSQL member NAME from its cluster (lk_prepare first),
  # record the postmaster's PID and, but on pg-standby, create the database lockkit unless it exists
  local name=${1:-postgres} f dir data port pid opts
  f=$LK_PIDS/$name.pid dir=$LK_DATA/$name data=$LK_DATA/$name/data port=$(lk_port "$name")
  rm -f "$f"
  # After a crash the server checks the PID in postmaster.pid (and in its socket's lock file) itself: a
  # dead one it replaces. Two cases it would refuse to start on: a killed postmaster the init has not reaped
  # yet (waited for, up to 3 s), and a PID reused since by another process (its stale files removed).
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null) || pid=''
  if [[ $pid =~ ^[0-9]+$ ]]; then
    lk_wait_reaped "$pid"
    if [ -d "/proc/$pid" ] && ! lk_is_ours "$pid" "$name" && [ "$(lk_proc_state "$pid")" != Z ]; then
      echo "$name: removing the stale postmaster.pid and socket lock (PID $pid is another process now)" >>"$LK_LOGS/$name.log"
      rm -f "$data/postmaster.pid" "$dir/.s.PGSQL.$port.lock"
    fi
  fi
  # TCP on 127.0.0.1 only, the socket in the member folder, 200 connections, fsync on (durability costs
  # are measured: keep it on).
  opts="-p $port -k '$dir' -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on"
  # The primary of postgres-ha: a commit returns once the standby named $LK_PG_STANDBY_NAME has flushed it
  # (synchronous_commit on, the default, said outright); 128 MB of WAL kept for a standby that was down a
  # while. On its command line, not in its files: pg_basebackup copies those, and the standby, once
  # promoted, has no standby of its own to wait for.
  [ "$name" != pg-primary ] ||
    opts+=" -c synchronous_standby_names=$LK_PG_STANDBY_NAME -c synchronous_commit=on -c wal_keep_size=128MB"
  # Without -l the server logs to pg_ctl's output, opened here (the user postgres need not write logs/).
  if ! lk_pg pg_ctl start -D "$data" -o "$opts" -w -t "$LK_TIMEOUT" -s >>"$LK_LOGS/$name.log" 2>&1 </dev/null; then
    echo "error: $name: pg_ctl start failed" >&2
    return 1
  fi
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null) || pid=''
  lk_is_ours "$pid" "$name" || { echo "error: $name: no postmaster of $data runs after pg_ctl start" >&2; return 1; }
  echo "$pid" >"$f"
  # The standby (read-only) has the database from its primary. On pg-primary, createdb's commit must not wait
  # for a standby that is not there yet (synchronous_commit=local for its session).
  [ "$name" != pg-standby ] || return 0
  [ "$(lk_pg_query "$port" postgres "select 1 from pg_database where datname = 'lockkit'")" = 1 ] ||
    PGOPTIONS='-c synchronous_commit=local' PGPASSWORD=$LK_PG_PASSWORD "$LK_PG_BIN/createdb" -w -h 127.0.0.1 -p "$port" -U postgres lockkit >>"$LK_LOGS/$name.log" 2>&1 ||
    { echo "error: $name: createdb lockkit failed" >&2; return 1; }
}
lk_pg_stop() { # [NAME...] (default postgres): stop those PostgreSQL members that run, side by side, with
  # pg_ctl's fast shutdown (clients cut off, a shutdown checkpoint), bounded by LK_TIMEOUT; sets
  # LK_STOPPED_PIDS. Should pg_ctl fail, lk_stop remains.
  local name pid pids=() jobs=()
  (($#)) || set -- postgres
  for name; do
    pid=$(lk_pid "$name") || continue
    kill -CONT "$pid" 2>/dev/null || true # a paused postmaster (member.sh pause) would not shut down
    { lk_pg pg_ctl stop -D "$LK_DATA/$name/data" -m fast -w -t "$LK_TIMEOUT" -s >>"$LK_LOGS/$name.log" 2>&1 </dev/null ||
      echo "$name: pg_ctl stop failed (log: $LK_LOGS/$name.log)" >&2; } &
    pids+=("$pid") jobs+=($!)
  done
  ((${#jobs[@]} == 0)) || wait "${jobs[@]}" || true
  for name; do lk_pid "$name" >/dev/null || true; done # drops the PID files of those gone
  # shellcheck disable=SC2034  # used by the callers
  LK_STOPPED_PIDS=("${pids[@]}")
}
lk_pg_promote() { # NAME: promote the standby NAME (pg_ctl promote, as the server's user) and wait until it
  # accepts writes; 1 if it is no standby or does not become a primary within LK_TIMEOUT
  local name=$1 port end
  port=$(lk_port "$name")
  [ "$(lk_pg_query "$port" postgres 'select pg_is_in_recovery()')" = t ] ||
    { echo "error: $name is not a standby (pg_is_in_recovery() is not true)" >&2; return 1; }
  if ! lk_pg pg_ctl promote -D "$LK_DATA/$name/data" -w -t "$LK_TIMEOUT" -s >>"$LK_LOGS/$name.log" 2>&1 </dev/null; then
    echo "error: $name: pg_ctl promote failed" >&2
    lk_tail "$name"
    return 1
  fi
  end=$(($(lk_now) + LK_TIMEOUT * 1000000))
  until [ "$(lk_pg_query "$port" lockkit 'select pg_is_in_recovery()')" = f ]; do
    (($(lk_now) < end)) || { echo "error: $name does not answer as a primary ${LK_TIMEOUT}s after pg_ctl promote" >&2; return 1; }
    sleep 0.05
  done
}
lk_pg_ha_diverged() { # true when the postgres-ha pair is not a primary and its standby any more (the standby
  # was promoted: by a test, or by hand); says how in LK_WHY. A paused member, or one that does not answer,
  # tells nothing.
  local rec standby
  LK_WHY=''
  standby=$(lk_state pg-standby)
  if [ "$standby" = up ]; then
    rec=$(lk_pg_query "$LK_PG_STANDBY_PORT" postgres 'select pg_is_in_recovery()')
    [ "$rec" != f ] || { LK_WHY="pg-standby has been promoted"; return 0; }
  elif [ "$standby" = down ] && [ -e "$LK_DATA/pg-standby/basebackup.done" ] && [ ! -e "$LK_DATA/pg-standby/data/standby.signal" ]; then
    LK_WHY="pg-standby has been promoted (its data has no standby.signal any more)"
    return 0
  fi
  if [ "$(lk_state pg-primary)" = up ]; then
    rec=$(lk_pg_query "$LK_PG_PRIMARY_PORT" postgres 'select pg_is_in_recovery()')
    [ "$rec" != t ] || { LK_WHY="pg-primary is in recovery, a standby"; return 0; }
  fi
  return 1
}

# ---- PgBouncer -----------------------------------------------------------------------------------------
# In front of member postgres (topology postgres), transaction pooling, on 127.0.0.1 only (no unix socket).
# Started with lk_spawn, in the foreground (it logs to stderr: logs/pgbouncer.log). It refuses to run as root:
# as root it gets -u postgres and switches to that user itself once it has read its config, in the same
# process (runuser would fork, and the PID recorded would be runuser's). Its folder, data/pgbouncer, holds
# pgbouncer.ini and userlist.txt.
lk_pgbouncer_prepare() { # the config of member pgbouncer, unless it is made already
  local dir=$LK_DATA/pgbouncer
  if [ ! -e "$dir/pgbouncer.ini" ]; then
    # The client logs in with SCRAM; with the password in clear here, PgBouncer logs in to the server with
    # SCRAM too (a SCRAM secret here would tie it to one initdb's salt: a fresh postgres would refuse it).
    printf '"postgres" "%s"\n' "$LK_PG_PASSWORD" >"$dir/userlist.txt" && chmod 600 "$dir/userlist.txt" || return 1
    # tokio-postgres sends user, database, client_encoding and application_name (and options, if set):
    # PgBouncer tracks client_encoding and application_name itself; extra_float_digits (JDBC, lib/pq) is
    # ignored, and options (PgBouncer 1.18 cannot pass it on) refused.
    cat >"$dir/pgbouncer.ini.tmp" <<EOF || return 1
[databases]
* = host=127.0.0.1 port=$LK_POSTGRES_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $LK_PGBOUNCER_PORT
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
EOF
    mv -f "$dir/pgbouncer.ini.tmp" "$dir/pgbouncer.ini" || return 1
  fi
  [ "$(id -u)" != 0 ] || chown -R postgres:postgres "$dir"
}
lk_pgbouncer_start() { # start member pgbouncer (lk_prepare first)
  local user=()
  [ "$(id -u)" != 0 ] || user=(-u postgres)
  lk_spawn pgbouncer "$LK_PGBOUNCER_BIN" "${user[@]}" "$LK_DATA/pgbouncer/pgbouncer.ini"
}

# ---- readiness ---------------------------------------------------------------------------------------
lk_member_answers() { # NAME: the process answers (no quorum needed)
  case $1 in
    # etcd opens its client port only once a quorum has let it publish itself: look at its peer port
    etcd-?) (exec 3<>"/dev/tcp/127.0.0.1/${LK_ETCD_PEER_PORTS[${1##*-} - 1]}") 2>/dev/null ;;
    zk-?) [ "$(zk4 "$(lk_port "$1")" ruok)" = imok ] ;;
    postgres | pg-primary | pg-standby) [ "$(lk_pg_query "$(lk_port "$1")" postgres 'select 1')" = 1 ] ;;
    # its admin console answers without a server behind it
    pgbouncer) [ -n "$(lk_pg_query "$LK_PGBOUNCER_PORT" pgbouncer 'show version')" ] ;;
    *) lk_ping "$1" ;;
  esac
}
lk_member_serving() { # NAME: it serves requests (etcd/ZK: it is part of a quorum)
  case $1 in
    etcd-?) lk_etcdctl --endpoints="127.0.0.1:$(lk_port "$1")" endpoint health >/dev/null 2>&1 ;;
    zk-?) [[ $(lk_zk_mode "$1") =~ ^(leader|follower)$ ]] ;;
    postgres | pg-primary | pg-standby | pgbouncer) [ "$(lk_pg_query "$(lk_port "$1")" lockkit 'select 1')" = 1 ] ;;
    *) lk_ping "$1" ;;
  esac
}
lk_sentinel_field() { # PORT FIELD: a field of SENTINEL MASTER lkprimary
  lk_cli "$1" SENTINEL MASTER "$LK_SENTINEL_MASTER" | awk -v k="$2" '$0 == k { getline; print; exit }'
}
lk_sentinel_ready() { # all 3 sentinels agree on the master, see 2 other sentinels and 1 replica; replica linked
  local s port addr master='' n other
  for s in sentinel-1 sentinel-2 sentinel-3; do
    port=$(lk_port "$s") LK_BAD=$s
    addr=$(lk_cli "$port" SENTINEL get-master-addr-by-name "$LK_SENTINEL_MASTER" | paste -sd:)
    [[ $addr == 127.0.0.1:* ]] || { LK_WHY="$s does not know master $LK_SENTINEL_MASTER"; return 1; }
    [[ -z $master || $addr == "$master" ]] || { LK_WHY="sentinels disagree on the master: $master vs $addr"; return 1; }
    master=$addr
    n=$(lk_sentinel_field "$port" num-other-sentinels)
    [ "$n" = 2 ] || { LK_WHY="$s sees ${n:-?} other sentinels, not 2"; return 1; }
    n=$(lk_sentinel_field "$port" num-slaves)
    [[ $n =~ ^[1-9] ]] || { LK_WHY="$s has not discovered the replica yet"; return 1; }
  done
  case ${master##*:} in
    "$LK_SENTINEL_PRIMARY_PORT") other=sentinel-replica ;;
    "$LK_SENTINEL_REPLICA_PORT") other=sentinel-primary ;;
    *) LK_WHY="sentinels name an unknown master $master" LK_BAD=sentinel-1; return 1 ;;
  esac
  LK_BAD=$other
  lk_cli "$(lk_port "$other")" INFO replication | grep -qx "master_link_status:up" ||
    { LK_WHY="$other: replication link to $master is not up"; return 1; }
}
lk_cluster_field() { # PORT FIELD: a field of CLUSTER INFO
  lk_cli "$1" CLUSTER INFO | sed -n "s/^$2://p"
}
lk_cluster_form() { # join the 6 nodes into 3 primaries with a replica each, unless they are a cluster already
  local m hostports=()
  [ "$(lk_cluster_field "${LK_CLUSTER_PORTS[0]}" cluster_slots_assigned)" = 0 ] || return 0
  for m in $(lk_members redis-cluster); do
    lk_ping "$m" || return 0 # not up yet: the next readiness round forms it
    hostports+=("127.0.0.1:$(lk_port "$m")")
  done
  timeout 30 redis-cli --cluster create "${hostports[@]}" --cluster-replicas 1 --cluster-yes >"$LK_LOGS/cluster-create.log" 2>&1
}
lk_cluster_ready() { # every node: state ok, all slots served, 6 nodes known; every replica linked
  local m port
  for m in $(lk_members redis-cluster); do
    port=$(lk_port "$m") LK_BAD=$m
    [ "$(lk_cluster_field "$port" cluster_state)" = ok ] || { LK_WHY="$m: cluster_state is not ok"; return 1; }
    [ "$(lk_cluster_field "$port" cluster_slots_ok)" = 16384 ] || { LK_WHY="$m: not every slot is served"; return 1; }
    [ "$(lk_cluster_field "$port" cluster_known_nodes)" = 6 ] || { LK_WHY="$m does not know all 6 nodes"; return 1; }
    if [ "$(lk_cli "$port" ROLE | head -n 1)" = slave ]; then
      lk_cli "$port" INFO replication | grep -qx "master_link_status:up" ||
        { LK_WHY="$m: its replication link is not up"; return 1; }
    fi
  done
}
lk_topology_ready() { # TOPOLOGY: 0 ready, 1 not yet, 2 hopeless (a member is down or paused); sets LK_WHY, LK_BAD
  local t=$1 m mode leaders=0 out
  LK_WHY='' LK_BAD=''
  for m in $(lk_members "$t"); do
    case $(lk_state "$m") in
      down) LK_WHY="$m is not running (it exited)" LK_BAD=$m; return 2 ;;
      paused) LK_WHY="$m is paused (compose/member.sh resume $m)" LK_BAD=$m; return 2 ;;
    esac
  done
  case $t in
    sentinel) lk_sentinel_ready || return 1 ;;
    redis-cluster)
      lk_cluster_form || { LK_WHY="redis-cli --cluster create failed: $(tail -n 2 "$LK_LOGS/cluster-create.log")" LK_BAD=cluster-1; return 2; }
      lk_cluster_ready || return 1 ;;
    etcd)
      out=$(lk_etcdctl --endpoints="$LK_ETCD_ENDPOINTS" endpoint health 2>&1) ||
        { LK_WHY="etcdctl endpoint health: $(tail -n 2 <<<"$out")" LK_BAD=etcd-1; return 1; } ;;
    zk)
      for m in $(lk_members zk); do
        mode=$(lk_zk_mode "$m")
        case $mode in
          leader) leaders=$((leaders + 1)) ;;
          follower) ;;
          *) LK_WHY="$m is not serving (srvr Mode: '${mode:-none}')" LK_BAD=$m; return 1 ;;
        esac
      done
      ((leaders == 1)) || { LK_WHY="$leaders ZooKeeper leaders, not 1" LK_BAD=zk-1; return 1; } ;;
    postgres)
      [ "$(lk_pg_sql lockkit 'select 1')" = 1 ] ||
        { LK_WHY="postgres does not answer 'select 1' in database lockkit" LK_BAD=postgres; return 1; } ;;
    postgres-ha)
      out=$(lk_pg_query "$LK_PG_PRIMARY_PORT" lockkit 'select pg_is_in_recovery()')
      [ "$out" != t ] || { LK_WHY="pg-primary is a standby (in recovery)" LK_BAD=pg-primary; return 2; }
      [ "$out" = f ] || { LK_WHY="pg-primary does not answer in database lockkit" LK_BAD=pg-primary; return 1; }
      out=$(lk_pg_query "$LK_PG_STANDBY_PORT" lockkit 'select pg_is_in_recovery()')
      [ "$out" != f ] || { LK_WHY="pg-standby has been promoted (compose/up.sh postgres-ha starts a fresh pair once one member is stopped; compose/down.sh postgres-ha)" LK_BAD=pg-standby; return 2; }
      [ "$out" = t ] || { LK_WHY="pg-standby does not answer in database lockkit" LK_BAD=pg-standby; return 1; }
      out=$(lk_pg_query "$LK_PG_PRIMARY_PORT" postgres \
        "select state || ' ' || sync_state from pg_stat_replication where application_name = '$LK_PG_STANDBY_NAME'")
      [ "$out" = "streaming sync" ] ||
        { LK_WHY="pg-standby is not a streaming synchronous standby of pg-primary yet (pg_stat_replication: '${out:-no row}')" LK_BAD=pg-standby; return 1; } ;;
    pgbouncer)
      case $(lk_state postgres) in
        down) LK_WHY="its server, member postgres, is not running (compose/up.sh pgbouncer starts it too)" LK_BAD=postgres; return 2 ;;
        paused) LK_WHY="its server, member postgres, is paused (compose/member.sh resume postgres)" LK_BAD=postgres; return 2 ;;
      esac
      [ "$(lk_pg_query "$LK_PGBOUNCER_PORT" lockkit 'select 1')" = 1 ] ||
        { LK_WHY="'select 1' in database lockkit through pgbouncer fails" LK_BAD=pgbouncer; return 1; } ;;
    *) for m in $(lk_members "$t"); do lk_ping "$m" || { LK_WHY="$m does not answer PING" LK_BAD=$m; return 1; }; done ;;
  esac
}
lk_wait_ready() { # TOPOLOGY: wait until ready (bounded); on failure say why and show the blamed member's log
  local t=$1 end=$(($(lk_now) + LK_TIMEOUT * 1000000)) rc
  while :; do
    rc=0 && lk_topology_ready "$t" || rc=$?
    ((rc == 0)) && return 0
    ((rc == 1 && $(lk_now) < end)) || break
    sleep 0.1
  done
  ((rc == 2)) || LK_WHY="not ready after ${LK_TIMEOUT} s${LK_WHY:+: $LK_WHY}"
  echo "error: $t: $LK_WHY" >&2
  [ -z "$LK_BAD" ] || lk_tail "$LK_BAD"
  return 1
}

lk_leader() { # etcd|zk|sentinel|redis-cluster [SLOT] -> the member that leads now (sentinel: the current
  # master; redis-cluster: the primary serving SLOT, as the first running node that answers sees it); non-zero if none
  local m eps='' line port=''
  case $1 in
    redis-cluster)
      for m in $(lk_members redis-cluster); do
        lk_pid "$m" >/dev/null || continue
        # "<id> <host:port@bus> <flags> <primary> <ping> <pong> <epoch> <state> <slots...>"
        port=$(lk_cli "$(lk_port "$m")" CLUSTER NODES | awk -v s="$2" '
          $3 ~ /master/ && $3 !~ /fail/ {
            for (i = 9; i <= NF; i++) {
              n = split($i, r, "-"); lo = r[1]; hi = (n > 1) ? r[2] : r[1]
              if ($i !~ /^\[/ && s + 0 >= lo + 0 && s + 0 <= hi + 0) { split($2, a, "[:@]"); print a[2]; exit }
            }
          }')
        [ -z "$port" ] || break
      done
      [ -n "$port" ] || return 1 ;;
    etcd)
      for m in $(lk_members etcd); do ! lk_pid "$m" >/dev/null || eps+=${eps:+,}127.0.0.1:$(lk_port "$m"); done
      [ -n "$eps" ] || return 1
      # simple format: endpoint, id, version, db size, is leader, is learner, term, index, applied, errors
      line=$(lk_etcdctl --endpoints="$eps" endpoint status 2>/dev/null | awk -F', ' '$5 == "true" { print $1; exit }') || true
      [ -n "$line" ] || return 1
      port=${line##*:} ;;
    zk)
      for m in $(lk_members zk); do
        if lk_pid "$m" >/dev/null && [ "$(lk_zk_mode "$m")" = leader ]; then echo "$m"; return 0; fi
      done
      return 1 ;;
    sentinel)
      for m in sentinel-1 sentinel-2 sentinel-3; do
        lk_pid "$m" >/dev/null || continue
        port=$(lk_cli "$(lk_port "$m")" SENTINEL get-master-addr-by-name "$LK_SENTINEL_MASTER" | sed -n 2p)
        [ -z "$port" ] || break
      done
      [ -n "$port" ] || return 1 ;;
  esac
  for m in $(lk_members "$1"); do [ "$(lk_port "$m")" != "$port" ] || { echo "$m"; return 0; }; done
  return 1
}

# ---- endpoints.env -----------------------------------------------------------------------------------
lk_env_line() { # TOPOLOGY -> its line of endpoints.env
  case $1 in
    redis) echo "LOCKKIT_TEST_REDIS_URL=redis://127.0.0.1:$LK_REDIS_PORT" ;;
    sentinel) echo "LOCKKIT_TEST_SENTINEL_URL=redis+sentinel://$(lk_hostports "${LK_SENTINEL_PORTS[@]}")/$LK_SENTINEL_MASTER" ;;
    redlock) echo "LOCKKIT_TEST_REDLOCK_URL=redlock://$(lk_hostports "${LK_REDLOCK_PORTS[@]}")" ;;
    redis-cluster) echo "LOCKKIT_TEST_REDIS_CLUSTER_URL=redis+cluster://$(lk_hostports "${LK_CLUSTER_PORTS[@]:0:3}")" ;;
    etcd) echo "LOCKKIT_TEST_ETCD_URL=etcd://$LK_ETCD_ENDPOINTS" ;;
    zk) echo "LOCKKIT_TEST_ZK_URL=zk://$(lk_hostports "${LK_ZK_CLIENT_PORTS[@]}")" ;;
    postgres) echo "LOCKKIT_TEST_POSTGRES_URL=postgres://postgres:$LK_PG_PASSWORD@127.0.0.1:$LK_POSTGRES_PORT/lockkit" ;;
    postgres-ha) # three lines: both servers (the client picks the one that takes writes), then each alone
      echo "LOCKKIT_TEST_POSTGRES_HA_URL=postgres://postgres:$LK_PG_PASSWORD@$(lk_hostports "$LK_PG_PRIMARY_PORT" "$LK_PG_STANDBY_PORT")/lockkit"
      echo "LOCKKIT_TEST_POSTGRES_PRIMARY_URL=postgres://postgres:$LK_PG_PASSWORD@127.0.0.1:$LK_PG_PRIMARY_PORT/lockkit"
      echo "LOCKKIT_TEST_POSTGRES_STANDBY_URL=postgres://postgres:$LK_PG_PASSWORD@127.0.0.1:$LK_PG_STANDBY_PORT/lockkit" ;;
    pgbouncer) echo "LOCKKIT_TEST_PGBOUNCER_URL=postgres://postgres:$LK_PG_PASSWORD@127.0.0.1:$LK_PGBOUNCER_PORT/lockkit" ;;
  esac
}
lk_topology_alive() { local m; for m in $(lk_members "$1"); do lk_pid "$m" >/dev/null && return 0; done; return 1; }
lk_env_update() { # add|remove TOPOLOGY...: rewrite endpoints.env; keeps lines of other topologies still running
  local op=$1 t line lines tmp=$LK_ENV.$$ kept; shift
  : >"$tmp"
  for t in $LK_TOPOLOGIES; do
    lines=$(lk_env_line "$t")
    if [[ " $* " == *" $t "* ]]; then
      [ "$op" = remove ] || echo "$lines" >>"$tmp"
    elif [ -f "$LK_ENV" ] && lk_topology_alive "$t"; then
      kept=1 # every line of the topology (postgres-ha has three)
      while read -r line; do grep -qxF "$line" "$LK_ENV" || kept=''; done <<<"$lines"
      [ -z "$kept" ] || echo "$lines" >>"$tmp"
    fi
  done
  mv -f "$tmp" "$LK_ENV"
}
