//! Checks of one `[[pool]]` once its keys are read. Which services use a pool, and whether its
//! keys suit their protocols, is checked by `validate`.

use crate::member::{Algorithm, Member};
use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::read_table;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// Checks of the pool at `base` (such as `pool[0]`).
pub(crate) fn check(base: &str, pool: &Pool, cx: &mut Cx<'_>) {
    let at = |k: &str| format!("{base}.{k}");
    let mut seen = HashMap::new();
    for (j, m) in pool.members.iter().enumerate() {
        if let Some(first) = seen.insert(m.address, j) {
            cx.error_path(
                &format!("{base}.member[{j}].address"),
                format!(
                    "duplicate member {}: already {base}.member[{first}]",
                    m.address
                ),
            );
        }
    }
    if pool.name.starts_with("gslb:") || pool.name.starts_with("gslb-site:") {
        cx.error_path(
            &at("name"),
            format!("{:?}: pool names starting with \"gslb:\" or \"gslb-site:\" are reserved for GSLB's own pools", pool.name),
        );
    }
    if pool.vrf.is_some() && pool.kind != crate::link::PoolKind::Server {
        cx.error_path(
            &at("vrf"),
            "`vrf` applies to server pools; links and gateways leave by their own interfaces",
        );
    }
    crate::http::check_pool(base, &pool.http, cx);
    if pool.min_active == 0 {
        cx.error_path(&at("min_active"), "must be at least 1");
    }
    if pool.connect_timeout.is_zero() {
        cx.error_path(&at("connect_timeout"), "must be longer than 0s");
    }
    if pool.zero_window_timeout.is_some_and(|d| d.is_zero()) {
        cx.error_path(
            &at("zero_window_timeout"),
            "must be longer than 0s (leave it out to not watch zero windows)",
        );
    }
}

/// What `algorithm = "hash"` hashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HashKey {
    SourceIp,
    SourceIpPort,
    Uri,
    Host,
    Header(String),
    Cookie(String),
}

impl HashKey {
    /// Keys that need an HTTP request to compute.
    pub fn is_l7(&self) -> bool {
        !matches!(self, HashKey::SourceIp | HashKey::SourceIpPort)
    }
}

impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HashKey::SourceIp => f.write_str("source_ip"),
            HashKey::SourceIpPort => f.write_str("source_ip_port"),
            HashKey::Uri => f.write_str("uri"),
            HashKey::Host => f.write_str("host"),
            HashKey::Header(h) => write!(f, "header:{h}"),
            HashKey::Cookie(c) => write!(f, "cookie:{c}"),
        }
    }
}

impl FromNode for HashKey {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        const ALL: &[&str] = &[
            "source_ip",
            "source_ip_port",
            "uri",
            "host",
            "header:NAME",
            "cookie:NAME",
        ];
        let s: String = String::from_node(node, cx)?;
        let key = match s.as_str() {
            "source_ip" => Some(HashKey::SourceIp),
            "source_ip_port" => Some(HashKey::SourceIpPort),
            "uri" => Some(HashKey::Uri),
            "host" => Some(HashKey::Host),
            other => match other.split_once(':') {
                Some(("header", name)) if !name.is_empty() => {
                    Some(HashKey::Header(name.to_string()))
                }
                Some(("cookie", name)) if !name.is_empty() => {
                    Some(HashKey::Cookie(name.to_string()))
                }
                _ => None,
            },
        };
        if key.is_none() {
            let hint = crate::error::did_you_mean(&s, ALL.iter().copied())
                .map(|m| format!(" (did you mean {m:?}?)"))
                .unwrap_or_default();
            cx.error(
                node,
                format!(
                    "unknown hash key {s:?}; expected one of: {}{hint}",
                    ALL.join(", ")
                ),
            );
        }
        key
    }
}

string_enum!(Reuse {
    Never = "never",
    Safe = "safe",
    Always = "always",
});

#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub algorithm: Algorithm,
    pub hash_key: HashKey,
    pub monitors: Vec<String>,
    pub slow_start: Option<SlowStart>,
    pub min_active: u32,
    pub retries: u32,
    pub connect_timeout: Duration,
    /// A member connection whose receive window stays at zero this long, while Fulcrum has
    /// bytes for it, counts as a passive failure (Fulcrum addition; None = not watched).
    pub zero_window_timeout: Option<Duration>,
    pub members: Vec<Member>,
    pub reuse: Reuse,
    pub tls: Option<UpstreamTls>,
    /// How the HTTP data plane talks to the members (Fulcrum additions).
    pub http: crate::http::HttpPoolOptions,
    /// server (default), link or gateway; `members` holds servers, `links` and `gateways` the
    /// members of the other kinds.
    pub kind: crate::link::PoolKind,
    pub links: Vec<crate::link::LinkMember>,
    pub gateways: Vec<crate::link::GatewayMember>,
    /// Link pools: a link above this share of its bandwidth takes no new flows.
    pub busy: Option<f64>,
    /// Standby members joining on utilisation (crate::elastic; Fulcrum addition).
    pub elastic: Option<crate::elastic::Elastic>,
    /// `vrf`: member connections and health checks leave from this VRF device.
    pub vrf: Option<String>,
}

impl FromNode for Pool {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.opt(cx, "kind").unwrap_or(crate::link::PoolKind::Server);
            let (mut members, mut links, mut gateways) = (Vec::new(), Vec::new(), Vec::new());
            match kind {
                crate::link::PoolKind::Server => members = t.opt(cx, "member").unwrap_or_default(),
                crate::link::PoolKind::Link => links = t.opt(cx, "member").unwrap_or_default(),
                crate::link::PoolKind::Gateway => {
                    gateways = t.opt(cx, "member").unwrap_or_default()
                }
            }
            let elastic = t.opt(cx, "elastic");
            let vrf = crate::service::read_vrf(t, cx);
            let path = t.path().to_string();
            crate::elastic::check_pool(elastic.as_ref(), &members, node, &path, cx);
            let value = Pool {
                kind,
                links,
                gateways,
                elastic,
                vrf,
                busy: t.opt(cx, "busy"),
                algorithm: t.opt(cx, "algorithm").unwrap_or(Algorithm::RoundRobin),
                hash_key: t.opt(cx, "hash_key").unwrap_or(HashKey::SourceIp),
                monitors: t.opt(cx, "monitors").unwrap_or_default(),
                slow_start: t.opt(cx, "slow_start"),
                min_active: t.opt(cx, "min_active").unwrap_or(1),
                retries: t.opt(cx, "retries").unwrap_or(2),
                connect_timeout: t
                    .opt(cx, "connect_timeout")
                    .unwrap_or(Duration::from_secs(3)),
                zero_window_timeout: t.opt(cx, "zero_window_timeout"),
                members,
                reuse: t.opt(cx, "reuse").unwrap_or(Reuse::Safe),
                tls: t.opt(cx, "tls"),
                http: crate::http::HttpPoolOptions::read(t, cx),
                name: name?,
            };
            crate::pool::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlowStart {
    pub recovery: Duration,
    pub warm: Duration,
}

impl FromNode for SlowStart {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(SlowStart {
                recovery: t.opt(cx, "recovery").unwrap_or_default(),
                warm: t.opt(cx, "warm").unwrap_or_default(),
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub verify: bool,
    pub ca: Option<PathBuf>,
    pub sni: Option<String>,
}

impl FromNode for UpstreamTls {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(UpstreamTls {
                verify: t.opt(cx, "verify").unwrap_or(true),
                ca: t.opt::<String>(cx, "ca").map(PathBuf::from),
                sni: t.opt(cx, "sni"),
            })
        })
    }
}
