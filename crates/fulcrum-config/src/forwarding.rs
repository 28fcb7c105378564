//! How packets of a tcp / udp virtual service reach its members:
//! `forwarding` and `interfaces`. `proxy` (the default) is the full proxy; `nat`, `dr` and
//! `tunnel` hand the service's packets to the in-kernel XDP forwarder (crate fulcrum-xdp).

use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::string_enum;
use crate::types::read_table;

string_enum!(Forwarding {
    Proxy = "proxy",
    Nat = "nat",
    Dr = "dr",
    Tunnel = "tunnel",
});

string_enum!(XdpMode {
    Auto = "auto",
    Native = "native",
    Generic = "generic",
});

impl Forwarding {
    /// Whether the service's packets are forwarded in the kernel (XDP) rather than proxied.
    pub fn in_kernel(self) -> bool {
        !matches!(self, Forwarding::Proxy)
    }
}

/// The forwarding keys of a `[[virtual_service]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardingOptions {
    pub forwarding: Forwarding,
    /// Where the XDP program attaches (nat: the client and the member sides).
    pub interfaces: Vec<String>,
    /// How XDP attaches (Fulcrum addition): auto (the kernel picks; native where the driver
    /// supports it), native (driver mode, fail otherwise), generic (after the stack's skb
    /// allocation: slower, works on every device).
    pub xdp_mode: XdpMode,
    /// Per-VIP limits on new and concurrent flows, enforced in the XDP program.
    pub flow_limits: Option<FlowLimits>,
}

/// `flow_limits = { new_per_second, burst, max }` of a nat / dr / tunnel service: per VIP (the
/// service's listen addresses together), in the kernel, so that a flood to one VIP cannot fill
/// the connection tables every VIP shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimits {
    /// New flows per second (a token bucket); None: no rate limit.
    pub new_per_second: Option<u64>,
    /// New flows the bucket holds; defaults to `new_per_second`.
    pub burst: Option<u64>,
    /// Concurrent flows; None: no cap.
    pub max: Option<u64>,
}

/// Entries the kernel's access-list trie gives the nat / dr / tunnel services together: half
/// of fulcrum-xdp's default trie, the other half is for a reload writing a new list beside the
/// old one.
pub const XDP_ACL_ENTRIES_MAX: usize = 131_072;

/// The most `new_per_second` and `burst` take (the program's bucket arithmetic stays exact).
pub const FLOW_RATE_MAX: u64 = 100_000_000;

impl FromNode for FlowLimits {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let l = FlowLimits {
                new_per_second: t.opt(cx, "new_per_second"),
                burst: t.opt(cx, "burst"),
                max: t.opt(cx, "max"),
            };
            let at = t.path().to_string();
            let mut bad = |key: &str, msg: String| {
                cx.error_at(node.span.clone(), &format!("{at}.{key}"), msg);
            };
            for (key, v) in [("new_per_second", l.new_per_second), ("burst", l.burst)] {
                if let Some(v) = v {
                    if v == 0 || v > FLOW_RATE_MAX {
                        bad(key, format!("{v}: expected 1 to {FLOW_RATE_MAX} flows"));
                    }
                }
            }
            if l.max == Some(0) {
                bad(
                    "max",
                    "0: expected at least 1 flow (leave `max` out for no cap)".into(),
                );
            }
            if l.burst.is_some() && l.new_per_second.is_none() {
                bad(
                    "burst",
                    "`burst` is the bucket of `new_per_second`, which is not set".into(),
                );
            }
            if l.new_per_second.is_none() && l.max.is_none() {
                bad(
                    "new_per_second",
                    "flow_limits needs `new_per_second` and/or `max`".into(),
                );
            }
            Some(l)
        })
    }
}

impl Default for ForwardingOptions {
    fn default() -> Self {
        ForwardingOptions {
            forwarding: Forwarding::Proxy,
            interfaces: Vec::new(),
            xdp_mode: XdpMode::Auto,
            flow_limits: None,
        }
    }
}

/// Keys read here (tcp and udp services take them).
pub const FORWARDING_KEYS: &[&str] = &["forwarding", "interfaces", "xdp_mode", "flow_limits"];

