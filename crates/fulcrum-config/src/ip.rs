//! `protocol = "ip"` and wildcard listen addresses of the in-kernel services (DESIGN §4 Phase 3).
//!
//! An ip service takes every IP protocol to its addresses (ESP, GRE, SCTP, ICMP echo, TCP and
//! UDP to any port): its `listen` entries are addresses without a port, and it exists only in
//! the kernel (`forwarding = "nat" | "dr" | "tunnel"`). A tcp or udp service with one of those
//! forwardings may listen on port 0: every port of its protocol to the address.
//!
//! Which service a packet belongs to, when several claim its address: the exact port first,
//! then the protocol's port-0 service, then the address's ip service (the XDP program looks them
//! up in that order). A proxied listener on an address a wildcard takes would never see a
//! packet: refused (`check_shadowed_listeners`).

use std::net::{IpAddr, SocketAddr};

use crate::forwarding::ForwardingOptions;
use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};

/// The section of a `protocol = "ip"` service: only how packets reach the members.
#[derive(Debug, Clone)]
pub struct IpSection {
    pub forwarding: ForwardingOptions,
}

impl IpSection {
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> IpSection {
        let forwarding = ForwardingOptions::read(t, cx);
        if !forwarding.forwarding.in_kernel() {
            cx.error_path(
                &format!("{}.forwarding", t.path()),
                "protocol = \"ip\" forwards every IP protocol in the kernel: it needs forwarding = \"nat\", \"dr\" or \"tunnel\" (a proxy speaks tcp or udp)",
            );
        }
        IpSection { forwarding }
    }
}

/// One `listen` entry as written: `ip:port`, or an address alone (protocol = "ip").
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListenEntry {
    addr: SocketAddr,
    port_written: bool,
}

impl FromNode for ListenEntry {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let Shape::Str(s) = node.shape() else {
            cx.error(
                node,
                format!("expected address as a string, found {}", node.type_name()),
            );
            return None;
        };
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Some(ListenEntry {
                addr,
                port_written: true,
            });
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(ListenEntry {
                addr: SocketAddr::new(ip, 0),
                port_written: false,
            });
        }
        cx.error(
            node,
            format!(
                "invalid address {s:?}: expected ip:port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\" (an address alone for protocol = \"ip\")"
            ),
        );
        None
    }
}

/// The service's listen addresses from the entries as written, checked against its protocol:
/// ip takes addresses without a port (kept as port 0), the others need one; port 0 (every port)
/// is for tcp / udp in the kernel only.
pub(crate) fn listen_addresses(
    at: &str,
    protocol: Protocol,
    in_kernel: bool,
    entries: Vec<ListenEntry>,
    cx: &mut Cx<'_>,
) -> Vec<SocketAddr> {
    for (j, e) in entries.iter().enumerate() {
        let here = format!("{at}.listen[{j}]");
        let a = e.addr;
        if protocol == Protocol::Ip {
            if e.port_written {
                cx.error_path(
                    &here,
                    format!(
                        "{a}: protocol = \"ip\" takes every protocol and port to the address; write the address alone, e.g. \"{}\"",
                        a.ip()
                    ),
                );
            }
        } else if !e.port_written {
            cx.error_path(
                &here,
                format!(
                    "invalid address \"{}\": a port is required: ip:port, or [ipv6]:port (an address alone is for protocol = \"ip\")",
                    a.ip()
                ),
            );
        } else if a.port() == 0 && !(in_kernel && matches!(protocol, Protocol::Tcp | Protocol::Udp))
        {
            cx.error_path(
                &here,
                format!(
                    "{a}: port 0 (every port) applies to tcp / udp services with forwarding = \"nat\", \"dr\" or \"tunnel\"; this {protocol} service is proxied and listens on one port"
                ),
            );
        }
    }
    entries.into_iter().map(|e| e.addr).collect()
}

