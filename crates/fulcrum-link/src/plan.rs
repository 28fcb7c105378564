//! What Fulcrum installs for its outbound link pools, computed from the configuration alone
//! (no I/O): marks, routing tables and rule priorities per link, and the nftables text.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use fulcrum_config::{
    Algorithm, Config, GatewayMember, GatewayService, L4Protocol, LinkMember, LinkNat, Monitor,
    Outbound, OutboundPersistence, OutboundRule, Pool, PoolKind, MAX_LINKS,
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The nftables table Fulcrum owns; everything in it is Fulcrum's and is replaced whole.
pub const TABLE: &str = "fulcrum_link";
/// Connection marks, firewall marks and routing table ids of links: `BASE | outbound << 8 |
/// link + 1`. "FL" in the top half, so `ip rule` and conntrack listings show whose they are.
pub const MARK_BASE: u32 = 0x464c_0000;
pub const MARK_MASK: u32 = 0xffff_0000;
/// Policy-routing rules go at this priority and above (before `main` at 32766).
pub const RULE_PREF_BASE: u32 = 9000;
/// Outbounds one instance programs (each takes 256 marks).
pub const MAX_OUTBOUNDS: usize = 64;
/// Gateway services one instance programs (their marks follow the outbounds').
pub const MAX_GATEWAY_SERVICES: usize = 64;

/// One link as the kernel sees it.
#[derive(Debug, Clone)]
pub struct LinkPlan {
    pub name: String,
    pub interface: String,
    /// The IPv4 next hop (none: the link carries IPv6 flows only).
    pub gateway: Option<Ipv4Addr>,
    /// The IPv6 next hop (none: the link carries IPv4 flows only).
    pub gateway6: Option<Ipv6Addr>,
    pub snat: Option<Ipv4Addr>,
    /// How the link's IPv6 flows leave: `snat ip6 to`, masquerade or untouched.
    pub nat6: LinkNat<Ipv6Addr>,
    /// Connection mark, firewall mark and routing table id.
    pub mark: u32,
    pub rule_pref: u32,
    /// Destinations this link reaches best (its `isp` ip_table's `cidrs` and `file`), for
    /// proximity.
    pub isp_prefixes: Vec<Ipv4Net>,
    /// The same table's `asns` and `countries` (without `geoip`) as prefixes of the address
    /// table Fulcrum ships: placed after every link's explicit prefixes, as in DNS.
    pub isp_shipped: Vec<Ipv4Net>,
    /// The IPv6 prefixes of the same table (`cidrs` and `file`, then the shipped table's).
    pub isp_prefixes6: Vec<Ipv6Net>,
    pub isp_shipped6: Vec<Ipv6Net>,
    pub monitors: Vec<Monitor>,
    pub config: LinkMember,
}

/// One `[[outbound]]` with its pool.
#[derive(Debug, Clone)]
pub struct OutboundPlan {
    pub name: String,
    pub index: usize,
    pub sources: Vec<Ipv4Net>,
    pub sources6: Vec<Ipv6Net>,
    pub pool: String,
    pub algorithm: Algorithm,
    pub busy: Option<f64>,
    pub by_source: bool,
    /// Where LAN DNS queries are redirected to (the transparent DNS proxy).
    pub dns_proxy: Option<SocketAddrV4>,
    pub dns_proxy6: Option<SocketAddrV6>,
    pub links: Vec<LinkPlan>,
    /// Set for a `[[gateway_service]]` (its members are gateways, in `links`).
    pub gateway: Option<GatewaySide>,
    /// `[[outbound.rule]]`, in file order: flows by protocol and destination port to a link.
    pub rules: Vec<PolicyRule>,
}

/// One outbound rule as the kernel gets it: (IP protocol number, port range) pairs to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// 6 (tcp) and / or 17 (udp).
    pub protocols: Vec<u8>,
    pub ports: Vec<std::ops::RangeInclusive<u16>>,
    /// An index into the outbound's `links`.
    pub link: usize,
}

/// What a gateway service adds: where flows towards the gateways come in, and whether the
/// gateway a flow arrives from can be told by its interface (then replies follow the flow
/// back through it even if the other side hashed differently).
#[derive(Debug, Clone)]
pub struct GatewaySide {
    pub interfaces: Vec<String>,
    pub learn: bool,
}

impl OutboundPlan {
    pub fn proximity(&self) -> bool {
        self.algorithm == Algorithm::Rtt
            || self
                .links
                .iter()
                .any(|l| !l.isp_prefixes.is_empty() || !l.isp_shipped.is_empty())
    }

    /// Whether IPv6 destinations have a proximity map (`rtt`'s measured /48s, isp tables).
    pub fn proximity6(&self) -> bool {
        self.algorithm == Algorithm::Rtt
            || self
                .links
                .iter()
                .any(|l| !l.isp_prefixes6.is_empty() || !l.isp_shipped6.is_empty())
    }

    /// Whether the group places IPv6 flows: IPv6 sources (outbounds), or gateways with an IPv6
    /// address (gateway services, whose flows are told by interface).
    pub fn carries_v6(&self) -> bool {
        match self.gateway {
            None => !self.sources6.is_empty(),
            Some(_) => self.links.iter().any(|l| l.gateway6.is_some()),
        }
    }

    /// Which members can carry flows of a family (`v6`): those with a next hop of it.
    pub fn family_members(&self, v6: bool) -> Vec<bool> {
        self.links
            .iter()
            .map(|l| {
                if v6 {
                    l.gateway6.is_some()
                } else {
                    l.gateway.is_some()
                }
            })
            .collect()
    }

    /// What the members are called in the API and the flow hash.
    pub fn kind(&self) -> &'static str {
        if self.gateway.is_some() {
            "gateway"
        } else {
            "link"
        }
    }

    /// The marks of this group: `base | member + 1`.
    fn mark_base(&self) -> u32 {
        MARK_BASE | ((self.index as u32) << 8)
    }
}

/// Marks of outbound links have this bit clear; gateway services' have it set.
const GATEWAY_BIT: u32 = 0x4000;
const OUTBOUND_MASK: u32 = MARK_MASK | GATEWAY_BIT;
const GROUP_MASK: u32 = 0xffff_ff00;

/// Everything for one configuration.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub outbounds: Vec<OutboundPlan>,
}

/// Mark of member `link` of group `outbound` (outbounds first, then gateway services from
/// index `MAX_OUTBOUNDS`).
pub fn mark_of(outbound: usize, link: usize) -> u32 {
    MARK_BASE | ((outbound as u32) << 8) | (link as u32 + 1)
}

