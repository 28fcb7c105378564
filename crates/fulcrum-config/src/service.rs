//! `[[virtual_service]]`: the keys every protocol has, and one section per protocol
//! (`ServiceKind`) holding only that protocol's keys, so a service of one protocol cannot carry
//! another's settings. Each section is read and checked in its own module (tcp.rs, udp.rs,
//! http.rs, message.rs); a key of another protocol is refused where it is written, naming the
//! protocols that take it. What needs other sections (pools, persistence profiles, GSLB names,
//! listening addresses) is checked by `validate`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::accel::TcpTuning;
use crate::access::AccessList;
use crate::forwarding::{Forwarding, ForwardingOptions, XdpMode, FORWARDING_KEYS};
use crate::http::{HttpSection, HTTP_SECTION_KEYS};
use crate::ip::{listen_addresses, IpSection, ListenEntry};
use crate::message::{MessageSection, MESSAGE_SECTION_KEYS};
use crate::protocol::{Protocol, ProxyProtocol};
use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::rtsp::RTSP_KEYS;
use crate::rule::{Rule, RULE_KEYS};
use crate::stream::{MemberSource, SourceAddresses, StreamOptions, SOURCE_KEYS, STREAM_KEYS};
use crate::tcp::{TcpSection, FTP_KEYS};
use crate::tls::{TlsTermination, TLS_KEYS};
use crate::types::{read_table, OneOrMany};
use crate::udp::{UdpSection, UDP_KEYS};

#[derive(Debug, Clone)]
pub struct VirtualService {
    pub name: String,
    pub listen: Vec<SocketAddr>,
    /// Required for every protocol but http / https (whose rules may name the pools).
    pub pool: Option<String>,
    pub persistence: Option<String>,
    /// Close a connection after this long with no bytes in either direction.
    pub idle_timeout: Duration,
    /// Concurrent client connections accepted; 0 = unlimited.
    pub max_connections: u32,
    /// `allow` / `deny`: source prefixes, checked first.
    pub access: AccessList,
    /// `vrf`: the VRF (an l3mdev device) the listeners are bound into; the same address and
    /// port in two VRFs are two services.
    pub vrf: Option<String>,
    /// `gslb`: the GSLB name (fully qualified, lower case) whose local site answers this
    /// service's listen addresses, with the service's health.
    pub gslb: Option<String>,
    /// The protocol and its own keys.
    pub kind: ServiceKind,
}

/// A virtual service's protocol with the keys only it takes.
#[derive(Debug, Clone)]
pub enum ServiceKind {
    Tcp(TcpSection),
    Udp(UdpSection),
    /// `protocol = "http"`, or `"https"` when the section terminates TLS (`tls` is set).
    Http(HttpSection),
    Message(MessageSection),
    /// `protocol = "ip"`: every IP protocol, forwarded in the kernel.
    Ip(IpSection),
}

/// The protocol-specific keys each protocol takes, for the message on a key of another one.
fn keys_of(protocol: Protocol) -> Vec<&'static str> {
    let parts: &[&[&str]] = match protocol {
        Protocol::Tcp => &[
            STREAM_KEYS,
            SOURCE_KEYS,
            TLS_KEYS,
            FORWARDING_KEYS,
            RULE_KEYS,
        ],
        Protocol::Udp => &[UDP_KEYS, FORWARDING_KEYS, RULE_KEYS],
        Protocol::Http => &[STREAM_KEYS, SOURCE_KEYS, HTTP_SECTION_KEYS, RULE_KEYS],
        Protocol::Https => &[
            STREAM_KEYS,
            SOURCE_KEYS,
            TLS_KEYS,
            HTTP_SECTION_KEYS,
            RULE_KEYS,
        ],
        Protocol::Message => &[
            STREAM_KEYS,
            SOURCE_KEYS,
            TLS_KEYS,
            MESSAGE_SECTION_KEYS,
            RULE_KEYS,
        ],
        Protocol::Ftp => &[STREAM_KEYS, FTP_KEYS],
        Protocol::Ip => &[FORWARDING_KEYS],
        Protocol::Rtsp => &[STREAM_KEYS, RTSP_KEYS, RULE_KEYS],
    };
    parts.concat()
}

fn protocols() -> impl Iterator<Item = Protocol> {
    Protocol::ALL.iter().filter_map(|p| Protocol::parse(p))
}

