//! `allow` / `deny` on every virtual service: source prefixes checked
//! first, at accept (stream protocols) or datagram receive (udp); `deny` wins.
//!
//! Lives apart from `schema.rs` so the contract's tables stay readable. The matcher is here
//! too, beside the lists it is compiled from, so every data plane shares one.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::reader::{Cx, TableReader};
use crate::types::OneOrMany;

/// A virtual service's source access list.
#[derive(Clone, Default)]
pub struct AccessList {
    /// When not empty, only these sources are served.
    pub allow: Vec<IpNet>,
    /// Never these sources (wins over `allow`).
    pub deny: Vec<IpNet>,
    allow_set: PrefixSet,
    deny_set: PrefixSet,
}

/// The lists as configured: the hash sets print in no stable order, and a service's `Debug` text
/// tells a reload whether the service changed.
impl std::fmt::Debug for AccessList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessList")
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .finish()
    }
}

impl AccessList {
    pub fn new(allow: Vec<IpNet>, deny: Vec<IpNet>) -> AccessList {
        AccessList {
            allow_set: PrefixSet::new(&allow),
            deny_set: PrefixSet::new(&deny),
            allow,
            deny,
        }
    }

    /// Reads `allow` and `deny` from a virtual service's table.
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> AccessList {
        let allow = t.opt::<OneOrMany<IpNet>>(cx, "allow").map(|v| v.0);
        let deny = t.opt::<OneOrMany<IpNet>>(cx, "deny").map(|v| v.0);
        AccessList::new(allow.unwrap_or_default(), deny.unwrap_or_default())
    }

    /// No lists: every source is served (and nothing needs checking).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether a client at `ip` may be served. IPv4-mapped IPv6 addresses are matched as the
    /// IPv4 address they carry.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if self.deny_set.contains(ip) {
            return false;
        }
        self.allow.is_empty() || self.allow_set.contains(ip)
    }
}

/// Prefixes as one hash set per prefix length: a lookup costs one masked probe per distinct
/// length in the list (at most 33 for IPv4, 129 for IPv6), whatever the number of prefixes.
#[derive(Debug, Clone, Default)]
struct PrefixSet {
    v4_lengths: Vec<u8>,
    v6_lengths: Vec<u8>,
    v4: HashSet<(u8, u32)>,
    v6: HashSet<(u8, u128)>,
}

fn mask_hi32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

fn mask_hi128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

impl PrefixSet {
    fn new(nets: &[IpNet]) -> PrefixSet {
        let mut s = PrefixSet::default();
        for net in nets {
            match net {
                IpNet::V4(n) => {
                    let len = n.prefix_len();
                    s.v4.insert((len, u32::from(n.network()) & mask_hi32(len)));
                    if !s.v4_lengths.contains(&len) {
                        s.v4_lengths.push(len);
                    }
                }
                IpNet::V6(n) => {
                    let len = n.prefix_len();
                    s.v6.insert((len, u128::from(n.network()) & mask_hi128(len)));
                    if !s.v6_lengths.contains(&len) {
                        s.v6_lengths.push(len);
                    }
                }
            }
        }
        s
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => {
                let bits = u32::from(a);
                self.v4_lengths
                    .iter()
                    .any(|&len| self.v4.contains(&(len, bits & mask_hi32(len))))
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                self.v6_lengths
                    .iter()
                    .any(|&len| self.v6.contains(&(len, bits & mask_hi128(len))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(allow: &[&str], deny: &[&str]) -> AccessList {
        let p = |v: &[&str]| v.iter().map(|s| s.parse().unwrap()).collect();
        AccessList::new(p(allow), p(deny))
    }

    #[test]
    fn deny_wins_and_allow_restricts() {
        let a = list(&["127.0.0.0/24", "2001:db8::/32"], &["127.0.0.7/32"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(a.permits(ip("127.0.0.1")));
        assert!(a.permits(ip("127.0.0.255")));
        assert!(!a.permits(ip("127.0.0.7")));
        assert!(!a.permits(ip("127.0.1.1")));
        assert!(a.permits(ip("2001:db8:1::1")));
        assert!(!a.permits(ip("2001:db9::1")));
        // An IPv4 client on a dual-stack socket.
        assert!(!a.permits(ip("::ffff:127.0.0.7")));
        assert!(a.permits(ip("::ffff:127.0.0.8")));

        let only_deny = list(&[], &["0.0.0.0/0"]);
        assert!(!only_deny.permits(ip("198.51.100.1")));
        assert!(only_deny.permits(ip("::1")));
        assert!(list(&[], &[]).permits(ip("192.0.2.1")) && list(&[], &[]).is_empty());
        let all6 = list(&["::/0"], &[]);
        assert!(all6.permits(ip("2001:db8::1")) && !all6.permits(ip("192.0.2.1")));
    }
}