/// Builds the plan; errors are what validation cannot know (an ip_table file that cannot be
/// read).
pub fn build(cfg: &Config) -> Result<Plan, Vec<String>> {
    let mut errors = Vec::new();
    let mut outbounds = Vec::new();
    if cfg.outbound.len() > MAX_OUTBOUNDS {
        return Err(vec![format!("at most {MAX_OUTBOUNDS} outbounds")]);
    }
    if cfg.gateway_services.len() > MAX_GATEWAY_SERVICES {
        return Err(vec![format!(
            "at most {MAX_GATEWAY_SERVICES} gateway services"
        )]);
    }
    for (o, ob) in cfg.outbound.iter().enumerate() {
        outbounds.extend(outbound_plan(cfg, o, ob, &mut errors));
    }
    for (s, gs) in cfg.gateway_services.iter().enumerate() {
        outbounds.extend(gateway_service_plan(
            cfg,
            MAX_OUTBOUNDS + s,
            gs,
            &mut errors,
        ));
    }
    if errors.is_empty() {
        Ok(Plan { outbounds })
    } else {
        Err(errors)
    }
}

/// Pool `name` when it is of `kind`; else an error for the section (its key and name) that
/// names it.
fn pool_of_kind<'c>(
    cfg: &'c Config,
    (key, section): (&str, &str),
    name: &str,
    kind: PoolKind,
    errors: &mut Vec<String>,
) -> Option<&'c Pool> {
    let pool = cfg.pool(name).filter(|p| p.kind == kind);
    if pool.is_none() {
        errors.push(format!("{key} {section:?}: no {kind} pool {name:?}"));
    }
    pool
}

/// The plan of `[[outbound]]` number `o`; `None` when its pool is not a link pool.
fn outbound_plan(
    cfg: &Config,
    o: usize,
    ob: &Outbound,
    errors: &mut Vec<String>,
) -> Option<OutboundPlan> {
    let pool = pool_of_kind(
        cfg,
        ("outbound", &ob.name),
        &ob.pool,
        PoolKind::Link,
        errors,
    )?;
    let links = pool
        .links
        .iter()
        .enumerate()
        .take(MAX_LINKS)
        .filter_map(|(i, l)| link_plan(cfg, pool, o, i, l, errors))
        .collect();
    Some(OutboundPlan {
        name: ob.name.clone(),
        index: o,
        sources: ob
            .sources
            .iter()
            .filter_map(|s| match s {
                IpNet::V4(n) => Some(*n),
                IpNet::V6(_) => None,
            })
            .collect(),
        sources6: ob
            .sources
            .iter()
            .filter_map(|s| match s {
                IpNet::V6(n) => Some(*n),
                IpNet::V4(_) => None,
            })
            .collect(),
        pool: pool.name.clone(),
        algorithm: pool.algorithm,
        busy: pool.busy,
        by_source: matches!(
            ob.persistence,
            Some(OutboundPersistence::BySource | OutboundPersistence::SourceIp)
        ),
        dns_proxy: ob.dns_proxy_v4(),
        dns_proxy6: ob.dns_proxy_v6(),
        rules: ob
            .rules
            .iter()
            .filter_map(|r| policy_rule(pool, r))
            .collect(),
        links,
        gateway: None,
    })
}

/// Link `i` of outbound `o`'s pool; `None` without a next hop.
fn link_plan(
    cfg: &Config,
    pool: &Pool,
    o: usize,
    i: usize,
    l: &LinkMember,
    errors: &mut Vec<String>,
) -> Option<LinkPlan> {
    let (gateway, gateway6) = (l.gateway_v4(), l.gateway_v6());
    if gateway.is_none() && gateway6.is_none() {
        errors.push(format!("link {:?}: no next hop", l.name));
        return None;
    }
    let (isp, shipped) = match &l.isp {
        Some(t) if pool.algorithm == Algorithm::Proximity => {
            match isp_prefixes(cfg, t).and_then(|p| Ok((p, isp_shipped(cfg, t)?))) {
                Ok(p) => p,
                Err(e) => {
                    errors.push(e);
                    Default::default()
                }
            }
        }
        _ => Default::default(),
    };
    // A destination of a family the link has no next hop for cannot leave by it.
    let (isp_prefixes, isp_prefixes6) = split_families(isp, gateway.is_some(), gateway6.is_some());
    let (isp_shipped, isp_shipped6) =
        split_families(shipped, gateway.is_some(), gateway6.is_some());
    let monitors = l
        .monitors
        .iter()
        .filter_map(|m| cfg.monitor(m).cloned())
        .collect();
    Some(LinkPlan {
        name: l.name.clone(),
        interface: l.interface.clone(),
        gateway,
        gateway6,
        snat: l.nat_v4().address(),
        nat6: l.nat_v6(),
        mark: mark_of(o, i),
        rule_pref: RULE_PREF_BASE + (o * MAX_LINKS + i) as u32,
        isp_prefixes,
        isp_shipped,
        isp_prefixes6,
        isp_shipped6,
        monitors,
        config: l.clone(),
    })
}

/// An `[[outbound.rule]]` as the kernel gets it; `None` when it names no link of the pool.
fn policy_rule(pool: &Pool, r: &OutboundRule) -> Option<PolicyRule> {
    let link = pool.links.iter().position(|l| l.name == r.link)?;
    let protocols = if r.protocol.is_empty() {
        vec![6, 17]
    } else {
        r.protocol
            .iter()
            .map(|p| match p {
                L4Protocol::Tcp => 6,
                L4Protocol::Udp => 17,
            })
            .collect()
    };
    let ports = if r.destination_port.is_empty() {
        vec![0..=u16::MAX]
    } else {
        r.destination_port.clone()
    };
    Some(PolicyRule {
        protocols,
        ports,
        link,
    })
}

/// The plan of a `[[gateway_service]]` as group `o`; `None` when its pool is not a gateway
/// pool.
fn gateway_service_plan(
    cfg: &Config,
    o: usize,
    gs: &GatewayService,
    errors: &mut Vec<String>,
) -> Option<OutboundPlan> {
    let section = ("gateway_service", gs.name.as_str());
    let pool = pool_of_kind(cfg, section, &gs.pool, PoolKind::Gateway, errors)?;
    let links: Vec<LinkPlan> = pool
        .gateways
        .iter()
        .enumerate()
        .take(MAX_LINKS)
        .filter_map(|(i, g)| gateway_plan(cfg, o, i, g, errors))
        .collect();
    let mut ifs: Vec<&str> = links.iter().map(|l| l.interface.as_str()).collect();
    ifs.sort_unstable();
    ifs.dedup();
    let learn =
        ifs.len() == links.len() && !links.iter().any(|l| gs.interfaces.contains(&l.interface));
    Some(OutboundPlan {
        name: gs.name.clone(),
        index: o,
        sources: Vec::new(),
        sources6: Vec::new(),
        pool: pool.name.clone(),
        algorithm: pool.algorithm,
        busy: None,
        by_source: false,
        dns_proxy: None,
        dns_proxy6: None,
        links,
        rules: Vec::new(),
        gateway: Some(GatewaySide {
            interfaces: gs.interfaces.clone(),
            learn,
        }),
    })
}

