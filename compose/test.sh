#!/usr/bin/env bash
# compose/test.sh [CARGO-TEST-ARGS...]: the whole test suite, with every backend topology it needs.
# Starts (installing packages if missing) all topologies with compose/up.sh, runs
# `cargo test --workspace --all-features --no-fail-fast` with the endpoints exported (every test
# binary runs even when an earlier one fails), ends with the totals over all binaries, and stops
# what it started. Exits non-zero if any test failed.
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
log=$(mktemp)
trap 'rm -f "$log"; compose/down.sh' EXIT
status=0
cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
# One line per test binary: "test result: ok. 12 passed; 0 failed; 1 ignored; ...".
awk '/^test result:/ { for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i; if ($(i+1) ~ /^ignored;/) g += $i } }
     END { printf "\ntotal: %d passed, %d failed\n(%d ignored, over every test binary)\n", p, f, g }' "$log"
if grep -q ' \.\.\. FAILED$' "$log"; then
  echo "failing tests:"
  grep ' \.\.\. FAILED$' "$log" | sed 's/^test /  /; s/ \.\.\. FAILED$//' | sort -u
fi
exit "$status"
