//! See `evictd_fuzz::watch`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::watch(text));