/// Gateway `i` of group `o`, as a link; `None` without an interface.
fn gateway_plan(
    cfg: &Config,
    o: usize,
    i: usize,
    g: &GatewayMember,
    errors: &mut Vec<String>,
) -> Option<LinkPlan> {
    let Some(interface) = g.interface.clone() else {
        errors.push(format!("gateway {}: an interface is needed", g.address));
        return None;
    };
    let (gateway, gateway6) = (g.address_v4(), g.address_v6());
    let name = g.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
    Some(LinkPlan {
        config: LinkMember {
            name: name.clone(),
            interface: interface.clone(),
            gateway: g.address,
            gateway6: g.address6,
            snat: None,
            snat6: None,
            bandwidth: None,
            isp: None,
            resolver: None,
            monitors: g.monitors.clone(),
            weight: g.weight,
            priority: 0,
            state: g.state,
        },
        name,
        interface,
        gateway,
        gateway6,
        snat: None,
        nat6: LinkNat::Off,
        mark: mark_of(o, i),
        rule_pref: RULE_PREF_BASE + (o * MAX_LINKS + i) as u32,
        isp_prefixes: Vec::new(),
        isp_shipped: Vec::new(),
        isp_prefixes6: Vec::new(),
        isp_shipped6: Vec::new(),
        monitors: g
            .monitors
            .iter()
            .filter_map(|m| cfg.monitor(m).cloned())
            .collect(),
    })
}

/// The prefixes of ip_table `name`: its `cidrs`, and the lines of its `file` (one prefix a
/// line, `#` comments).
fn isp_prefixes(cfg: &Config, name: &str) -> Result<Vec<IpNet>, String> {
    let Some(t) = cfg.ip_tables.iter().find(|t| t.name == name) else {
        return Err(format!("no ip_table {name:?}"));
    };
    let mut out: Vec<IpNet> = t.cidrs.iter().map(|c| c.trunc()).collect();
    if let Some(path) = &t.file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("ip_table {name:?}: cannot read {}: {e}", path.display()))?;
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match fulcrum_config::parse_prefix(line) {
                Ok(n) => out.push(n),
                Err(e) => return Err(format!("ip_table {name:?}: {line:?}: {e}")),
            }
        }
    }
    Ok(out)
}

/// Splits prefixes by family, each merged (nftables refuses overlapping intervals in a set); a
/// family the link has no next hop for (`v4`, `v6` false) is left out.
fn split_families(nets: Vec<IpNet>, v4: bool, v6: bool) -> (Vec<Ipv4Net>, Vec<Ipv6Net>) {
    let mut four = Vec::new();
    let mut six = Vec::new();
    for n in nets {
        match n {
            IpNet::V4(n) if v4 => four.push(n),
            IpNet::V6(n) if v6 => six.push(n),
            _ => {}
        }
    }
    (Ipv4Net::aggregate(&four), Ipv6Net::aggregate(&six))
}

/// The prefixes the address table Fulcrum ships gives ip_table `name`'s `asns`, and its
/// `countries` when it has no `geoip` (a GeoIP database cannot be listed as prefixes).
fn isp_shipped(cfg: &Config, name: &str) -> Result<Vec<IpNet>, String> {
    let Some(t) = cfg.ip_tables.iter().find(|t| t.name == name) else {
        return Err(format!("no ip_table {name:?}"));
    };
    let countries: &[String] = if t.geoip.is_some() { &[] } else { &t.countries };
    if t.asns.is_empty() && countries.is_empty() {
        return Ok(Vec::new());
    }
    let data = fulcrum_ipdata::shipped()
        .map_err(|e| format!("ip_table {name:?}: the address table Fulcrum ships: {e}"))?;
    let mut out = data.asn_prefixes(&t.asns);
    out.extend(data.country_prefixes(countries));
    Ok(out)
}

/// The slot table of an outbound: for each slot, the index of its link (`None` = no link has a
/// share; new flows then follow the main routing table).
pub type Slots = Vec<u32>;

/// A group's slot tables, from the one scheduler: `v4` for every flow when each member carries
/// both families (or the group places one family only); else `v4` over the members with an
/// IPv4 next hop and `v6` over those with an IPv6 one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSlots {
    pub v4: Slots,
    pub v6: Option<Slots>,
}

impl From<Slots> for GroupSlots {
    fn from(v4: Slots) -> Self {
        GroupSlots { v4, v6: None }
    }
}

fn elements<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let mut s = String::new();
    for (k, it) in items.enumerate() {
        if k > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{it}");
    }
    s
}

fn slot_elements(o: &OutboundPlan, slots: &[u32]) -> String {
    elements(slots.iter().enumerate().filter_map(|(k, &l)| {
        o.links
            .get(l as usize)
            .map(|l| format!("{k} : {:#x}", l.mark))
    }))
}

/// The elements of an outbound's policy map (`inet_proto . inet_service : mark`): the rules of
/// links that are up, in order, each (protocol, port range) less what an earlier rule took,
/// since the kernel's interval map holds no overlap and the first rule must win.
fn policy_elements(o: &OutboundPlan, up: &[bool]) -> String {
    let mut taken: Vec<(u8, u16, u16)> = Vec::new();
    let mut parts = Vec::new();
    for r in &o.rules {
        let (Some(l), true) = (
            o.links.get(r.link),
            up.get(r.link).copied().unwrap_or(false),
        ) else {
            continue;
        };
        for &proto in &r.protocols {
            for range in &r.ports {
                let mut free = vec![(*range.start(), *range.end())];
                for &(p, a, b) in &taken {
                    if p != proto {
                        continue;
                    }
                    free = free
                        .into_iter()
                        .flat_map(|(x, y)| {
                            let mut left = Vec::new();
                            if b < x || a > y {
                                left.push((x, y));
                            } else {
                                if a > x {
                                    left.push((x, a - 1));
                                }
                                if b < y {
                                    left.push((b + 1, y));
                                }
                            }
                            left
                        })
                        .collect();
                }
                let name = if proto == 6 { "tcp" } else { "udp" };
                for (x, y) in free {
                    taken.push((proto, x, y));
                    let ports = if x == y {
                        x.to_string()
                    } else {
                        format!("{x}-{y}")
                    };
                    parts.push(format!("{name} . {ports} : {:#x}", l.mark));
                }
            }
        }
    }
    parts.join(", ")
}

/// Destination prefixes → link: the measured nearest link per prefix (`rtt`), then the static
/// `isp` tables.
pub type Nearest = Vec<(IpNet, usize)>;

/// The addresses `p` covers, as integers (the key of `Disjoint`).
fn range(p: &IpNet) -> (u128, u128) {
    match p {
        IpNet::V4(p) => (
            u128::from(u32::from(p.network())),
            u128::from(u32::from(p.broadcast())),
        ),
        IpNet::V6(p) => (u128::from(p.network()), u128::from(p.broadcast())),
    }
}

/// The prefixes covering `start..=end`, addresses of the family `v6` says as `range` gives them.
fn cover(v6: bool, start: u128, end: u128) -> Box<dyn Iterator<Item = IpNet>> {
    if v6 {
        let (a, b) = (Ipv6Addr::from(start), Ipv6Addr::from(end));
        Box::new(ipnet::Ipv6Subnets::new(a, b, 0).map(IpNet::V6))
    } else {
        let (a, b) = (Ipv4Addr::from(start as u32), Ipv4Addr::from(end as u32));
        Box::new(ipnet::Ipv4Subnets::new(a, b, 0).map(IpNet::V4))
    }
}

