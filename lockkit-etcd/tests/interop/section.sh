#!/bin/sh
# One critical section of the protocol in lockkit-core/src/testing/sections.rs, run while holding the lock by
#   etcdctl lock PREFIX -- sh section.sh DIR TAG HOLD_SECONDS     (tests/interop_etcdctl.rs)
#   lockkit run KEY -- sh section.sh DIR TAG HOLD_SECONDS         (the facade's tests/interop.rs)
# The fencing token: LOCKKIT_FENCING_TOKEN under `lockkit run`; under `etcdctl lock`, the create
# revision of ETCD_LOCK_KEY (the key etcdctl holds), as lockkit's token on etcd is. ETCDCTL_ENDPOINTS
# (and ETCDCTL_USER) come from the test.
set -eu
dir=$1 tag=$2 hold=$3
if [ -n "${LOCKKIT_FENCING_TOKEN:-}" ]; then
  token=$LOCKKIT_FENCING_TOKEN
else
  token=$(etcdctl get "$ETCD_LOCK_KEY" -w fields | sed -n 's/^"CreateRevision" : //p')
fi
[ -n "$token" ] || { echo "section.sh: no fencing token" >&2; exit 1; }
# noclobber: the redirection fails when the marker exists, i.e. another section is running.
if ! (set -C; : >"$dir/marker") 2>/dev/null; then echo "$tag" >>"$dir/overlaps"; fi
seen=$(cat "$dir/counter")
# Torn by a write of an overlapping section.
case $seen in '' | *[!0-9]*) echo "$tag" >>"$dir/overlaps"; seen=0 ;; esac
sleep "$hold"
echo $((seen + 1)) >"$dir/counter"
echo "$tag $token" >>"$dir/history"
rm "$dir/marker" 2>/dev/null || echo "$tag" >>"$dir/overlaps"