/// After a section has read its keys: the keys of other protocols written in the table are
/// errors naming the protocols that take them; unwritten ones stay known for "did you mean".
fn refuse_other_protocols(t: &mut TableReader<'_>, cx: &mut Cx<'_>, this: Option<Protocol>) {
    let mut all: Vec<&'static str> = protocols().flat_map(keys_of).collect();
    all.sort_unstable();
    all.dedup();
    for key in all {
        if t.asked(key) {
            continue;
        }
        match this {
            Some(p) if t.has(key) => {
                let takers: Vec<&str> = protocols()
                    .filter(|q| keys_of(*q).contains(&key))
                    .map(Protocol::as_str)
                    .collect();
                let value = t.reject(
                    cx,
                    key,
                    format!(
                        "`{key}` applies to protocol {}; this service is {p}",
                        takers.join(" / ")
                    ),
                );
                // A refused value is still checked where the check holds for every protocol,
                // so one run reports all that is wrong with it.
                if let (Some(node), "snat") = (value, key) {
                    let _ = SourceAddresses::from_node(&node, cx);
                }
            }
            _ => t.known(key),
        }
    }
}

impl ServiceKind {
    fn read(
        protocol: Protocol,
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
    ) -> ServiceKind {
        match protocol {
            Protocol::Rtsp => ServiceKind::Tcp(crate::rtsp::read(t, cx)),
            Protocol::Tcp | Protocol::Ftp => {
                ServiceKind::Tcp(TcpSection::read(t, cx, node, protocol))
            }
            Protocol::Udp => ServiceKind::Udp(UdpSection::read(t, cx)),
            Protocol::Http => ServiceKind::Http(HttpSection::read(t, cx, node, false)),
            Protocol::Https => ServiceKind::Http(HttpSection::read(t, cx, node, true)),
            Protocol::Message => ServiceKind::Message(MessageSection::read(t, cx, node)),
            Protocol::Ip => ServiceKind::Ip(IpSection::read(t, cx)),
        }
    }
}

impl FromNode for VirtualService {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let listen_written: Option<OneOrMany<ListenEntry>> = t.req(cx, "listen");
            let protocol: Option<Protocol> = t.req(cx, "protocol");
            let pool = t.opt(cx, "pool");
            let persistence = t.opt(cx, "persistence");
            let idle_timeout: Option<Duration> = t.opt(cx, "idle_timeout");
            let max_connections = t.opt(cx, "max_connections").unwrap_or(0);
            let access = AccessList::read(t, cx);
            let vrf = read_vrf(t, cx);
            let gslb: Option<String> = t.opt(cx, "gslb");
            let kind = protocol.map(|p| ServiceKind::read(p, t, cx, node));
            refuse_other_protocols(t, cx, protocol);
            let (protocol, kind) = (protocol?, kind?);
            let at = t.path().to_string();
            let in_kernel = kind_in_kernel(&kind);
            let listen = listen_written
                .map(|l| OneOrMany(listen_addresses(&at, protocol, in_kernel, l.0, cx)));
            if listen.as_ref().is_some_and(|l| l.0.is_empty()) {
                cx.error_path(&format!("{at}.listen"), "at least one address is required");
            }
            if pool.is_none() && !protocol.is_http() {
                cx.error_at(
                    node.span.clone(),
                    &at,
                    format!("missing required key `pool` (protocol {protocol})"),
                );
            }
            if gslb.is_some() {
                check_gslb_listen(&at, listen.as_ref().map_or(&[][..], |l| &l.0), cx);
            }
            if idle_timeout.is_some_and(|d| d.is_zero()) {
                cx.error_path(&format!("{at}.idle_timeout"), "must be longer than 0s");
            }
            let default_idle = match protocol {
                Protocol::Http | Protocol::Https => Duration::from_secs(60),
                _ => Duration::from_secs(300),
            };
            Some(VirtualService {
                name: name?,
                listen: listen?.0,
                pool,
                persistence,
                idle_timeout: idle_timeout.unwrap_or(default_idle),
                max_connections,
                access,
                vrf,
                gslb: gslb.map(|g| gslb_fqdn(&g)),
                kind,
            })
        })
    }
}

/// A GSLB name as `gslb.name` writes it: lower case, ending in a dot (`gslb = "app.example.com"`
/// and `"App.Example.com."` name the same one).
pub fn gslb_fqdn(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    if lower.ends_with('.') {
        lower
    } else {
        format!("{lower}.")
    }
}