/// A link's explicit prefixes and its shipped table's, of the family `v6` says.
fn isp_tables(l: &LinkPlan, v6: bool) -> [Vec<IpNet>; 2] {
    if v6 {
        [&l.isp_prefixes6, &l.isp_shipped6].map(|t| t.iter().map(|&p| IpNet::V6(p)).collect())
    } else {
        [&l.isp_prefixes, &l.isp_shipped].map(|t| t.iter().map(|&p| IpNet::V4(p)).collect())
    }
}

/// The proximity map of one family (IPv6 when `v6`): the measured prefixes (`rtt`), every
/// link's explicit prefixes, then the shipped table's.
fn proximity_elements(
    o: &OutboundPlan,
    up: &[bool],
    nearest: &[(IpNet, usize)],
    v6: bool,
) -> String {
    // A destination in two links' tables goes to the first that is up: measured prefixes,
    // then every link's explicit prefixes, then the shipped table's (thousands for a country).
    let mut seen = Disjoint::default();
    let mut parts = Vec::new();
    let is_up = |i: usize| up.get(i).copied().unwrap_or(false);
    let of_family = |p: &IpNet| matches!(p, IpNet::V6(_)) == v6;
    for (p, i) in nearest.iter().filter(|(p, _)| of_family(p)) {
        if let (Some(l), true) = (o.links.get(*i), is_up(*i)) {
            if seen.insert(range(p)) {
                parts.push(format!("{p} : {:#x}", l.mark));
            }
        }
    }
    let links: Vec<_> = o
        .links
        .iter()
        .enumerate()
        .filter(|(i, _)| is_up(*i))
        .map(|(_, l)| (l.mark, isp_tables(l, v6)))
        .collect();
    for (mark, [explicit, _]) in &links {
        for p in explicit {
            if seen.insert(range(p)) {
                parts.push(format!("{p} : {mark:#x}"));
            }
        }
    }
    // A shipped prefix keeps what the prefixes before it left free: as the longest prefix
    // wins in DNS, an operator's /24 inside an AS's /12 takes the /24 only.
    for (mark, [_, shipped]) in &links {
        for p in shipped {
            for (start, end) in seen.insert_free(range(p)) {
                for free in cover(v6, start, end) {
                    parts.push(format!("{free} : {mark:#x}"));
                }
            }
        }
    }
    parts.join(", ")
}

/// Disjoint address intervals (start → end, IPv4 or IPv6 addresses as integers), for refusing
/// a prefix that overlaps one already taken in O(log n): nftables refuses overlapping intervals
/// in one map.
#[derive(Default)]
struct Disjoint(std::collections::BTreeMap<u128, u128>);

impl Disjoint {
    /// Takes `[start, end]` unless it overlaps an interval taken before; says whether it did.
    fn insert(&mut self, (start, end): (u128, u128)) -> bool {
        let before = self.0.range(..=end).next_back();
        if before.is_some_and(|(_, &e)| e >= start) {
            return false;
        }
        self.0.insert(start, end);
        true
    }

    /// Takes the parts of `[start, end]` no interval taken before covers, and returns them.
    fn insert_free(&mut self, (start, end): (u128, u128)) -> Vec<(u128, u128)> {
        let mut gaps = Vec::new();
        let mut cursor = Some(start);
        let first = self.0.range(..start).next_back().map(|(&s, &e)| (s, e));
        let overlapping = first
            .into_iter()
            .chain(self.0.range(start..=end).map(|(&s, &e)| (s, e)));
        for (s, e) in overlapping {
            let Some(c) = cursor else { break };
            if e < c {
                continue;
            }
            if s > c {
                gaps.push((c, s - 1));
            }
            cursor = e.checked_add(1).filter(|&n| n <= end);
        }
        if let Some(c) = cursor {
            gaps.push((c, end));
        }
        for &(s, e) in &gaps {
            self.0.insert(s, e);
        }
        gaps
    }
}

/// The whole table (the nft session replaces the earlier one in the same transaction, so
/// restart and reload do not duplicate). `slots[g]` and `up[g]` are per group, in plan order.
/// `flags owner`: the kernel deletes the table when this process's netlink socket closes,
/// however the process ends (nft.rs).
pub fn render_table(
    plan: &Plan,
    slots: &[GroupSlots],
    up: &[Vec<bool>],
    nearest: &[Nearest],
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "table inet {TABLE} {{\n  flags owner;");
    let none = GroupSlots::default();
    for (g, o) in plan.outbounds.iter().enumerate() {
        let slots = slots.get(g).unwrap_or(&none);
        let up = up.get(g).map_or(&[][..], |v| v);
        let nearest = nearest.get(g).map_or(&[][..], |v| v);
        render_group_maps(&mut s, o, slots, up, nearest);
    }
    render_prerouting(&mut s, plan);
    for (g, o) in plan.outbounds.iter().enumerate() {
        let slots = slots.get(g).unwrap_or(&none);
        match &o.gateway {
            None => render_choose_chain(&mut s, o, slots),
            Some(_) => render_gateway_chain(&mut s, o, slots),
        }
    }
    render_redirect_dns(&mut s, plan);
    render_dns_proxy_input(&mut s, plan);
    render_postrouting(&mut s, plan);
    let _ = writeln!(s, "}}");
    s
}

/// ` elements = { ELEMENTS };`, or nothing for none (nft refuses an empty list).
fn set_elements(el: &str) -> String {
    if el.is_empty() {
        String::new()
    } else {
        format!(" elements = {{ {el} }}")
    }
}

/// `  map NAME { DECLARATION; elements = { ELEMENTS } }`, without `elements` when there are
/// none.
fn render_map(s: &mut String, head: &str, el: &str) {
    let _ = write!(s, "  map {head};");
    if !el.is_empty() {
        let _ = write!(s, " elements = {{ {el} }}");
    }
    let _ = writeln!(s, " }}");
}

