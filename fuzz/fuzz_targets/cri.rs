//! See `evictd_fuzz::cri`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evictd_fuzz::cri(data));
