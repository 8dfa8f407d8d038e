//! libFuzzer target: `weir_nbd::fuzz::server` (see its documentation for the script format).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_nbd::fuzz::server(data));
