//! Checks of one `[[monitor]]` once its keys are read: timings, expected values, and the keys
//! of each monitor type (a key of another type is refused). References to monitors are checked
//! by `validate`.

use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::read_table;
use std::time::Duration;

/// DNS record types a dns monitor may ask for.
pub const DNS_QUERY_TYPES: &[&str] = &[
    "A", "AAAA", "NS", "CNAME", "SOA", "PTR", "MX", "TXT", "SRV", "CAA", "ANY",
];
/// DNS response codes a dns monitor may expect.
pub const DNS_RCODES: &[&str] = &[
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED",
];

/// Checks of the monitor at `base` (such as `monitor[2]`).
pub(crate) fn check(base: &str, m: &Monitor, cx: &mut Cx<'_>) {
    let at = |k: &str| format!("{base}.{k}");
    if m.interval.is_zero() {
        cx.error_path(&at("interval"), "must be longer than 0s");
    }
    if m.timeout.is_zero() {
        cx.error_path(&at("timeout"), "must be longer than 0s");
    } else if m.timeout > m.interval {
        cx.error_path(
            &at("timeout"),
            format!(
                "{} is longer than the interval ({}): a check would still run when the next starts",
                humantime::format_duration(m.timeout),
                humantime::format_duration(m.interval)
            ),
        );
    }
    for s in &m.expect_status {
        if !(100..=599).contains(s) {
            cx.error_path(
                &at("expect_status"),
                format!("{s} is not an HTTP status (100 to 599)"),
            );
        }
    }
    if m.kind == MonitorKind::SendExpect && m.expect.is_none() {
        cx.error_path(base, "type send_expect needs `expect` (and usually `send`)");
    }
    if m.port == Some(0) {
        cx.error_path(&at("port"), "0 is not a port");
    }
    if m.kind == MonitorKind::Snmp && m.snmp.max.is_none() && cx.written(&at("weight_share")) {
        cx.error_path(
            &at("weight_share"),
            "an snmp monitor reports a weight only with `max`: add max, or remove weight_share",
        );
    }
    check_protocol_keys(base, m, cx);
}

/// Keys of the protocol monitors: required ones present, values well-formed, and no key of
/// another kind.
fn check_protocol_keys(base: &str, m: &Monitor, cx: &mut Cx<'_>) {
    let at = |k: &str| format!("{base}.{k}");
    for (key, kinds) in MONITOR_KIND_KEYS {
        if cx.written(&at(key)) && !kinds.contains(&m.kind) {
            let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
            cx.error_path(
                &at(key),
                format!(
                    "`{key}` applies to monitor type {}; this monitor is {}",
                    names.join(" / "),
                    m.kind
                ),
            );
        }
    }
    match m.kind {
        MonitorKind::Snmp if m.snmp.oid.is_none() && !cx.written(&at("oid")) => {
            cx.error_path(
                base,
                "type snmp needs `oid`: the value read, e.g. \"1.3.6.1.4.1.2021.10.1.5.1\" (laLoadInt.1)",
            );
        }
        MonitorKind::Dns => {
            match m.query.as_deref() {
                None => cx.error_path(
                    base,
                    "type dns needs `query`: the name to ask for, e.g. \"health.example.com.\"",
                ),
                Some(q) if !dns_name_ok(q) => cx.error_path(
                    &at("query"),
                    format!("{q:?} is not a DNS name (labels of 1 to 63 characters, 253 in all)"),
                ),
                Some(_) => {}
            }
            if !DNS_QUERY_TYPES.contains(&m.query_type.as_str()) {
                cx.error_path(
                    &at("query_type"),
                    format!(
                        "unknown record type {:?}; expected one of: {}",
                        m.query_type,
                        DNS_QUERY_TYPES.join(", ")
                    ),
                );
            }
            if !DNS_RCODES.contains(&m.expect_rcode.as_str()) {
                cx.error_path(
                    &at("expect_rcode"),
                    format!(
                        "unknown response code {:?}; expected one of: {}",
                        m.expect_rcode,
                        DNS_RCODES.join(", ")
                    ),
                );
            }
        }
        MonitorKind::Radius => {
            if m.secret.as_deref().is_none_or(str::is_empty) {
                cx.error_path(
                    base,
                    "type radius needs `secret`: the shared secret the member has for Fulcrum",
                );
            }
            if m.password.is_some() && m.username.is_none() {
                cx.error_path(&at("password"), "`password` needs `username`");
            }
        }
        MonitorKind::Pop3 | MonitorKind::Imap if m.username.is_some() != m.password.is_some() => {
            cx.error_path(base, "give both `username` and `password`, or neither");
        }
        MonitorKind::Nntp => {
            if m.username.is_some() != m.password.is_some() {
                cx.error_path(base, "give both `username` and `password`, or neither");
            }
            if let Some(g) = m.newsgroup.as_deref().filter(|g| !newsgroup_ok(g)) {
                cx.error_path(
                    &at("newsgroup"),
                    format!("{g:?} is not a newsgroup name: expected a name such as \"comp.lang.rust\", without spaces, control characters or the wildmat characters ! * , ? [ \\ ]"),
                );
            }
        }
        MonitorKind::Ftp if m.password.is_some() && m.username.is_none() => {
            cx.error_path(&at("password"), "`password` needs `username`");
        }
        _ => {}
    }
}

