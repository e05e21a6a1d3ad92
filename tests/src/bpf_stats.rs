//! The kernel's per-program run statistics, on for as long as a
//! measurement needs them.
use std::{fs, io};

const STATS_SWITCH: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns `kernel.bpf_stats_enabled` on (it costs a clock read per program
/// run, so it is off by default), and back to what it was on drop.
pub struct BpfStatsEnabled(String);

impl BpfStatsEnabled {
    pub fn new() -> io::Result<Self> {
        let before = fs::read_to_string(STATS_SWITCH)?;
        fs::write(STATS_SWITCH, "1")?;
        Ok(Self(before.trim().to_owned()))
    }
}

impl Drop for BpfStatsEnabled {
    fn drop(&mut self) {
        let _ = fs::write(STATS_SWITCH, &self.0);
    }
}