/// What the in-kernel forwarder takes on an address beyond exact ports: every port of tcp or
/// udp (a port-0 service), or every protocol (an ip service).
pub(crate) fn wildcard_of(
    protocol: Protocol,
    in_kernel: bool,
    addr: SocketAddr,
) -> Option<&'static str> {
    match protocol {
        Protocol::Ip => Some("every IP protocol"),
        Protocol::Tcp if in_kernel && addr.port() == 0 => Some("every TCP port"),
        Protocol::Udp if in_kernel && addr.port() == 0 => Some("every UDP port"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::{parse, Config, Forwarding, Protocol};

    const POOL: &str = "\n[[pool]]\nname = \"p\"\n\n[[pool.member]]\naddress = \"198.18.1.1:80\"\n";

    fn service(name: &str, listen: &str, protocol: &str, extra: &str) -> String {
        format!(
            "\n[[virtual_service]]\nname = \"{name}\"\nlisten = {listen}\nprotocol = \"{protocol}\"\npool = \"p\"\n{extra}\n"
        )
    }

    const DR: &str = "forwarding = \"dr\"\ninterfaces = [\"eth0\"]";

    fn ok(services: &str) -> Config {
        parse(&format!("{services}{POOL}"), "f.toml", Path::new("/"))
            .unwrap_or_else(|e| panic!("refused: {:#?}", e.messages()))
    }

    fn refused(services: &str, needles: &[&str]) {
        let text = format!("{services}{POOL}");
        let errors = match parse(&text, "f.toml", Path::new("/")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.messages(),
        };
        for n in needles {
            assert!(
                errors.iter().any(|e| e.contains(n)),
                "no error contains {n:?}: {errors:#?}"
            );
        }
    }

    #[test]
    fn ip_services_take_addresses_without_a_port() {
        for mode in ["nat", "dr", "tunnel"] {
            let c = ok(&service(
                "vpn",
                "[\"192.0.2.10\", \"2001:db8::10\"]",
                "ip",
                &format!("forwarding = \"{mode}\"\ninterfaces = [\"eth0\"]"),
            ));
            let vs = &c.virtual_services[0];
            assert_eq!(vs.protocol(), Protocol::Ip);
            assert!(vs.in_kernel());
            assert_eq!(vs.forwarding().forwarding.as_str(), mode);
            let listen: Vec<String> = vs.listen.iter().map(|a| a.to_string()).collect();
            assert_eq!(listen, ["192.0.2.10:0", "[2001:db8::10]:0"]);
            assert!(vs.rules().is_empty() && vs.stream().is_none());
        }
    }

    #[test]
    fn port_zero_is_every_port_of_an_in_kernel_tcp_or_udp_service() {
        for proto in ["tcp", "udp"] {
            let c = ok(&service("all", "\"192.0.2.10:0\"", proto, DR));
            assert_eq!(c.virtual_services[0].listen[0].port(), 0);
            assert_eq!(
                c.virtual_services[0].forwarding().forwarding,
                Forwarding::Dr
            );
        }
    }

    /// Exact port > port 0 > ip: all three on one address are one configuration.
    #[test]
    fn exact_port_port_zero_and_ip_share_an_address() {
        let c = ok(&[
            service("web", "\"192.0.2.10:80\"", "tcp", DR),
            service("tcp-rest", "\"192.0.2.10:0\"", "tcp", DR),
            service("udp-rest", "\"192.0.2.10:0\"", "udp", DR),
            service("rest", "\"192.0.2.10\"", "ip", DR),
            // A proxied service of the other transport than a port-0 one: its packets are not
            // the wildcard's.
            service("dns", "\"192.0.2.11:53\"", "udp", ""),
            service("tcp-rest2", "\"192.0.2.11:0\"", "tcp", DR),
        ]
        .concat());
        assert_eq!(c.virtual_services.len(), 6);
    }

    #[test]
    fn ip_needs_in_kernel_forwarding() {
        refused(
            &service("vpn", "\"192.0.2.10\"", "ip", ""),
            &[
                "virtual_service[0].forwarding",
                "protocol = \"ip\" forwards every IP protocol in the kernel",
            ],
        );
        refused(
            &service("vpn", "\"192.0.2.10\"", "ip", "forwarding = \"proxy\""),
            &["needs forwarding = \"nat\", \"dr\" or \"tunnel\""],
        );
    }

    #[test]
    fn ip_listen_entries_have_no_port() {
        refused(
            &service("vpn", "[\"192.0.2.10:500\"]", "ip", DR),
            &[
                "virtual_service[0].listen[0]",
                "write the address alone, e.g. \"192.0.2.10\"",
            ],
        );
        refused(
            &service("vpn", "\"192.0.2.10:0\"", "ip", DR),
            &["protocol = \"ip\" takes every protocol and port"],
        );
    }

    #[test]
    fn other_protocols_need_a_port() {
        refused(
            &service("web", "\"192.0.2.10\"", "tcp", DR),
            &[
                "virtual_service[0].listen[0]",
                "a port is required: ip:port, or [ipv6]:port (an address alone is for protocol = \"ip\")",
            ],
        );
        refused(
            &service("web", "\"not an address\"", "tcp", ""),
            &["invalid address \"not an address\""],
        );
    }

    #[test]
    fn port_zero_on_a_proxied_service_is_refused() {
        for proto in ["tcp", "udp", "http", "message"] {
            refused(
                &service("web", "\"192.0.2.10:0\"", proto, ""),
                &[
                    "virtual_service[0].listen[0]",
                    "port 0 (every port) applies to tcp / udp services with forwarding",
                ],
            );
        }
    }

    #[test]
    fn ip_services_do_not_take_another_protocols_keys() {
        refused(
            &service(
                "vpn",
                "\"192.0.2.10\"",
                "ip",
                &format!("{DR}\nsession_timeout = \"5s\""),
            ),
            &["`session_timeout` applies to protocol udp; this service is ip"],
        );
    }

    #[test]
    fn one_ip_service_per_address() {
        refused(
            &[
                service("a", "[\"192.0.2.10\", \"2001:db8::10\"]", "ip", DR),
                service("b", "\"2001:db8::10\"", "ip", DR),
            ]
            .concat(),
            &[
                "virtual_service[1].listen[0]",
                "2001:db8::10 is already the address of the ip service virtual_service[0] (a)",
            ],
        );
        refused(
            &[
                service("a", "\"192.0.2.10:0\"", "tcp", DR),
                service("b", "\"192.0.2.10:0\"", "tcp", DR),
            ]
            .concat(),
            &["192.0.2.10:0 is already used by virtual_service[0] (a)"],
        );
    }

    #[test]
    fn a_proxied_listener_under_a_wildcard_is_refused() {
        refused(
            &[
                service("vpn", "\"192.0.2.10\"", "ip", DR),
                service("web", "\"192.0.2.10:8080\"", "tcp", ""),
            ]
            .concat(),
            &[
                "virtual_service[1].listen[0]",
                "192.0.2.10:8080: the in-kernel service virtual_service[0] (vpn, forwarding = \"dr\") forwards every IP protocol to 192.0.2.10",
            ],
        );
        refused(
            &[
                service("all", "\"192.0.2.10:0\"", "udp", DR),
                service("dns", "\"192.0.2.10:53\"", "udp", ""),
            ]
            .concat(),
            &["forwards every UDP port to 192.0.2.10"],
        );
        refused(
            &[
                service(
                    "web",
                    "\"192.0.2.10:443\"",
                    "https",
                    "tls = { certificate = \"c.pem\", key = \"k.pem\" }",
                ),
                service("all", "\"192.0.2.10:0\"", "tcp", DR),
            ]
            .concat(),
            &["virtual_service[0].listen[0]", "forwards every TCP port"],
        );
    }

    #[test]
    fn members_of_port_zero_need_a_monitor_with_a_port() {
        let pool = "\n[[pool]]\nname = \"q\"\nmonitors = [\"m\"]\n[[pool.member]]\naddress = \"198.18.1.2:0\"\n";
        let vs = service("vpn", "\"192.0.2.10\"", "ip", DR).replace("pool = \"p\"", "pool = \"q\"");
        refused(
            &format!("{vs}{pool}[[monitor]]\nname = \"m\"\ntype = \"tcp\"\n"),
            &[
                "pool[0].monitors",
                "monitor \"m\" (tcp) probes each member on its own port, and member 198.18.1.2:0 has port 0",
            ],
        );
        ok(&format!(
            "{vs}{pool}[[monitor]]\nname = \"m\"\ntype = \"tcp\"\nport = 22\n"
        ));
        ok(&format!(
            "{vs}{pool}[[monitor]]\nname = \"m\"\ntype = \"icmp\"\n"
        ));
    }
}