/// A newsgroup name as RFC 3977 §4.1 allows it in `GROUP` (`1*wildmat-exact`): printable, no
/// spaces, none of the wildmat characters; 497 bytes at most so that the command line stays
/// within the RFC's 512.
fn newsgroup_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 497
        && name
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !"!*,?[\\]".contains(c))
}

/// A DNS name in text form: "." or dot-separated labels of 1–63 bytes, 253 bytes in all, no
/// spaces or control characters.
fn dns_name_ok(name: &str) -> bool {
    if name == "." {
        return true;
    }
    let bare = name.strip_suffix('.').unwrap_or(name);
    !bare.is_empty()
        && bare.len() <= 253
        && bare
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_graphic()))
}

string_enum!(MonitorKind {
    Tcp = "tcp",
    Http = "http",
    Https = "https",
    SendExpect = "send_expect",
    Agent = "agent",
    Dns = "dns",
    Radius = "radius",
    Smtp = "smtp",
    Pop3 = "pop3",
    Imap = "imap",
    Ftp = "ftp",
    Nntp = "nntp",
    Icmp = "icmp",
    Snmp = "snmp",
});

#[derive(Debug, Clone)]
pub struct Monitor {
    pub name: String,
    pub kind: MonitorKind,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub port: Option<u16>,
    pub path: String,
    pub method: String,
    pub host: Option<String>,
    pub expect_status: Vec<u16>,
    pub expect_body: Option<String>,
    pub send: Option<String>,
    pub expect: Option<String>,
    /// dns: the name asked for (required for dns).
    pub query: Option<String>,
    /// dns: the record type asked for, e.g. "A" (default), "AAAA", "SOA".
    pub query_type: String,
    /// dns: the response code that passes, e.g. "NOERROR" (default), "NXDOMAIN".
    pub expect_rcode: String,
    /// dns: text one of the answer records must contain (an address, a name).
    pub expect_answer: Option<String>,
    /// radius: the shared secret (required for radius).
    pub secret: Option<String>,
    /// radius (Access-Request instead of Status-Server), pop3, imap, ftp: log in as this user.
    pub username: Option<String>,
    pub password: Option<String>,
    /// nntp: the newsgroup a `GROUP` command selects (211 passes), as F5's `newsgroup`.
    pub newsgroup: Option<String>,
    /// snmp: community, OID, and the value that means "no more load" (crate::snmp).
    pub snmp: crate::snmp::SnmpOptions,
    /// How much this monitor's weight reading counts when several of a member's monitors
    /// report one (`snmp` with `max`, `agent`): the member's weight percentage is their
    /// average weighted by this, 1 to 100.
    pub weight_share: u32,
    /// Link monitors: the targets probed through the link, and how many must answer.
    pub link: crate::link::LinkProbe,
}

