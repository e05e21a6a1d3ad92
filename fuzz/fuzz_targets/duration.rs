//! See `evictd_fuzz::duration`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::duration(text));
