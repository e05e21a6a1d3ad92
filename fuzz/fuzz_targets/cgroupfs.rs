//! See `evictd_fuzz::cgroupfs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evictd_fuzz::cgroupfs(data));