/// One group's slot map, counters, and the sets and maps its chain looks up.
fn render_group_maps(
    s: &mut String,
    o: &OutboundPlan,
    slots: &GroupSlots,
    up: &[bool],
    nearest: &[(IpNet, usize)],
) {
    let k = o.index;
    // The key type only sets the width (32-bit integer) of the slot number.
    render_map(
        s,
        &format!("slots_{k} {{ typeof numgen inc mod 2 : ct mark"),
        &slot_elements(o, &slots.v4),
    );
    if let Some(v6) = &slots.v6 {
        render_map(
            s,
            &format!("slots6_{k} {{ typeof numgen inc mod 2 : ct mark"),
            &slot_elements(o, v6),
        );
    }
    for l in &o.links {
        let _ = writeln!(s, "  counter flows_{k}_{} {{ }}", l.mark & 0xff);
    }
    if o.dns_proxy.is_some() || o.dns_proxy6.is_some() {
        let _ = writeln!(s, "  counter {} {{ }}", dns_refused_counter(k));
    }
    match &o.gateway {
        None => {
            let _ = writeln!(
                s,
                "  set src_{k} {{ type ipv4_addr; flags interval;{} }}",
                set_elements(&elements(o.sources.iter()))
            );
            if !o.sources6.is_empty() {
                let _ = writeln!(
                    s,
                    "  set src6_{k} {{ type ipv6_addr; flags interval;{} }}",
                    set_elements(&elements(o.sources6.iter()))
                );
            }
            if !o.rules.is_empty() {
                render_map(
                    s,
                    &format!("policy_{k} {{ type inet_proto . inet_service : mark; flags interval"),
                    &policy_elements(o, up),
                );
            }
            if o.proximity() {
                render_map(
                    s,
                    &format!("prox_{k} {{ type ipv4_addr : mark; flags interval"),
                    &proximity_elements(o, up, nearest, false),
                );
            }
            if o.proximity6() && !o.sources6.is_empty() {
                render_map(
                    s,
                    &format!("prox6_{k} {{ type ipv6_addr : mark; flags interval"),
                    &proximity_elements(o, up, nearest, true),
                );
            }
        }
        Some(side) => {
            let _ = writeln!(
                s,
                "  set in_{k} {{ type ifname; elements = {{ {} }} }}",
                elements(side.interfaces.iter().map(|i| format!("\"{i}\"")))
            );
            if side.learn {
                let _ = writeln!(
                    s,
                    "  map from_{k} {{ type ifname : mark; elements = {{ {} }} }}",
                    elements(
                        o.links
                            .iter()
                            .map(|l| format!("\"{}\" : {:#x}", l.interface, l.mark))
                    )
                );
            }
        }
    }
}

/// Every packet of a marked outbound flow takes its link (the firewall mark the routing rules
/// match): only the original direction, so replies coming back in route to the LAN by `main`.
fn render_prerouting(s: &mut String, plan: &Plan) {
    let _ = writeln!(
        s,
        "  chain prerouting {{\n    type filter hook prerouting priority mangle; policy accept;\n    ct direction original ct mark and {OUTBOUND_MASK:#x} == {MARK_BASE:#x} meta mark set ct mark return"
    );
    for o in &plan.outbounds {
        let k = o.index;
        match &o.gateway {
            None => {
                if !o.sources.is_empty() {
                    let _ = writeln!(
                        s,
                        "    ct state new ip saddr @src_{k} ip daddr != @src_{k} fib daddr type != {{ local, broadcast, multicast }} jump choose_{k}"
                    );
                }
                if !o.sources6.is_empty() {
                    let _ = writeln!(
                        s,
                        "    ct state new ip6 saddr @src6_{k} ip6 daddr != @src6_{k} fib daddr type != {{ local, multicast }} jump choose_{k}"
                    );
                }
            }
            Some(side) => {
                let base = o.mark_base();
                if side.learn {
                    // A flow first seen coming out of a gateway goes back through it.
                    let _ = writeln!(
                        s,
                        "    iifname != @in_{k} ct mark and {GROUP_MASK:#x} != {base:#x} ct mark set iifname map @from_{k}"
                    );
                }
                let _ = writeln!(
                    s,
                    "    iifname @in_{k} fib daddr type != {{ local, broadcast, multicast }} jump gateway_{k}"
                );
            }
        }
    }
    let _ = writeln!(s, "  }}");
}

/// How a new flow of outbound `o` gets its link.
fn render_choose_chain(s: &mut String, o: &OutboundPlan, slots: &GroupSlots) {
    let k = o.index;
    let _ = writeln!(s, "  chain choose_{k} {{");
    // Outbound rules first (protocol and destination port), then proximity, then the slots:
    // each later step only for a flow no earlier one marked.
    let unmarked = if o.rules.is_empty() {
        String::new()
    } else {
        let _ = writeln!(s, "    ct mark set meta l4proto . th dport map @policy_{k}");
        // A rule's link without a next hop of the flow's family cannot carry it: the flow is
        // placed as if no rule matched.
        for (nfproto, v6) in [("ipv4", false), ("ipv6", true)] {
            let lacking: Vec<String> = o
                .links
                .iter()
                .zip(o.family_members(v6))
                .filter(|(_, has)| !has)
                .map(|(l, _)| format!("{:#x}", l.mark))
                .collect();
            if !lacking.is_empty() {
                let _ = writeln!(
                    s,
                    "    meta nfproto {nfproto} ct mark {{ {} }} ct mark set 0",
                    lacking.join(", ")
                );
            }
        }
        format!("ct mark and {MARK_MASK:#x} != {MARK_BASE:#x} ")
    };
    if o.proximity() {
        let _ = writeln!(s, "    {unmarked}ct mark set ip daddr map @prox_{k}");
    }
    if o.proximity6() && !o.sources6.is_empty() {
        let _ = writeln!(s, "    {unmarked}ct mark set ip6 daddr map @prox6_{k}");
    }
    let n = slots.v4.len().max(1);
    let unplaced = format!("ct mark and {MARK_MASK:#x} != {MARK_BASE:#x}");
    if !o.by_source && slots.v6.is_none() {
        // Consecutive new flows walk the slot table: each link gets exactly its share over
        // every pass, with no hashing bias. One rule for both families, so one count.
        let _ = writeln!(
            s,
            "    {unplaced} ct mark set numgen inc mod {n} map @slots_{k}"
        );
    } else {
        let key = |n: usize, saddr: &str| {
            if o.by_source {
                format!("jhash {saddr} saddr mod {n} seed 0x464c")
            } else {
                format!("numgen inc mod {n}")
            }
        };
        if !o.sources.is_empty() {
            let _ = writeln!(
                s,
                "    meta nfproto ipv4 {unplaced} ct mark set {} map @slots_{k}",
                key(n, "ip")
            );
        }
        if !o.sources6.is_empty() {
            let (map, n6) = match &slots.v6 {
                Some(v6) => (format!("slots6_{k}"), v6.len().max(1)),
                None => (format!("slots_{k}"), n),
            };
            let _ = writeln!(
                s,
                "    meta nfproto ipv6 {unplaced} ct mark set {} map @{map}",
                key(n6, "ip6")
            );
        }
    }
    for l in &o.links {
        let _ = writeln!(
            s,
            "    ct mark {:#x} counter name flows_{k}_{} meta mark set ct mark",
            l.mark,
            l.mark & 0xff
        );
    }
    let _ = writeln!(s, "  }}");
}

