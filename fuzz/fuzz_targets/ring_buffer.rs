//! See `evictd_fuzz::ring_buffer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evictd_fuzz::ring_buffer(data));