impl Monitor {
    /// Whether its answers set the member's weight percentage: an agent (`NN%`), an snmp
    /// monitor with `max`.
    pub fn reports_weight(&self) -> bool {
        self.kind == MonitorKind::Agent
            || (self.kind == MonitorKind::Snmp && self.snmp.max.is_some())
    }
}

/// Monitor keys added for the protocol monitors, with the kinds that use them; validation refuses
/// them on other kinds.
pub const MONITOR_KIND_KEYS: &[(&str, &[MonitorKind])] = &[
    ("query", &[MonitorKind::Dns]),
    ("query_type", &[MonitorKind::Dns]),
    ("expect_rcode", &[MonitorKind::Dns]),
    ("expect_answer", &[MonitorKind::Dns]),
    ("secret", &[MonitorKind::Radius]),
    (
        "username",
        &[
            MonitorKind::Radius,
            MonitorKind::Pop3,
            MonitorKind::Imap,
            MonitorKind::Ftp,
            MonitorKind::Nntp,
        ],
    ),
    (
        "password",
        &[
            MonitorKind::Radius,
            MonitorKind::Pop3,
            MonitorKind::Imap,
            MonitorKind::Ftp,
            MonitorKind::Nntp,
        ],
    ),
    ("newsgroup", &[MonitorKind::Nntp]),
    ("community", &[MonitorKind::Snmp]),
    ("oid", &[MonitorKind::Snmp]),
    ("max", &[MonitorKind::Snmp]),
    ("weight_share", &[MonitorKind::Snmp, MonitorKind::Agent]),
];

/// `weight_share`: 1 to 100 (default 1).
fn weight_share(t: &mut crate::reader::TableReader<'_>, cx: &mut Cx<'_>) -> u32 {
    let v: u32 = t.opt(cx, "weight_share").unwrap_or(1);
    if !(1..=100).contains(&v) {
        if let Some(n) = t.node("weight_share") {
            cx.error(&n, "must be from 1 to 100 (its share of the member's weight among the monitors that report one)");
        }
        return 1;
    }
    v
}

impl FromNode for Monitor {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.req(cx, "type");
            let rise = t.opt(cx, "rise").unwrap_or(2);
            let fall = t.opt(cx, "fall").unwrap_or(3);
            for (key, v) in [("rise", rise), ("fall", fall)] {
                if v == 0 {
                    cx.error_at(
                        node.span.clone(),
                        &format!("{}.{key}", t.path()),
                        "must be at least 1",
                    );
                }
            }
            let value = Monitor {
                interval: t.opt(cx, "interval").unwrap_or(Duration::from_secs(2)),
                timeout: t.opt(cx, "timeout").unwrap_or(Duration::from_secs(1)),
                rise,
                fall,
                port: t.opt(cx, "port"),
                path: t.opt(cx, "path").unwrap_or_else(|| "/".to_string()),
                method: t.opt(cx, "method").unwrap_or_else(|| "GET".to_string()),
                host: t.opt(cx, "host"),
                expect_status: t.opt(cx, "expect_status").unwrap_or_default(),
                expect_body: t.opt(cx, "expect_body"),
                send: t.opt(cx, "send"),
                expect: t.opt(cx, "expect"),
                query: t.opt(cx, "query"),
                query_type: t
                    .opt::<String>(cx, "query_type")
                    .map_or_else(|| "A".to_string(), |s| s.to_ascii_uppercase()),
                expect_rcode: t
                    .opt::<String>(cx, "expect_rcode")
                    .map_or_else(|| "NOERROR".to_string(), |s| s.to_ascii_uppercase()),
                expect_answer: t.opt(cx, "expect_answer"),
                secret: t.opt(cx, "secret"),
                username: t.opt(cx, "username"),
                password: t.opt(cx, "password"),
                newsgroup: t.opt(cx, "newsgroup"),
                snmp: crate::snmp::SnmpOptions::read(t, cx),
                weight_share: weight_share(t, cx),
                link: crate::link::LinkProbe::read(t, cx),
                name: name?,
                kind: kind?,
            };
            crate::monitor::check(t.path(), &value, cx);
            Some(value)
        })
    }
}
