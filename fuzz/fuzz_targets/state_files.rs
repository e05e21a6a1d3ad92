//! See `evictd_fuzz::state_files`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evictd_fuzz::state_files(data));
