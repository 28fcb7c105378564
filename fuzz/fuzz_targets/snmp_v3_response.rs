//! Whatever arrives on an SNMPv3 monitor's socket (discovery reports, authenticated and
//! encrypted responses, garbage) is parsed without a panic, with and without keys.
#![no_main]

use std::sync::OnceLock;

use fulcrum_config::{SnmpAuth, SnmpPriv, SnmpV3};
use fulcrum_health::{LocalKeys, UsmUser};
use libfuzzer_sys::fuzz_target;

/// Key derivation hashes a megabyte: once per process, not per input.
fn keys() -> &'static [LocalKeys; 2] {
    static KEYS: OnceLock<[LocalKeys; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let user = |auth, privacy: bool| {
            UsmUser::new(&SnmpV3 {
                user: "fuzz".into(),
                auth,
                auth_password: "fuzz-password".into(),
                privacy: privacy.then(|| (SnmpPriv::Aes128, "fuzz-password".to_string())),
            })
        };
        [
            user(SnmpAuth::Sha1, false).localize(b"engine"),
            user(SnmpAuth::Sha256, true).localize(b"engine"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let id = data.first().map_or(0, |&b| i32::from(b));
    let _ = fulcrum_health::parse_v3_response(data, id, id, None);
    for k in keys() {
        let _ = fulcrum_health::parse_v3_response(data, id, id, Some(k));
    }
});