/// A service that adds its listen addresses to a GSLB name must listen on addresses clients can
/// be sent to: a wildcard address is not one.
fn check_gslb_listen(at: &str, listen: &[SocketAddr], cx: &mut Cx<'_>) {
    for a in listen {
        if a.ip().is_unspecified() {
            cx.error_path(
                &format!("{at}.listen"),
                format!(
                    "{a} is a wildcard address, and `gslb` answers clients with this service's listen addresses: listen on the address clients reach"
                ),
            );
        }
    }
}

/// `vrf`: a VRF device's name (an interface name: sockets are bound to it with
/// SO_BINDTODEVICE, as `ip vrf exec` does).
pub(crate) fn read_vrf(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> Option<String> {
    let vrf: String = t.opt(cx, "vrf")?;
    if crate::types::ifname_ok(&vrf) {
        return Some(vrf);
    }
    cx.error_path(
        &format!("{}.vrf", t.path()),
        format!("{vrf:?} is not a VRF device name: expected 1 to 15 characters of letters, digits, '.', '_' and '-'"),
    );
    None
}

impl VirtualService {
    pub fn protocol(&self) -> Protocol {
        match &self.kind {
            ServiceKind::Tcp(s) if s.ftp.is_some() => Protocol::Ftp,
            ServiceKind::Tcp(s) if s.rtsp.is_some() => Protocol::Rtsp,
            ServiceKind::Tcp(_) => Protocol::Tcp,
            ServiceKind::Udp(_) => Protocol::Udp,
            ServiceKind::Http(h) if h.tls.is_some() => Protocol::Https,
            ServiceKind::Http(_) => Protocol::Http,
            ServiceKind::Message(_) => Protocol::Message,
            ServiceKind::Ip(_) => Protocol::Ip,
        }
    }

    pub fn as_tcp(&self) -> Option<&TcpSection> {
        match &self.kind {
            ServiceKind::Tcp(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_udp(&self) -> Option<&UdpSection> {
        match &self.kind {
            ServiceKind::Udp(s) => Some(s),
            _ => None,
        }
    }

    /// The http or https section.
    pub fn as_http(&self) -> Option<&HttpSection> {
        match &self.kind {
            ServiceKind::Http(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_message(&self) -> Option<&MessageSection> {
        match &self.kind {
            ServiceKind::Message(s) => Some(s),
            _ => None,
        }
    }

    /// The stream protocols' keys (tcp, http, https, message); `None` for udp.
    pub fn stream(&self) -> Option<&StreamOptions> {
        match &self.kind {
            ServiceKind::Tcp(s) => Some(&s.stream),
            ServiceKind::Udp(_) | ServiceKind::Ip(_) => None,
            ServiceKind::Http(s) => Some(&s.stream),
            ServiceKind::Message(s) => Some(&s.stream),
        }
    }

    /// The TLS the service terminates (https, and tcp / message with `tls`).
    pub fn tls(&self) -> Option<&TlsTermination> {
        match &self.kind {
            ServiceKind::Tcp(s) => s.tls.as_ref(),
            ServiceKind::Udp(_) | ServiceKind::Ip(_) => None,
            ServiceKind::Http(s) => s.tls.as_ref(),
            ServiceKind::Message(s) => s.tls.as_ref(),
        }
    }

    pub(crate) fn tls_mut(&mut self) -> Option<&mut TlsTermination> {
        match &mut self.kind {
            ServiceKind::Tcp(s) => s.tls.as_mut(),
            ServiceKind::Udp(_) | ServiceKind::Ip(_) => None,
            ServiceKind::Http(s) => s.tls.as_mut(),
            ServiceKind::Message(s) => s.tls.as_mut(),
        }
    }

    /// How packets reach the members: tcp and udp services choose; the other protocols are
    /// always proxied.
    pub fn forwarding(&self) -> &ForwardingOptions {
        static PROXY: ForwardingOptions = ForwardingOptions {
            forwarding: Forwarding::Proxy,
            interfaces: Vec::new(),
            xdp_mode: XdpMode::Auto,
            flow_limits: None,
        };
        match &self.kind {
            ServiceKind::Tcp(s) => &s.forwarding,
            ServiceKind::Udp(s) => &s.forwarding,
            ServiceKind::Ip(s) => &s.forwarding,
            _ => &PROXY,
        }
    }

    /// Whether the in-kernel forwarder (XDP) carries the service instead of a proxy.
    pub fn in_kernel(&self) -> bool {
        self.forwarding().forwarding.in_kernel()
    }

    /// Source addresses of member connections (stream protocols); empty = the host's choice.
    pub fn snat(&self) -> &[IpAddr] {
        self.stream().map_or(&[], |s| &s.snat)
    }

    /// Where member connections come from (`source`); `local` for udp and ftp.
    pub fn member_source(&self) -> MemberSource {
        self.stream().map_or(MemberSource::Local, |s| s.source)
    }

    /// `source = "client"`: member connections from the client's own address.
    pub fn transparent(&self) -> bool {
        self.member_source() == MemberSource::Client
    }

    pub fn proxy_protocol(&self) -> Option<ProxyProtocol> {
        self.stream().and_then(|s| s.proxy_protocol)
    }

    /// Client-side TCP options (stream protocols).
    pub fn tcp_tuning(&self) -> Option<&TcpTuning> {
        self.stream().and_then(|s| s.tcp.as_ref())
    }

    /// The service's rules: content switching (http / https), or the pool of a connection or
    /// flow (tcp, udp, message); empty for ftp.
    pub fn rules(&self) -> &[Rule] {
        match &self.kind {
            ServiceKind::Tcp(s) => &s.rules,
            ServiceKind::Udp(s) => &s.rules,
            ServiceKind::Http(s) => &s.rules,
            ServiceKind::Message(s) => &s.rules,
            ServiceKind::Ip(_) => &[],
        }
    }
}

/// Whether the section just read forwards in the kernel (decides what `listen` may hold).
fn kind_in_kernel(kind: &ServiceKind) -> bool {
    match kind {
        ServiceKind::Tcp(s) => s.forwarding.forwarding.in_kernel(),
        ServiceKind::Udp(s) => s.forwarding.forwarding.in_kernel(),
        ServiceKind::Ip(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a protocol declares is read by its section (never "unknown"), and every other
    /// protocol's key is refused with the protocols that take it.
    #[test]
    fn declared_keys_match_what_the_sections_read() {
        let all: Vec<&str> = protocols().flat_map(keys_of).collect();
        for p in protocols() {
            let mine = keys_of(p);
            let mut text = format!(
                "[[virtual_service]]\nname = \"s\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"{p}\"\npool = \"p\"\n"
            );
            for key in &all {
                if !text.contains(&format!("\n{key} = ")) {
                    text.push_str(&format!("{key} = 0\n"));
                }
            }
            text.push_str("[[pool]]\nname = \"p\"\n");
            let errors = crate::parse(&text, "t.toml", std::path::Path::new("."))
                .expect_err("values of the wrong type")
                .messages();
            for key in &all {
                let at = format!("virtual_service[0].{key}: ");
                let unknown = errors
                    .iter()
                    .any(|e| e.contains(&format!("unknown key `{key}`")));
                let refused = errors
                    .iter()
                    .any(|e| e.contains(&at) && e.contains("applies to protocol"));
                assert!(!unknown, "{p}: `{key}` is unknown: {errors:#?}");
                assert_eq!(
                    refused,
                    !mine.contains(key),
                    "{p}: `{key}` refused = {refused}: {errors:#?}"
                );
            }
            // And no section reads a key it does not declare: the keys known in the table are
            // the common ones and the declared ones.
            let text = format!(
                "[[virtual_service]]\nname = \"s\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"{p}\"\npool = \"p\"\nqqqqqqqqqqqq = 1\n[[pool]]\nname = \"p\"\n"
            );
            let errors = crate::parse(&text, "t.toml", std::path::Path::new("."))
                .expect_err("unknown key")
                .messages();
            let known = errors
                .iter()
                .find_map(|e| {
                    e.split_once("known keys here: ")
                        .map(|(_, k)| k.to_string())
                })
                .expect("the known keys");
            let common = [
                "name",
                "listen",
                "protocol",
                "pool",
                "persistence",
                "idle_timeout",
                "max_connections",
                "allow",
                "deny",
                "gslb",
                "vrf",
            ];
            for key in known.split(", ") {
                assert!(
                    common.contains(&key) || all.contains(&key),
                    "{p} reads `{key}` without declaring it"
                );
            }
        }
    }
}
