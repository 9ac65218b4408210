#!/usr/bin/env bash
# compose/test.sh [NEXTEST-ARGS...]: the whole test suite, with every backend topology it needs.
# Starts (installing packages if missing) every topology twice with compose/up.sh: the set all
# tests share, and a second set ($LOCKKIT_COMPOSE_DIR/exclusive, every port 500 higher) for the
# tests that kill, pause or reconfigure servers (.config/nextest.toml says which, and runs them one
# at a time per topology). Runs every test binary with cargo-nextest, many tests at a time (most
# wait on servers and timers, not on the cores; every test runs even when another fails), after
# the doc tests with `cargo test --doc` (nextest does not run doc tests). Ends with the totals
# over both, lists the failing tests, and stops what it started. Exits non-zero if any test
# failed.
# With arguments (a package `-p lockkit-zk`, a filter, `--test-threads 2`...) only
# `cargo nextest run --workspace --all-features ARGS` runs: no doc tests.
# Set LOCKKIT_REQUIRE_BACKENDS=1 to make tests fail, not skip, when a server is missing (CI does).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. compose/lib.sh
# The second set: a compose folder and port offset of its own (lib.sh), as compose/exclusive-env.sh
# hands them to the exclusive tests.
exclusive() { LOCKKIT_COMPOSE_DIR=$LK_EXCLUSIVE_DIR LOCKKIT_COMPOSE_PORT_OFFSET=$LK_EXCLUSIVE_OFFSET "$@"; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"; compose/down.sh; exclusive compose/down.sh' EXIT
# Both sets come up side by side (apt-get, if needed, runs once, before).
lk_ensure_packages
compose/up.sh all &
up=$!
exclusive compose/up.sh all >"$logs/up-exclusive" 2>&1 &
up_exclusive=$!
up_status=0
wait "$up" || up_status=$?
wait "$up_exclusive" || up_status=$?
sed 's/^/exclusive set: /' "$logs/up-exclusive"
((up_status == 0)) || exit "$up_status"
set -a
# shellcheck disable=SC1091
. "$LK_ENV"
set +a

status=0
if (($# == 0)); then
  # The doc tests first: nextest does not run them, and they take 20 s (edition 2024 builds
  # each crate's doc tests as one program).
  cargo test --doc --workspace --all-features 2>&1 | tee "$logs/doc" || status=$?
fi
cargo nextest run --workspace --all-features "$@" 2>&1 | tee "$logs/tests" || status=$?

# nextest's summary: "Summary [ 612.3s] 838 tests run: 836 passed, 2 failed, 4 skipped", then one
# line per failed test ("FAIL [ 1.2s] BINARY-ID TEST"); the doc tests: one "test result:" line per
# crate ("test result: ok. 12 passed; 0 failed; 1 ignored; ...") and "... FAILED" per failed test.
touch "$logs/tests" "$logs/doc"
awk '
  FNR == 1 { doc = FILENAME ~ /doc$/ }
  !doc && /^ *Summary \[/ {
    for (i = 1; i <= NF; i++) { w = $(i + 1); sub(/,$/, "", w)
      if (w == "passed") p += $i; else if (w == "failed" || w == "timed") f += $i; else if (w == "skipped") g += $i }
  }
  doc && /^test result:/ {
    for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i; if ($(i+1) ~ /^ignored;/) g += $i }
  }
  END { printf "\ntotal: %d passed, %d failed\n(%d skipped or ignored; nextest over every test binary, and the doc tests)\n", p, f, g }
' "$logs/tests" "$logs/doc"
{
  # nextest repeats every test that did not pass after its summary line (grep finding nothing is fine).
  sed -n '/^ *Summary \[/,$p' "$logs/tests" | grep -E '^ +(FAIL|SIG[A-Z]+|TIMEOUT|ABORT) ' | sed -E 's/^ +[A-Z]+ +\[[^]]*\] +(\([0-9]+\/[0-9]+\) +)?//' || true
  grep ' \.\.\. FAILED$' "$logs/doc" | sed 's/^test /doc test /; s/ \.\.\. FAILED$//' || true
} | sort -u >"$logs/failing"
if [ -s "$logs/failing" ]; then
  echo "failing tests:"
  sed 's/^/  /' "$logs/failing"
fi
exit "$status"
