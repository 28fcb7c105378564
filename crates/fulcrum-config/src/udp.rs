//! The section of a `protocol = "udp"` virtual service: session or per-packet scheduling, the
//! flow table's bounds, and how packets reach the members.

use std::time::Duration;

use crate::forwarding::ForwardingOptions;
use crate::protocol::Protocol;
use crate::reader::{Cx, TableReader};
use crate::rule::{read_l4_rules, Rule};
use crate::string_enum;

string_enum!(UdpMode {
    Session = "session",
    PerPacket = "per_packet",
});

/// Default bound on a udp service's flow table. Each flow holds one upstream socket (a file
/// descriptor), so the process's descriptor limit must allow this many.
pub const DEFAULT_MAX_SESSIONS: u64 = 65536;

#[derive(Debug, Clone)]
pub struct UdpSection {
    pub mode: UdpMode,
    /// A flow with no datagram for this long is forgotten.
    pub session_timeout: Duration,
    /// Bound on the flow table (client address → upstream socket); idle flows go first.
    pub max_sessions: u64,
    pub forwarding: ForwardingOptions,
    /// Rules choosing the pool of a new flow (first match wins; none: the service's pool).
    pub rules: Vec<Rule>,
}

/// The keys `UdpSection` reads besides the forwarding keys.
pub const UDP_KEYS: &[&str] = &["udp_mode", "session_timeout", "max_sessions"];

impl UdpSection {
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> UdpSection {
        let s = UdpSection {
            mode: t.opt(cx, "udp_mode").unwrap_or(UdpMode::Session),
            session_timeout: t
                .opt(cx, "session_timeout")
                .unwrap_or(Duration::from_secs(30)),
            max_sessions: t.opt(cx, "max_sessions").unwrap_or(DEFAULT_MAX_SESSIONS),
            forwarding: ForwardingOptions::read(t, cx),
            rules: Vec::new(),
        };
        let s = UdpSection {
            rules: read_l4_rules(t, cx, Protocol::Udp, &s.forwarding),
            ..s
        };
        let at = t.path().to_string();
        if s.max_sessions == 0 {
            cx.error_path(&format!("{at}.max_sessions"), "must be at least 1");
        }
        if s.session_timeout.is_zero() {
            cx.error_path(&format!("{at}.session_timeout"), "must be longer than 0s");
        }
        s
    }
}
