#!/usr/bin/env bash
# compose/test.sh [CARGO-TEST-ARGS...]: the whole test suite, with every backend topology it needs.
# Starts (installing packages if missing) all topologies with compose/up.sh, runs
# `cargo test --workspace --all-features` with the endpoints exported, and stops what it started.
# Set LOCKKIT_REQUIRE_BACKENDS=1 to make tests fail, not skip, when a server is missing (CI does).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
trap 'compose/down.sh' EXIT
compose/up.sh all
set -a
# shellcheck disable=SC1091
. "${LOCKKIT_COMPOSE_DIR:-$root/target/compose}/endpoints.env"
set +a
cargo test --workspace --all-features "$@"
