#!/bin/sh
# How often kmem:rss_stat and kmem:mm_page_alloc fire for one cgroup v2 pod
# growing by 64 MiB of anonymous memory, then by 64 MiB written to tmpfs
# (and for the same dd writing nothing: what its own start costs).
# Root, cgroup v2, bpftrace; run in the guest with
#   cargo xtask vm -- "$PWD/tests/scripts/rss-stat-vs-page-alloc.sh" "$PWD/target/release/evictd-workload"
set -eu
workload=$1
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
pod=/sys/fs/cgroup/evictd-rss-stat-$$
scratch=$(mktemp -d)
mkdir "$pod"
tracer=
trap 'status=$?; [ -z "$tracer" ] || kill "$tracer" 2>/dev/null; rm -rf "$scratch"; rmdir "$pod"; exit $status' EXIT
id=$(stat -c %i "$pod")
count() { # $1: what; then the command to run in the pod
    what=$1; shift
    bpftrace -e "
        tracepoint:kmem:rss_stat /cgroup == $id/ { @rss_stat = count(); }
        tracepoint:kmem:mm_page_alloc /cgroup == $id/ { @mm_page_alloc = count(); }
        interval:s:1 { if (@started == 0) { @started = 1; printf(\"attached\\n\"); } }
    " > "$scratch/out" 2>&1 &
    tracer=$!
    until grep -q attached "$scratch/out"; do sleep 0.2; done
    sh -c "echo \$\$ > $pod/cgroup.procs && exec \"\$@\"" sh "$@"
    kill -INT "$tracer"; wait "$tracer" || true
    tracer=
    echo "$what: $(grep -E '^@(rss_stat|mm_page_alloc)' "$scratch/out" | tr '\n' ' ')"
}
count "64 MiB anonymous" sh -c "echo alloc 67108864 | $workload > /dev/null"
count "64 MiB to tmpfs" dd if=/dev/zero of="$scratch/fill" bs=1M count=64 status=none
count "0 MiB to tmpfs" dd if=/dev/zero of="$scratch/none" bs=1M count=0 status=none
