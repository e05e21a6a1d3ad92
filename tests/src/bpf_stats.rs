//! The kernel's per-program run statistics, on for as long as a
//! measurement needs them, and off where what is measured is what a
//! workload pays on a node (where they are off by default).
use std::{fs, io};

const STATS_SWITCH: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Sets `kernel.bpf_stats_enabled` (on, it costs two clock reads per
/// program run), and back to what it was on drop.
pub struct BpfStats(String);

impl BpfStats {
    pub fn on() -> io::Result<Self> {
        Self::set("1")
    }

    pub fn off() -> io::Result<Self> {
        Self::set("0")
    }

    fn set(value: &str) -> io::Result<Self> {
        let before = fs::read_to_string(STATS_SWITCH)?;
        fs::write(STATS_SWITCH, value)?;
        Ok(Self(before.trim().to_owned()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(STATS_SWITCH, &self.0);
    }
}
