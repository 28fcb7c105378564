//! Any control line given to the FTP helper of `protocol = "ftp"` is classified without a panic,
//! and what it reads as an address survives the helper's own rewrite: a passive answer or an
//! active command it writes for that address reads back as the same address.
#![no_main]

use fulcrum_proxy::ftp::{
    active_command, classify_command, classify_reply, passive_reply, ControlLine,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let ControlLine::Passive(at) = classify_reply(data) {
        let rewritten = passive_reply(at).expect("227 carries IPv4 only");
        assert_eq!(
            classify_reply(rewritten.as_bytes()),
            ControlLine::Passive(at)
        );
    }
    if let ControlLine::Active(at) = classify_command(data) {
        assert_eq!(
            classify_command(active_command(at).as_bytes()),
            ControlLine::Active(at)
        );
    }
});
