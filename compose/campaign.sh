#!/usr/bin/env bash
# compose/campaign.sh [--tiers T,...] [--scenarios S,...] [--ttl-ms N] [--random DURATION [--seed N]]: the full fault-injection campaign
# (lockkit-campaign) in a release build, every scenario on every tier it applies to. It starts the
# topologies with compose/up.sh (installing packages if missing), stops them afterwards, prints the table
# and keeps each run's histories under target/campaign/. Exit 1 if a run broke one of its tier's guarantees.
# With --random: the randomized campaign instead (lockkit-campaign/src/random/), DURATION shared by the tiers.
# PostgreSQL: postgres and postgres-ha; the campaign brings the pair up afresh after each failover it causes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
topologies=(redis sentinel redlock redis-cluster etcd zk postgres postgres-ha)
trap 'compose/down.sh "${topologies[@]}"' EXIT
compose/up.sh "${topologies[@]}"
set -a
# shellcheck disable=SC1091
. "${LOCKKIT_COMPOSE_DIR:-$root/target/compose}/endpoints.env"
set +a
cargo run --release -p lockkit-campaign -- "$@"
