//! See `evictd_fuzz::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::quantity(text));
