#!/bin/sh
# Where a memory bomb sleeps uninterruptibly while the bench runs, and who
# wakes it: a task in the kernel cannot freeze until it wakes, so these
# sleeps are what can hold the agent's freeze (and any reaper) back.
# ftrace records every context switch and wake-up, and a kernel stack at
# each switch of the bomb into uninterruptible sleep (the freezer's own
# refrigerator shows as one too); the trace, bench.json and a summary go to
# OUT. Root; run from the repository after `cargo xtask build --release`:
#   tests/scripts/freeze-trace.sh OUT --runs 100 --modes event --rates max \
#     --pid-limit 0 --pod-counts 0 --overhead-bytes 0 --idle 1s
set -eu
out=$1; shift
tracing=/sys/kernel/tracing
mountpoint -q $tracing || mount -t tracefs tracefs $tracing
mkdir -p "$out"
events="sched/sched_switch sched/sched_waking sched/sched_wakeup"
restore() {
    echo 0 > $tracing/tracing_on
    echo '!stacktrace' > $tracing/events/sched/sched_switch/trigger
    for event in $events; do
        echo 0 > $tracing/events/$event/enable
        echo 0 > $tracing/events/$event/filter
    done
    echo > $tracing/trace
    echo 1408 > $tracing/buffer_size_kb
    echo local > $tracing/trace_clock
    echo 1 > $tracing/tracing_on
}
trap 'status=$?; restore; exit $status' EXIT
echo 0 > $tracing/tracing_on
echo > $tracing/trace
# The clock of the agent's and the bench's times, so that runs line up.
echo mono > $tracing/trace_clock
echo 1200000 > $tracing/buffer_size_kb
for event in $events; do echo 1 > $tracing/events/$event/enable; done
# The bench's own threads wake tens of thousands of times a run.
echo 'prev_comm != "evictd-bench" && next_comm != "evictd-bench"' \
    > $tracing/events/sched/sched_switch/filter
for event in sched_waking sched_wakeup; do
    echo 'comm != "evictd-bench"' > $tracing/events/sched/$event/filter
done
echo 'stacktrace if prev_state & 2 && prev_comm == "evictd-workload"' \
    > $tracing/events/sched/sched_switch/trigger
echo 1 > $tracing/tracing_on
target/release/evictd-bench --evictd target/release/evictd \
    --workload target/release/evictd-workload --out "$out" "$@"
echo 0 > $tracing/tracing_on
grep -m1 entries-in-buffer $tracing/trace
cat $tracing/trace > "$out/trace.txt"
# Each sleep: the first kernel function of its stack past the scheduler's
# and the locks' own, how long until its wake-up, and the waker.
awk '
    function site(frame) {
        return frame !~ /^(trace_event_raw_event_sched_switch|__traceiter_sched_switch|__schedule|schedule|schedule_preempt_disabled|io_schedule|rwsem_down_(read|write)_slowpath|down_(read|write)(_killable)?|folio_wait_bit_common|__folio_lock)$/
    }
    function at() { match($0, /[0-9]+\.[0-9]+: /); return substr($0, RSTART, RLENGTH - 2) }
    function pid_of(field) { match($0, field "=[0-9]+"); return substr($0, RSTART + length(field) + 1, RLENGTH - length(field) - 1) }
    / sched_switch: .*prev_comm=evictd-workload .*prev_state=D/ {
        pid = pid_of("prev_pid"); asleep[pid] = at(); where[pid] = ""; next
    }
    # The stack is taken in the sleeper itself, its frames on the lines after.
    /<stack trace>/ {
        stack = $1; sub(/.*-/, "", stack); if (!(stack in asleep) || where[stack] != "") stack = ""; next
    }
    /^ => / { if (stack != "" && where[stack] == "" && site($2)) where[stack] = $2; next }
    { stack = "" }
    # The waker is the task the wake-up runs in; its end is the wakeup
    # event, which comes after the switch even when the waking races it.
    / sched_waking: comm=evictd-workload / { waker = $1; sub(/-[0-9]+$/, "", waker); woken_by[pid_of(" pid")] = waker; next }
    / sched_wakeup: comm=evictd-workload / {
        pid = pid_of(" pid")
        if (!(pid in asleep)) next
        printf "%.3f ms %s woken by %s at %s\n", (at() - asleep[pid]) * 1000,
            where[pid] == "" ? "?" : where[pid], woken_by[pid], asleep[pid]
        delete asleep[pid]
    }
' "$out/trace.txt" | sort -rn > "$out/sleeps.txt"
echo "uninterruptible sleeps of the bombs (count, site), then the 10 longest:"
awk '{ print $3 }' "$out/sleeps.txt" | sort | uniq -c | sort -rn
head -10 "$out/sleeps.txt"
