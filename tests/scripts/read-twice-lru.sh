#!/bin/sh
# Which LRU list a file read through a descriptor ends on: 64 MiB read
# three times by a shell in a cgroup v2 group of its own, then that
# group's active and inactive file pages. The multi-generational LRU
# (lru_gen/enabled bit 0x1) keeps them inactive. $1: a directory on a
# disk filesystem (not tmpfs), e.g. target/tmp.
set -eu
dir=${1:?usage: read-twice-lru.sh DIR}
echo "lru_gen/enabled: $(cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null || echo absent)"
group=/sys/fs/cgroup/read-twice-lru-$$
file=$dir/read-twice-lru-$$
mkdir "$group"
trap 'rm -f "$file"; rmdir "$group"' EXIT
dd if=/dev/zero of="$file" bs=1M count=64 2>/dev/null
sync
echo 1 > /proc/sys/vm/drop_caches
sh -c "echo \$\$ > $group/cgroup.procs; for i in 1 2 3; do cat $file > /dev/null; done"
grep -E '^(file|active_file|inactive_file) ' "$group/memory.stat"
