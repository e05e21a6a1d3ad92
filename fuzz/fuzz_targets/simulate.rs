//! See `evictd_fuzz::simulate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::simulate(text));