/// How a flow through gateway service `o` gets its gateway.
fn render_gateway_chain(s: &mut String, o: &OutboundPlan, slots: &GroupSlots) {
    let k = o.index;
    let base = o.mark_base();
    let n = slots.v4.len().max(1);
    let _ = writeln!(s, "  chain gateway_{k} {{");
    // symhash: the same value for both directions of a flow, so the other side of the
    // sandwich picks the same slot for the replies. Both families, one table, unless the
    // gateways differ by family.
    match &slots.v6 {
        None => {
            let _ = writeln!(
                s,
                "    ct mark and {GROUP_MASK:#x} != {base:#x} ct mark set symhash mod {n} map @slots_{k}"
            );
        }
        Some(v6) => {
            let _ = writeln!(
                s,
                "    meta nfproto ipv4 ct mark and {GROUP_MASK:#x} != {base:#x} ct mark set symhash mod {n} map @slots_{k}\n    meta nfproto ipv6 ct mark and {GROUP_MASK:#x} != {base:#x} ct mark set symhash mod {} map @slots6_{k}",
                v6.len().max(1)
            );
        }
    }
    for l in &o.links {
        let _ = writeln!(
            s,
            "    ct mark {:#x} ct state new counter name flows_{k}_{}",
            l.mark,
            l.mark & 0xff
        );
    }
    let _ = writeln!(
        s,
        "    ct mark and {GROUP_MASK:#x} == {base:#x} meta mark set ct mark"
    );
    let _ = writeln!(s, "  }}");
}

/// The transparent DNS proxy: LAN queries to any resolver go to Fulcrum instead.
fn render_redirect_dns(s: &mut String, plan: &Plan) {
    let _ = writeln!(
        s,
        "  chain redirect_dns {{\n    type nat hook prerouting priority dstnat; policy accept;"
    );
    for o in &plan.outbounds {
        if let Some(p) = o.dns_proxy {
            let k = o.index;
            // UDP and TCP: a client sent to TCP by a truncated answer is proxied the same way.
            let _ = writeln!(
                s,
                "    ip saddr @src_{k} ip daddr != {ip} meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {p}",
                ip = p.ip()
            );
        }
        if let Some(p) = o.dns_proxy6.filter(|_| !o.sources6.is_empty()) {
            let k = o.index;
            let _ = writeln!(
                s,
                "    ip6 saddr @src6_{k} ip6 daddr != {ip} meta l4proto {{ tcp, udp }} th dport 53 dnat ip6 to {p}",
                ip = p.ip()
            );
        }
    }
    let _ = writeln!(s, "  }}");
}

/// The proxy serves the LAN only: a query to its address is taken from `sources` arriving on
/// the interface that leads back to them (a WAN packet with a LAN source address fails the
/// reverse-path lookup); every other one is dropped and counted.
fn render_dns_proxy_input(s: &mut String, plan: &Plan) {
    let _ = writeln!(
        s,
        "  chain dns_proxy_input {{\n    type filter hook input priority filter; policy accept;"
    );
    for o in &plan.outbounds {
        if let Some(p) = o.dns_proxy {
            let _ = writeln!(
                s,
                "    ip daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} ip saddr @src_{k} fib saddr . iif oif exists accept",
                ip = p.ip(),
                port = p.port(),
                k = o.index
            );
        }
        if let Some(p) = o.dns_proxy6.filter(|_| !o.sources6.is_empty()) {
            let _ = writeln!(
                s,
                "    ip6 daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} ip6 saddr @src6_{k} fib saddr . iif oif exists accept",
                ip = p.ip(),
                port = p.port(),
                k = o.index
            );
        }
    }
    for o in &plan.outbounds {
        let c = dns_refused_counter(o.index);
        if let Some(p) = o.dns_proxy {
            let _ = writeln!(
                s,
                "    ip daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} counter name {c} drop",
                ip = p.ip(),
                port = p.port(),
            );
        }
        if let Some(p) = o.dns_proxy6 {
            let _ = writeln!(
                s,
                "    ip6 daddr {ip} meta l4proto {{ tcp, udp }} th dport {port} counter name {c} drop",
                ip = p.ip(),
                port = p.port(),
            );
        }
    }
    let _ = writeln!(s, "  }}");
}

/// Source NAT of each link's flows to its `snat` address, or the interface's own.
fn render_postrouting(s: &mut String, plan: &Plan) {
    let _ = writeln!(
        s,
        "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;"
    );
    // This host's own packets (link probes, the DNS proxy) leave from the address they were
    // sent from: on the master that is the SNAT address they bind to; on the backup of a
    // gateway pair, where the SNAT address is a VIP it does not hold, the interface's own, so
    // the replies to its probes come back to it and not to the master. Only a packet with a
    // socket has an owner: forwarded ones skip this rule.
    let _ = writeln!(s, "    meta skuid >= 0 accept");
    for o in plan.outbounds.iter().filter(|o| o.gateway.is_none()) {
        for l in &o.links {
            let head = format!("meta mark {:#x} oifname \"{}\"", l.mark, l.interface);
            if l.gateway.is_some() && !o.sources.is_empty() {
                let _ = match l.snat {
                    Some(a) => writeln!(s, "    {head} snat ip to {a}"),
                    None => writeln!(s, "    meta nfproto ipv4 {head} masquerade"),
                };
            }
            if l.gateway6.is_some() && !o.sources6.is_empty() {
                let _ = match l.nat6 {
                    LinkNat::To(a) => writeln!(s, "    {head} snat ip6 to {a}"),
                    LinkNat::Masquerade => writeln!(s, "    meta nfproto ipv6 {head} masquerade"),
                    // The LAN's prefix is routed: its flows leave with their own source.
                    LinkNat::Off => Ok(()),
                };
            }
        }
    }
    let _ = writeln!(s, "  }}");
}

/// The named counter of the DNS queries outbound `index`'s proxy refused (not from its LAN).
pub fn dns_refused_counter(index: usize) -> String {
    format!("dns_refused_{index}")
}

/// Empties map `name` and adds `el` (nftables refuses an empty element list).
fn replace_map(s: &mut String, name: &str, el: &str) {
    let _ = writeln!(s, "flush map inet {TABLE} {name}");
    if !el.is_empty() {
        let _ = writeln!(s, "add element inet {TABLE} {name} {{ {el} }}");
    }
}

