//! See `evictd_fuzz::kubelet_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|text: &str| evictd_fuzz::kubelet_config(text));
