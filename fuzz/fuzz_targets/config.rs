//! Any text given as a configuration file is answered with a config or located errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = fulcrum_config::parse(text, "fuzz.toml", std::path::Path::new("."));
    }
});
