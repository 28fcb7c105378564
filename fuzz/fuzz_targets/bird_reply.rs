//! Whatever BIRD's control socket sends (a local daemon, but of another version, or a socket
//! that is not BIRD's at all) is refused or grouped into replies without a panic, and the
//! session list read from a reply never has more entries than the reply has lines.
#![no_main]

use fulcrum_ha::bgp::{sessions, ReplyReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut reader = ReplyReader::default();
    for line in text.split('\n') {
        match reader.push(line) {
            Ok(Some(reply)) => assert!(sessions(&reply).len() <= reply.lines.len()),
            Ok(None) => {}
            Err(_) => reader = ReplyReader::default(),
        }
    }
});
