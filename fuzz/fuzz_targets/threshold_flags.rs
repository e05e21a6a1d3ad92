//! See `evictd_fuzz::threshold_flags`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::threshold_flags(text));
