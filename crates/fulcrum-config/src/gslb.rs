//! Checks of the `[gslb]` table, its sites and its names once they are read. References
//! (regions, monitors, the local site, the names' sites, services' `gslb_redirect`) and the
//! exchange's listening address are checked by `validate`.

use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::{read_table, OneOrMany};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Checks of `[gslb]`'s own keys (at `base`, "gslb").
pub(crate) fn check(base: &str, g: &Gslb, cx: &mut Cx<'_>) {
    for (j, k) in g.keys.iter().enumerate() {
        if k.len() < 16 {
            cx.error_path(
                &format!("{base}.key[{j}]"),
                "a key must be at least 16 characters long",
            );
        }
    }
    if g.interval.is_zero() {
        cx.error_path(&format!("{base}.interval"), "must be longer than 0s");
    }
    if g.stale_after <= g.interval {
        cx.error_path(
            &format!("{base}.stale_after"),
            format!(
                "{} must be longer than the report interval ({})",
                humantime::format_duration(g.stale_after),
                humantime::format_duration(g.interval)
            ),
        );
    }
    if g.local_site.is_none() && g.listen.is_some() {
        cx.error_path(
            &format!("{base}.listen"),
            "the site state exchange needs gslb.local_site: the site this instance runs at",
        );
    }
}

/// Checks of the site at `base` (such as `gslb.site[0]`).
pub(crate) fn check_site(base: &str, s: &Site, cx: &mut Cx<'_>) {
    if let Some(h) = &s.redirect_host {
        if let Err(why) = check_redirect_host(h) {
            cx.error_path(&format!("{base}.redirect_host"), why);
        }
    }
    if s.weight > crate::MAX_WEIGHT {
        cx.error_path(
            &format!("{base}.weight"),
            format!(
                "{} is too large; expected 0 to {}",
                s.weight,
                crate::MAX_WEIGHT
            ),
        );
    }
}

/// Checks of the name at `base` (such as `gslb.name[0]`).
pub(crate) fn check_name(base: &str, n: &GslbName, cx: &mut Cx<'_>) {
    if !n.fqdn.ends_with('.') {
        cx.error_path(
            &format!("{base}.fqdn"),
            format!("{:?} must be fully qualified, ending in a dot", n.fqdn),
        );
    }
    if n.answers == 0 {
        cx.error_path(&format!("{base}.answers"), "must be at least 1");
    }
    if n.sites.is_empty() {
        cx.error_path(&format!("{base}.sites"), "at least one site is required");
    }
}

/// Checks a `redirect_host`: a DNS host name (letters, digits, `-`, dots; labels of 1–63
/// characters) optionally followed by `:port`. It becomes the authority of a `Location` header,
/// so nothing else may pass.
fn check_redirect_host(h: &str) -> Result<(), String> {
    let expected = "expected a host name with an optional port, like \"eu.app.example.com\" or \"eu.app.example.com:8443\"";
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (h, None),
    };
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{h:?}: bad port {p:?}; {expected}"));
        }
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a host name; {expected}"));
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Gslb {
    pub sites: Vec<Site>,
    pub names: Vec<GslbName>,
    /// The site this instance runs at: its reports carry that site's own figures, and its
    /// `peer` address is where it accepts the other instances' reports.
    pub local_site: Option<String>,
    /// Where the site state exchange accepts peers; default: the local site's `peer`.
    pub listen: Option<SocketAddr>,
    /// Shared secrets authenticating the exchange (HMAC-SHA256): the first signs, any verifies.
    pub keys: Vec<String>,
    /// Period of the state reports sent to peers (changes are also sent at once).
    pub interval: Duration,
    /// A peer whose last report is older than this is stale and left out of the table.
    pub stale_after: Duration,
    /// How `algorithm = "proximity"` measures the RTT to resolvers (`[gslb.proximity]`).
    pub proximity: Proximity,
}

/// `[gslb.proximity]`: the RTT probes of `algorithm = "proximity"`. Each instance sends a DNS
/// query (`.` NS, no recursion) to the resolver or Client Subnet address and takes the time to
/// any reply as its site's RTT to that /24 (/48).
#[derive(Debug, Clone, PartialEq)]
pub struct Proximity {
    /// UDP port the probe queries go to.
    pub port: u16,
    /// Source address of the probes (default: the host's choice).
    pub source: Option<IpAddr>,
    /// A probe without a reply within this is "unreachable" (ranked last).
    pub timeout: Duration,
    /// A measurement older than this is measured again at the next query (the old value is
    /// used meanwhile).
    pub max_age: Duration,
    /// Prefixes whose RTT is kept (the oldest unused go first).
    pub max_prefixes: u32,
    /// Probes waiting for their reply at once.
    pub max_in_flight: u32,
    /// Probes started per second at most.
    pub probes_per_second: u32,
    /// How much a site's load (1 − capacity left) counts against its RTT: a site is ranked by
    /// RTT × (1 + load_weight × load).
    pub load_weight: f64,
}

impl Default for Proximity {
    fn default() -> Self {
        Proximity {
            port: 53,
            source: None,
            timeout: Duration::from_secs(1),
            max_age: Duration::from_secs(300),
            max_prefixes: 10_000,
            max_in_flight: 64,
            probes_per_second: 100,
            load_weight: 1.0,
        }
    }
}

