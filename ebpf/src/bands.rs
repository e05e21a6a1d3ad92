//! The band check the memory and PID hooks share: a value outside its
//! scope's band is reported on the ring buffer once.

use aya_ebpf::helpers::generated::bpf_ktime_get_ns;
use evictd_common::{Band, COUNTER_RINGBUF_DROPS, CrossingEvent, EVENT_CROSSING};

use crate::maps::{EVENTS, bump};

/// Compares `value` with the scope's band; outside it, reports once and
/// disarms the band until the agent arms it around the new level.
#[inline(always)]
pub(crate) fn update_scope(
    scope: *mut Band,
    resource: u32,
    scope_id: u64,
    trigger_cgroup_id: u64,
    value: u64,
) {
    // SAFETY: a live map value. Two CPUs may both see the value leave the
    // band and both report; the agent handles a repeat as a no-op.
    let band = unsafe { &mut *scope };
    band.last_value = value;
    if band.contains(value) {
        return;
    }
    let rising = value >= band.rise_at;
    let bound = if rising {
        band.rise_at
    } else {
        band.fall_below
    };
    *band = Band {
        last_value: value,
        ..Band::DISARMED
    };
    let event = CrossingEvent {
        kind: EVENT_CROSSING,
        resource,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        scope_id,
        trigger_cgroup_id,
        value,
        bound,
        rising: u32::from(rising),
        _pad: 0,
    };
    if EVENTS.output::<CrossingEvent>(&event, 0).is_err() {
        bump(COUNTER_RINGBUF_DROPS);
    }
}