impl ForwardingOptions {
    /// Reads and checks the forwarding keys of a tcp or udp service's table.
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> ForwardingOptions {
        let f = ForwardingOptions {
            forwarding: t.opt(cx, "forwarding").unwrap_or(Forwarding::Proxy),
            interfaces: t.opt(cx, "interfaces").unwrap_or_default(),
            xdp_mode: t.opt(cx, "xdp_mode").unwrap_or(XdpMode::Auto),
            flow_limits: t.opt(cx, "flow_limits"),
        };
        let at = t.path().to_string();
        if !f.forwarding.in_kernel() && t.has("flow_limits") {
            cx.error_path(
                &format!("{at}.flow_limits"),
                "`flow_limits` applies to forwarding = \"nat\" / \"dr\" / \"tunnel\" (limits in the kernel); a proxied service is bounded by `max_connections` (tcp) or `max_sessions` (udp)",
            );
        }
        if f.forwarding.in_kernel() && f.interfaces.is_empty() {
            cx.error_path(
                &format!("{at}.forwarding"),
                format!(
                    "forwarding = \"{}\" needs `interfaces` (where the XDP program attaches, e.g. [\"eth0\"])",
                    f.forwarding
                ),
            );
        }
        if !f.forwarding.in_kernel() && t.has("interfaces") {
            cx.error_path(
                &format!("{at}.interfaces"),
                "`interfaces` applies to forwarding = \"nat\" / \"dr\" / \"tunnel\"; this service proxies",
            );
        }
        for (i, name) in f.interfaces.iter().enumerate() {
            // IFNAMSIZ is 16 including the terminating NUL.
            if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\0']) {
                cx.error_path(
                    &format!("{at}.interfaces[{i}]"),
                    format!(
                        "{name:?} is not an interface name (1 to 15 characters, no '/' or spaces)"
                    ),
                );
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::{parse, Forwarding};

    fn service(extra: &str, protocol: &str) -> String {
        format!(
            r#"
[[virtual_service]]
name = "web"
listen = "198.18.0.10:80"
protocol = "{protocol}"
pool = "web"
{extra}

[[pool]]
name = "web"
algorithm = "hash"

[[pool.member]]
address = "198.18.1.1:80"
"#
        )
    }

    fn errors(text: &str) -> Vec<String> {
        match parse(text, "f.toml", Path::new("/etc/fulcrum")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.messages(),
        }
    }

    fn has(errors: &[String], needle: &str) {
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "no error contains {needle:?}: {errors:#?}"
        );
    }

    #[test]
    fn proxy_is_the_default_and_modes_parse() {
        let c = parse(&service("", "tcp"), "f.toml", Path::new("/")).expect("valid");
        assert_eq!(
            c.virtual_services[0].forwarding().forwarding,
            Forwarding::Proxy
        );
        for (mode, want) in [
            ("nat", Forwarding::Nat),
            ("dr", Forwarding::Dr),
            ("tunnel", Forwarding::Tunnel),
        ] {
            for proto in ["tcp", "udp"] {
                let text = service(
                    &format!("forwarding = \"{mode}\"\ninterfaces = [\"eth0\", \"eth1\"]"),
                    proto,
                );
                let c = parse(&text, "f.toml", Path::new("/")).expect("valid");
                let f = c.virtual_services[0].forwarding();
                assert_eq!(f.forwarding, want);
                assert_eq!(f.interfaces, ["eth0", "eth1"]);
            }
        }
    }

    #[test]
    fn flow_limits_parse() {
        let text = service(
            "forwarding = \"dr\"\ninterfaces = [\"eth0\"]\nflow_limits = { new_per_second = 10000, burst = 20000, max = 100000 }",
            "tcp",
        );
        let c = parse(&text, "f.toml", Path::new("/")).expect("valid");
        assert_eq!(
            c.virtual_services[0].forwarding().flow_limits,
            Some(crate::FlowLimits {
                new_per_second: Some(10000),
                burst: Some(20000),
                max: Some(100000),
            })
        );
    }

    #[test]
    fn access_lists_of_in_kernel_services_must_fit_the_kernel_trie() {
        // 65,537 IPv4 prefixes: 131,074 entries with their IPv4-mapped copies.
        let deny: Vec<String> = (0..65_537u32)
            .map(|i| format!("\"{}/32\"", std::net::Ipv4Addr::from(0x0a00_0000 | i)))
            .collect();
        let lists = format!("deny = [{}]", deny.join(", "));
        let e = errors(&service(
            &format!("forwarding = \"dr\"\ninterfaces = [\"eth0\"]\n{lists}"),
            "tcp",
        ));
        has(&e, "virtual_service[0].deny");
        has(&e, "more than the 131072");
        // The same lists on a proxied service are no kernel's business.
        parse(&service(&lists, "tcp"), "f.toml", Path::new("/")).expect("valid");
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let e = errors(&service(
            "forwarding = \"dsr\"\ninterfaces = [\"eth0\"]",
            "tcp",
        ));
        has(&e, "f.toml:7");
        has(&e, "forwarding");
        has(&e, "tunnel");
        let e = errors(&service("forwarding = \"dr\"", "tcp"));
        has(&e, "needs `interfaces`");
        has(&e, "f.toml:7");
        let e = errors(&service("interfaces = [\"eth0\"]", "tcp"));
        has(&e, "virtual_service[0].interfaces");
        let e = errors(&service(
            "forwarding = \"nat\"\ninterfaces = [\"eth0\"]",
            "http",
        ));
        has(&e, "applies to protocol tcp / udp");
        let e = errors(&service(
            "forwarding = \"nat\"\ninterfaces = [\"a/b\"]",
            "udp",
        ));
        has(&e, "interfaces[0]");
        let e = errors(&service("flow_limits = { new_per_second = 10 }", "tcp"));
        has(&e, "applies to forwarding = \"nat\"");
        let kernel = "forwarding = \"nat\"\ninterfaces = [\"eth0\"]\n";
        let e = errors(&service(
            &format!("{kernel}flow_limits = {{ burst = 10 }}"),
            "tcp",
        ));
        has(&e, "`burst` is the bucket of `new_per_second`");
        has(&e, "needs `new_per_second` and/or `max`");
        let e = errors(&service(
            &format!("{kernel}flow_limits = {{ new_per_second = 0, max = 0 }}"),
            "udp",
        ));
        has(&e, "flow_limits.new_per_second");
        has(&e, "flow_limits.max");
        let e = errors(&service(
            &format!("{kernel}flow_limits = {{ new_per_sec = 5 }}"),
            "tcp",
        ));
        has(&e, "did you mean `new_per_second`");
        let e = errors(&service("forwardng = \"nat\"", "tcp"));
        has(&e, "did you mean `forwarding`");
    }
}