impl FromNode for Proximity {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Proximity::default();
            let value = Proximity {
                port: t.opt(cx, "port").unwrap_or(d.port),
                source: t.opt(cx, "source"),
                timeout: t.opt(cx, "timeout").unwrap_or(d.timeout),
                max_age: t.opt(cx, "max_age").unwrap_or(d.max_age),
                max_prefixes: t.opt(cx, "max_prefixes").unwrap_or(d.max_prefixes),
                max_in_flight: t.opt(cx, "max_in_flight").unwrap_or(d.max_in_flight),
                probes_per_second: t
                    .opt(cx, "probes_per_second")
                    .unwrap_or(d.probes_per_second),
                load_weight: t.opt(cx, "load_weight").unwrap_or(d.load_weight),
            };
            check_proximity(t.path(), &value, cx);
            Some(value)
        })
    }
}

/// Checks of `[gslb.proximity]` (at `base`).
fn check_proximity(base: &str, p: &Proximity, cx: &mut Cx<'_>) {
    if p.port == 0 {
        cx.error_path(&format!("{base}.port"), "must be 1 to 65535");
    }
    if p.timeout.is_zero() {
        cx.error_path(&format!("{base}.timeout"), "must be longer than 0s");
    }
    if p.max_age <= p.timeout {
        cx.error_path(
            &format!("{base}.max_age"),
            format!(
                "{} must be longer than the probe timeout ({})",
                humantime::format_duration(p.max_age),
                humantime::format_duration(p.timeout)
            ),
        );
    }
    for (key, v, max) in [
        ("max_prefixes", p.max_prefixes, 10_000_000),
        ("max_in_flight", p.max_in_flight, 10_000),
        ("probes_per_second", p.probes_per_second, 100_000),
    ] {
        if v == 0 || v > max {
            cx.error_path(
                &format!("{base}.{key}"),
                format!("{v} is out of range; expected 1 to {max}"),
            );
        }
    }
    if !(0.0..=100.0).contains(&p.load_weight) {
        cx.error_path(
            &format!("{base}.load_weight"),
            format!("{} is out of range; expected 0 to 100", p.load_weight),
        );
    }
}

impl Default for Gslb {
    fn default() -> Self {
        Gslb {
            sites: Vec::new(),
            names: Vec::new(),
            local_site: None,
            listen: None,
            keys: Vec::new(),
            interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(5),
            proximity: Proximity::default(),
        }
    }
}

impl Gslb {
    pub fn site(&self, name: &str) -> Option<&Site> {
        self.sites.iter().find(|s| s.name == name)
    }
}

impl FromNode for Gslb {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Gslb::default();
            let value = Gslb {
                sites: t.opt(cx, "site").unwrap_or_default(),
                names: t.opt(cx, "name").unwrap_or_default(),
                local_site: t.opt(cx, "local_site"),
                listen: t.opt(cx, "listen"),
                keys: t
                    .opt::<OneOrMany<String>>(cx, "key")
                    .map(|k| k.0)
                    .unwrap_or_default(),
                interval: t.opt(cx, "interval").unwrap_or(d.interval),
                stale_after: t.opt(cx, "stale_after").unwrap_or(d.stale_after),
                proximity: t.opt(cx, "proximity").unwrap_or_default(),
            };
            crate::gslb::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone)]
pub struct Site {
    pub name: String,
    /// Addresses answered for the site for every name listing it. May be empty when the site's
    /// addresses are learnt: from this instance's virtual services with `gslb` (the local site)
    /// or from the site's reports over the exchange (another site with a `peer`).
    pub addresses: Vec<IpAddr>,
    pub regions: Vec<String>,
    pub monitor: Option<String>,
    pub weight: u32,
    pub peer: Option<SocketAddr>,
    /// `host[:port]` the HTTP redirect fallback (`gslb_redirect`) sends clients to for this
    /// site, instead of one of its addresses.
    pub redirect_host: Option<String>,
    /// The link (a member of a `kind = "link"` pool) the site's addresses are reached by:
    /// while it is down or busy the site is out of the answers (Fulcrum addition).
    pub link: Option<String>,
}

impl FromNode for Site {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let value = Site {
                addresses: t.opt(cx, "addresses").unwrap_or_default(),
                regions: t.opt(cx, "regions").unwrap_or_default(),
                monitor: t.opt(cx, "monitor"),
                weight: t.opt(cx, "weight").unwrap_or(1),
                peer: t.opt(cx, "peer"),
                redirect_host: t.opt(cx, "redirect_host"),
                link: t.opt(cx, "link"),
                name: name?,
            };
            crate::gslb::check_site(t.path(), &value, cx);
            Some(value)
        })
    }
}

string_enum!(GslbAlgorithm {
    Topology = "topology",
    RoundRobin = "round_robin",
    Weighted = "weighted",
    LeastLoad = "least_load",
    FastestResponse = "fastest_response",
    FirstAvailable = "first_available",
    Hash = "hash",
    Proximity = "proximity",
});

#[derive(Debug, Clone)]
pub struct GslbName {
    pub fqdn: String,
    pub sites: Vec<String>,
    pub algorithm: GslbAlgorithm,
    pub fallback: GslbAlgorithm,
    pub ttl: u32,
    pub answers: u32,
}

impl FromNode for GslbName {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let fqdn = t.req(cx, "fqdn");
            let sites = t.req(cx, "sites");
            let value = GslbName {
                algorithm: t.opt(cx, "algorithm").unwrap_or(GslbAlgorithm::Topology),
                fallback: t.opt(cx, "fallback").unwrap_or(GslbAlgorithm::RoundRobin),
                ttl: t.opt(cx, "ttl").unwrap_or(30),
                answers: t.opt(cx, "answers").unwrap_or(1),
                fqdn: fqdn?,
                sites: sites?,
            };
            crate::gslb::check_name(t.path(), &value, cx);
            Some(value)
        })
    }
}