/// Rewrites the slot and proximity maps only (weights, health or load changed); the chains,
/// counters and flows stay.
pub fn render_maps(
    plan: &Plan,
    slots: &[GroupSlots],
    up: &[Vec<bool>],
    nearest: &[Nearest],
) -> String {
    let mut s = String::new();
    let none = GroupSlots::default();
    for (g, o) in plan.outbounds.iter().enumerate() {
        let k = o.index;
        let group = slots.get(g).unwrap_or(&none);
        let tables = [("slots", Some(&group.v4)), ("slots6", group.v6.as_ref())];
        for (name, table) in tables {
            let Some(table) = table else { continue };
            replace_map(&mut s, &format!("{name}_{k}"), &slot_elements(o, table));
        }
        let up = up.get(g).map_or(&[][..], |v| v);
        let nearest = nearest.get(g).map_or(&[][..], |v| v);
        if !o.rules.is_empty() && o.gateway.is_none() {
            replace_map(&mut s, &format!("policy_{k}"), &policy_elements(o, up));
        }
        if o.proximity() {
            let el = proximity_elements(o, up, nearest, false);
            replace_map(&mut s, &format!("prox_{k}"), &el);
        }
        if o.proximity6() && !o.sources6.is_empty() {
            let el = proximity_elements(o, up, nearest, true);
            replace_map(&mut s, &format!("prox6_{k}"), &el);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const CFG: &str = r#"
[[ip_table]]
name = "isp-b"
cidrs = ["198.19.64.0/24", "198.19.64.128/25"]

[[pool]]
name = "uplinks"
kind = "link"
algorithm = "proximity"
[[pool.member]]
name = "a"
interface = "wan0"
gateway = "198.18.1.1"
snat = "198.18.1.2"
weight = 3
[[pool.member]]
name = "b"
interface = "wan1"
gateway = "198.18.2.1"
isp = "isp-b"

[[outbound]]
name = "lan"
sources = ["198.18.100.0/24"]
pool = "uplinks"
"#;

    #[test]
    fn plan_and_table_text() {
        let cfg = fulcrum_config::parse(CFG, "t.toml", Path::new(".")).unwrap();
        let plan = build(&cfg).unwrap();
        let o = &plan.outbounds[0];
        assert_eq!(o.links[0].mark, 0x464c_0001);
        assert_eq!(o.links[1].mark, 0x464c_0002);
        assert_eq!(o.links[1].isp_prefixes.len(), 1, "overlaps merged");
        let t = render_table(&plan, &[vec![0, 1, 0].into()], &[vec![true, true]], &[]);
        assert!(
            t.starts_with("table inet fulcrum_link {\n  flags owner;\n"),
            "{t}"
        );
        assert!(
            t.contains("elements = { 0 : 0x464c0001, 1 : 0x464c0002, 2 : 0x464c0001 }"),
            "{t}"
        );
        assert!(t.contains("198.19.64.0/24 : 0x464c0002"), "{t}");
        assert!(t.contains("numgen inc mod 3 map @slots_0"), "{t}");
        assert!(t.contains("oifname \"wan0\" snat ip to 198.18.1.2"), "{t}");
        // This host's own packets are not rewritten, and that rule comes first.
        let own = t.find("meta skuid >= 0 accept").expect("own packets rule");
        assert!(own < t.find("snat ip to").unwrap_or(0), "{t}");
        assert!(t.contains("oifname \"wan1\" masquerade"), "{t}");
        // A link that is down leaves the proximity map.
        let m = render_maps(&plan, &[vec![0, 0, 0].into()], &[vec![true, false]], &[]);
        assert!(!m.contains("prox_0 {"), "{m}");
        assert!(m.contains("flush map inet fulcrum_link prox_0"), "{m}");
    }

    #[test]
    fn isp_tables_by_asn_come_from_the_shipped_table_after_explicit_prefixes() {
        let data = fulcrum_ipdata::shipped().unwrap();
        let telecom: Vec<Ipv4Net> = data
            .asn_prefixes(&[4134])
            .into_iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V4(n) => Some(n),
                ipnet::IpNet::V6(_) => None,
            })
            .collect();
        // The operator's /24 inside AS4134's first prefix goes to link b.
        let wide = telecom.iter().find(|n| n.prefix_len() <= 22).unwrap();
        let office = Ipv4Net::new(wide.network(), 24).unwrap();
        let cfg = CFG
            .replace(
                "cidrs = [\"198.19.64.0/24\", \"198.19.64.128/25\"]",
                &format!("cidrs = [\"{office}\"]\n\n[[ip_table]]\nname = \"ct\"\nasns = [4134]"),
            )
            .replace("weight = 3", "weight = 3\nisp = \"ct\"");
        let cfg_text = cfg;
        let cfg = fulcrum_config::parse(&cfg_text, "t.toml", Path::new(".")).unwrap();
        let plan = build(&cfg).unwrap();
        let o = &plan.outbounds[0];
        assert!(o.links[0].isp_prefixes.is_empty());
        assert!(o.links[0].isp_shipped.len() >= Ipv4Net::aggregate(&telecom).len() / 2);
        // An IPv4-only line takes none of the AS's IPv6 prefixes; with an IPv6 next hop it
        // takes them all.
        assert!(o.links[0].isp_shipped6.is_empty());
        let telecom6 = data
            .asn_prefixes(&[4134])
            .into_iter()
            .filter(|n| matches!(n, ipnet::IpNet::V6(_)))
            .count();
        assert!(telecom6 > 0, "the shipped table has AS4134's IPv6 prefixes");
        let dual = cfg_text.replace(
            "snat = \"198.18.1.2\"",
            "snat = \"198.18.1.2\"\ngateway6 = \"fd00:1::1\"",
        );
        let dual = fulcrum_config::parse(&dual, "t.toml", Path::new(".")).unwrap();
        let plan6 = build(&dual).unwrap();
        assert!(!plan6.outbounds[0].links[0].isp_shipped6.is_empty());
        let m = render_maps(&plan, &[vec![0, 1, 0].into()], &[vec![true, true]], &[]);
        let (a, b) = (o.links[0].mark, o.links[1].mark);
        assert!(
            m.contains(&format!("{office} : {b:#x}")),
            "the operator's prefix first"
        );
        // The rest of the wide prefix still leaves by link a: its next /24, say.
        let next = Ipv4Net::new((u32::from(office.network()) + 256).into(), 24).unwrap();
        let by_a: Vec<Ipv4Net> = m
            .split(", ")
            .filter(|e| e.ends_with(&format!(" : {a:#x}")))
            .filter_map(|e| e.split(' ').next()?.rsplit('{').next()?.trim().parse().ok())
            .collect();
        assert!(by_a.iter().any(|n| n.contains(&next)), "{next} by link a");
        assert!(
            !by_a.iter().any(|n| n.contains(&office.network())),
            "{office} not by a"
        );
        // No two elements overlap (nftables refuses that).
        let mut all: Vec<Ipv4Net> = m
            .split(", ")
            .filter_map(|e| e.split(' ').next()?.rsplit('{').next()?.trim().parse().ok())
            .collect();
        all.sort();
        assert!(
            all.windows(2).all(|w| !w[0].contains(&w[1].network())),
            "overlap"
        );
    }

    /// `[[outbound.rule]]`: a policy map ahead of proximity and the slots, first match winning
    /// over an overlapping later rule, and only the rules of links that are up.
    #[test]
    fn outbound_rules_come_first_and_skip_links_that_are_down() {
        let text = format!(
            "{CFG}[[outbound.rule]]\nprotocol = \"tcp\"\ndestination_port = [443, \"8000-8099\"]\nlink = \"b\"\n\
             [[outbound.rule]]\ndestination_port = \"8050-9000\"\nlink = \"a\"\n"
        );
        let cfg = fulcrum_config::parse(&text, "t.toml", Path::new(".")).unwrap();
        let plan = build(&cfg).unwrap();
        let t = render_table(&plan, &[vec![0, 1].into()], &[vec![true, true]], &[]);
        assert!(
            t.contains("map policy_0 { type inet_proto . inet_service : mark; flags interval; elements = { tcp . 443 : 0x464c0002, tcp . 8000-8099 : 0x464c0002, tcp . 8100-9000 : 0x464c0001, udp . 8050-9000 : 0x464c0001 } }"),
            "{t}"
        );
        let policy = t
            .find("ct mark set meta l4proto . th dport map @policy_0")
            .expect("the policy line");
        let prox = t
            .find("ct mark and 0xffff0000 != 0x464c0000 ct mark set ip daddr map @prox_0")
            .expect("proximity only for unmarked flows");
        assert!(policy < prox, "{t}");
        // b down: its rule leaves the map, and a's takes the whole of its ranges.
        let m = render_maps(&plan, &[vec![0].into()], &[vec![true, false]], &[]);
        assert!(m.contains("flush map inet fulcrum_link policy_0"), "{m}");
        assert!(
            m.contains("add element inet fulcrum_link policy_0 { tcp . 8050-9000 : 0x464c0001, udp . 8050-9000 : 0x464c0001 }"),
            "{m}"
        );
        // A link the pool does not have is refused by the check.
        let bad = format!("{CFG}[[outbound.rule]]\nlink = \"c\"\n");
        let e = fulcrum_config::parse(&bad, "t.toml", Path::new("."))
            .expect_err("unknown link")
            .messages();
        assert!(
            e.iter().any(|e| e.contains("outbound[0].rule[0].link: pool \"uplinks\" has no link named \"c\"; its links: a, b")),
            "{e:?}"
        );
    }

    /// IPv6 beside IPv4: the sources, proximity map, slot table of the links that have an IPv6
    /// next hop (b has none), the DNS redirect and input check, and NAT per family.
    #[test]
    fn ipv6_rules_sets_and_a_table_of_the_links_with_an_ipv6_next_hop() {
        let text = CFG
            .replace(
                "snat = \"198.18.1.2\"",
                "snat = \"198.18.1.2\"\ngateway6 = \"fd00:1::1\"\nsnat6 = \"none\"",
            )
            .replace(
                "cidrs = [\"198.19.64.0/24\", \"198.19.64.128/25\"]",
                "cidrs = [\"198.19.64.0/24\", \"fd00:64::/48\"]",
            )
            .replace("isp = \"isp-b\"", "isp = \"isp-b\"\nresolver = \"198.19.0.53\"")
            .replace("weight = 3", "weight = 3\nisp = \"isp-b\"")
            .replace(
                "sources = [\"198.18.100.0/24\"]",
                "sources = [\"198.18.100.0/24\", \"fd00:100::/64\"]\ndns_proxy = \"[fd00:100::1]:53\"",
            );
        let cfg = fulcrum_config::parse(&text, "t.toml", Path::new(".")).unwrap();
        let plan = build(&cfg).unwrap();
        let o = &plan.outbounds[0];
        assert_eq!(o.family_members(true), vec![true, false]);
        // b has no IPv6 next hop: the IPv6 prefix of its table is left to a.
        assert!(o.links[1].isp_prefixes6.is_empty());
        assert_eq!(o.links[0].isp_prefixes6.len(), 1);
        let slots = GroupSlots {
            v4: vec![0, 1, 0],
            v6: Some(vec![0, 0]),
        };
        let t = render_table(
            &plan,
            std::slice::from_ref(&slots),
            &[vec![true, true]],
            &[],
        );
        for want in [
            "set src6_0 { type ipv6_addr; flags interval; elements = { fd00:100::/64 } }",
            "map slots6_0 { typeof numgen inc mod 2 : ct mark; elements = { 0 : 0x464c0001, 1 : 0x464c0001 } }",
            "map prox6_0 { type ipv6_addr : mark; flags interval; elements = { fd00:64::/48 : 0x464c0001 } }",
            "ct state new ip6 saddr @src6_0 ip6 daddr != @src6_0 fib daddr type != { local, multicast } jump choose_0",
            "ct mark set ip6 daddr map @prox6_0",
            "meta nfproto ipv4 ct mark and 0xffff0000 != 0x464c0000 ct mark set numgen inc mod 3 map @slots_0",
            "meta nfproto ipv6 ct mark and 0xffff0000 != 0x464c0000 ct mark set numgen inc mod 2 map @slots6_0",
            "ip6 saddr @src6_0 ip6 daddr != fd00:100::1 meta l4proto { tcp, udp } th dport 53 dnat ip6 to [fd00:100::1]:53",
            "ip6 daddr fd00:100::1 meta l4proto { tcp, udp } th dport 53 ip6 saddr @src6_0 fib saddr . iif oif exists accept",
            "ip6 daddr fd00:100::1 meta l4proto { tcp, udp } th dport 53 counter name dns_refused_0 drop",
            "meta mark 0x464c0001 oifname \"wan0\" snat ip to 198.18.1.2",
            "meta nfproto ipv4 meta mark 0x464c0002 oifname \"wan1\" masquerade",
        ] {
            assert!(t.contains(want), "{want}\n{t}");
        }
        // snat6 = "none": a's IPv6 flows leave untouched; b carries no IPv6.
        assert!(!t.contains("nfproto ipv6 meta mark"), "{t}");
        // `rtt`'s measured IPv6 /48s come first, as its IPv4 /24s do.
        let measured: Nearest = vec![("fd00:77:1::/48".parse().unwrap(), 0)];
        let t = render_maps(
            &plan,
            std::slice::from_ref(&slots),
            &[vec![true, true]],
            &[measured],
        );
        assert!(
            t.contains("prox6_0 { fd00:77:1::/48 : 0x464c0001, fd00:64::/48 : 0x464c0001 }"),
            "{t}"
        );
        let m = render_maps(&plan, &[slots], &[vec![true, false]], &[]);
        assert!(m.contains("flush map inet fulcrum_link slots6_0"), "{m}");
        assert!(
            m.contains("add element inet fulcrum_link prox6_0 { fd00:64::/48 : 0x464c0001 }"),
            "{m}"
        );
        // A port rule to b, which has no IPv6 next hop: IPv6 flows it matches are placed as
        // without it.
        let ruled = format!("{text}[[outbound.rule]]\nprotocol = \"udp\"\nlink = \"b\"\n");
        let cfg = fulcrum_config::parse(&ruled, "t.toml", Path::new(".")).unwrap();
        let t = render_table(&build(&cfg).unwrap(), &[GroupSlots::default()], &[], &[]);
        let policy = t.find("map @policy_0").expect("policy");
        let unset = t
            .find("meta nfproto ipv6 ct mark { 0x464c0002 } ct mark set 0")
            .expect("b's IPv6 flows unmarked");
        assert!(
            policy < unset && unset < t.find("map @prox_0").unwrap_or(0),
            "{t}"
        );
        // Source persistence hashes the IPv6 source into the IPv6 table.
        let by_source = text.replace(
            "pool = \"uplinks\"\n",
            "pool = \"uplinks\"\npersistence = \"by-source\"\n",
        );
        let cfg = fulcrum_config::parse(&by_source, "t.toml", Path::new(".")).unwrap();
        let t = render_table(&build(&cfg).unwrap(), &[GroupSlots::default()], &[], &[]);
        assert!(
            t.contains("meta nfproto ipv6 ct mark and 0xffff0000 != 0x464c0000 ct mark set jhash ip6 saddr mod 1 seed 0x464c map @slots_0"),
            "{t}"
        );
    }
}
