//! See `evictd_fuzz::pod`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evictd_fuzz::pod(data));
