#!/usr/bin/env bash
# compose/exclusive-env.sh: the nextest setup script of .config/nextest.toml. Hands the tests that
# kill, pause or reconfigure servers the endpoints of the second server set (compose/test.sh
# starts it in $LOCKKIT_COMPOSE_DIR/exclusive, ports +500), so that no other test sees their
# faults: the URLs, and LOCKKIT_COMPOSE_DIR / LOCKKIT_COMPOSE_PORT_OFFSET for compose/member.sh.
# Without that set (a plain `cargo nextest run`) it hands nothing: they use the shared servers.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
: "${NEXTEST_ENV:?run by cargo-nextest as a setup script}"
[ -s "$LK_EXCLUSIVE_DIR/endpoints.env" ] || exit 0
{
  echo "LOCKKIT_COMPOSE_DIR=$LK_EXCLUSIVE_DIR"
  echo "LOCKKIT_COMPOSE_PORT_OFFSET=$LK_EXCLUSIVE_OFFSET"
  grep '^LOCKKIT_TEST_' "$LK_EXCLUSIVE_DIR/endpoints.env"
} >>"$NEXTEST_ENV"
