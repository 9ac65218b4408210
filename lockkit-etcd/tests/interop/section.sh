#!/bin/sh
# One critical section of the protocol in tests/support/sections.rs, run by tests/interop_etcdctl.rs as
#   etcdctl lock PREFIX -- sh section.sh DIR TAG HOLD_SECONDS
# etcdctl runs it holding the lock and exports ETCD_LOCK_KEY (the key it holds); the fencing token is
# that key's create revision, as lockkit's. ETCDCTL_ENDPOINTS (and ETCDCTL_USER) come from the test.
set -eu
dir=$1 tag=$2 hold=$3
token=$(etcdctl get "$ETCD_LOCK_KEY" -w fields | sed -n 's/^"CreateRevision" : //p')
[ -n "$token" ] || { echo "section.sh: no create revision for $ETCD_LOCK_KEY" >&2; exit 1; }
# noclobber: the redirection fails when the marker exists, i.e. another section is running.
if ! (set -C; : >"$dir/marker") 2>/dev/null; then echo "$tag" >>"$dir/overlaps"; fi
seen=$(cat "$dir/counter")
# Torn by a write of an overlapping section.
case $seen in '' | *[!0-9]*) echo "$tag" >>"$dir/overlaps"; seen=0 ;; esac
sleep "$hold"
echo $((seen + 1)) >"$dir/counter"
echo "$tag $token" >>"$dir/history"
rm "$dir/marker" 2>/dev/null || echo "$tag" >>"$dir/overlaps"
