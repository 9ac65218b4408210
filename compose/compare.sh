#!/usr/bin/env bash
# compose/compare.sh [--quick] [--speed-only] [--json FILE] [--svg FILE]: the comparison suite
# (examples/compare/main.rs says what it measures: lockkit beside each backend's raw floor (two on
# PostgreSQL: advisory locks and a lease table) and, on Redis and Redlock, rslock) in a release build, on every tier it supports. Without --json/--svg it
# writes target/compare/compare.json and target/compare/compare.svg. It starts the topologies the suite needs with
# compose/up.sh (installing packages if missing) and stops them afterwards.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# The suite covers these topologies (the memory tier needs none).
topologies=(redis sentinel redlock etcd zk postgres)
if ((${#topologies[@]})); then
  trap 'compose/down.sh "${topologies[@]}"' EXIT
  compose/up.sh "${topologies[@]}"
  set -a
  # shellcheck disable=SC1091
  . "${LOCKKIT_COMPOSE_DIR:-$root/target/compose}/endpoints.env"
  set +a
fi
args=("$@")
mkdir -p target/compare
[[ " $* " == *" --json "* ]] || args+=(--json target/compare/compare.json)
[[ " $* " == *" --svg "* ]] || args+=(--svg target/compare/compare.svg)
cargo run --release --all-features --example compare -- "${args[@]}"
