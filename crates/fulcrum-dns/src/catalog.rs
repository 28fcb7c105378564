//! The zones served, indexed for answering: every owner name (lower-case wire form) maps to its
//! record sets, pre-encoded as `type class ttl rdlength rdata` so an answer is mostly copies.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;

use hickory_proto::rr::Name;

use crate::wire::{TYPE_CNAME, TYPE_NS, TYPE_SOA};
use crate::zone::{self, wire_to_text, ZoneRecord};

/// FNV-1a: names are short, and SipHash's DoS resistance is not needed for a table whose keys
/// come from the operator's zone files (queries only look up).
#[derive(Default, Clone, Copy)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

pub type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// The records of one type at one name.
#[derive(Debug, Clone)]
pub struct RrSet {
    pub rtype: u16,
    pub count: u16,
    /// `type class ttl rdlength rdata` of each record, back to back.
    pub bytes: Vec<u8>,
    /// For CNAME: the target (lower-case wire form).
    pub target: Option<Vec<u8>>,
    /// Offsets in `bytes` where each record starts (to write an owner before each).
    pub starts: Vec<u32>,
}

/// Everything at one name.
#[derive(Debug, Clone, Default)]
pub struct Node {
    pub zone: u16,
    pub rrsets: Vec<RrSet>,
    /// The GSLB name answered here, if any (index into `GslbState::names`).
    pub gslb: Option<u16>,
}

impl Node {
    pub fn get(&self, rtype: u16) -> Option<&RrSet> {
        self.rrsets.iter().find(|r| r.rtype == rtype)
    }
}

/// A zone's own facts.
#[derive(Debug, Clone)]
pub struct ZoneMeta {
    pub origin: Vec<u8>,
    pub origin_text: String,
    /// The SOA for negative answers: `type class ttl rdlength rdata` with the TTL lowered to
    /// the SOA's MINIMUM (RFC 2308).
    pub negative_soa: Vec<u8>,
    /// Whether the SOA was synthesized (the configuration gave none).
    pub synthetic_soa: bool,
    pub records: usize,
}

/// Every zone and name.
#[derive(Debug, Default)]
pub struct Catalog {
    pub zones: Vec<ZoneMeta>,
    zone_index: FnvMap<Vec<u8>, u16>,
    nodes: FnvMap<Vec<u8>, Node>,
    /// Names below an apex that hold NS records (delegation points).
    cuts: HashSet<Vec<u8>>,
}

/// A zone's source problem, located.
#[derive(Debug, Clone)]
pub struct CatalogError {
    /// Config key path of the zone (or record) at fault.
    pub key: String,
    /// File and line, for errors inside a zone file.
    pub file: Option<(PathBuf, usize)>,
    pub message: String,
}

fn fixed(r: &ZoneRecord, ttl: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + r.rdata.len());
    b.extend_from_slice(&r.rtype.to_be_bytes());
    b.extend_from_slice(&1u16.to_be_bytes());
    b.extend_from_slice(&ttl.to_be_bytes());
    b.extend_from_slice(&(r.rdata.len() as u16).to_be_bytes());
    b.extend_from_slice(&r.rdata);
    b
}

/// Whether `name` equals `origin` or lies below it, on label boundaries (both lower-case wire).
pub fn in_zone(name: &[u8], origin: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        if name[i..] == *origin {
            return true;
        }
        let len = name[i] as usize;
        if len == 0 {
            break;
        }
        i += 1 + len;
    }
    false
}

fn synthetic_soa(origin: &[u8]) -> ZoneRecord {
    let mut rdata = Vec::new();
    // mname "ns.<origin>", rname "hostmaster.<origin>", serial 1, refresh, retry, expire, minimum.
    rdata.push(2);
    rdata.extend_from_slice(b"ns");
    rdata.extend_from_slice(origin);
    rdata.push(10);
    rdata.extend_from_slice(b"hostmaster");
    rdata.extend_from_slice(origin);
    for v in [1u32, 3600, 600, 86400, 60] {
        rdata.extend_from_slice(&v.to_be_bytes());
    }
    ZoneRecord {
        owner: origin.to_vec(),
        rtype: TYPE_SOA,
        ttl: 3600,
        rdata,
        target: None,
        soa_minimum: Some(60),
        text: format!("{} 3600 IN SOA (synthesized)", wire_to_text(origin)),
    }
}

/// A zone as read: its origin (lower-case wire form), the origin as text, and its records.
struct ZoneSource {
    origin: Vec<u8>,
    text: String,
    records: Vec<ZoneRecord>,
}

/// The `[dns]` zones, in order, each with the records of its file and its `records`; a zone
/// whose origin is not a name, or that repeats an earlier one, is left out (and reported).
fn read_zones(
    dns: Option<&fulcrum_config::Dns>,
    errors: &mut Vec<CatalogError>,
) -> Vec<ZoneSource> {
    let mut per_zone: Vec<ZoneSource> = Vec::new();
    for (zi, z) in dns
        .map(|d| d.zones.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let key = format!("dns.zone[{zi}]");
        let origin = match Name::from_ascii(&z.origin) {
            Ok(o) => o,
            Err(e) => {
                errors.push(CatalogError {
                    key: format!("{key}.origin"),
                    file: None,
                    message: format!("{:?} is not a domain name: {e}", z.origin),
                });
                continue;
            }
        };
        let wire = zone::wire_name(&origin);
        if per_zone.iter().any(|s| s.origin == wire) {
            errors.push(CatalogError {
                key: format!("{key}.origin"),
                file: None,
                message: format!("zone {} is configured twice", z.origin),
            });
            continue;
        }
        per_zone.push(ZoneSource {
            origin: wire,
            text: z.origin.to_ascii_lowercase(),
            records: read_zone_records(&key, z, &origin, errors),
        });
    }
    per_zone
}

/// The records of zone `z` (config key `key`): its file's, then its `records` lines.
fn read_zone_records(
    key: &str,
    z: &fulcrum_config::Zone,
    origin: &Name,
    errors: &mut Vec<CatalogError>,
) -> Vec<ZoneRecord> {
    let mut records = Vec::new();
    if let Some(path) = &z.file {
        match zone::load_file(path, origin) {
            Ok(r) => records.extend(r),
            Err(e) => errors.push(CatalogError {
                key: format!("{key}.file"),
                file: Some((path.clone(), e.line)),
                message: e.message,
            }),
        }
    }
    for (ri, line) in z.records.iter().enumerate() {
        match zone::parse_master(line, origin) {
            Ok(r) => records.extend(r),
            Err(e) => errors.push(CatalogError {
                key: format!("{key}.records[{ri}]"),
                file: None,
                message: e.message,
            }),
        }
    }
    records
}

impl Catalog {
    /// Builds the catalog from the `[dns]` zones and the GSLB names (each answered at its fqdn;
    /// a name outside every zone gets an implicit zone of its own).
    pub fn build(
        dns: Option<&fulcrum_config::Dns>,
        gslb_names: &[Vec<u8>],
    ) -> Result<Catalog, Vec<CatalogError>> {
        let mut errors = Vec::new();
        let mut cat = Catalog::default();
        let mut per_zone = read_zones(dns, &mut errors);
        for name in gslb_names {
            if !per_zone.iter().any(|s| in_zone(name, &s.origin)) {
                per_zone.push(ZoneSource {
                    origin: name.clone(),
                    text: wire_to_text(name),
                    records: Vec::new(),
                });
            }
        }
        for zi in 0..per_zone.len() {
            cat.add_zone(&per_zone, zi, &mut errors);
        }
        cat.check_cnames_stand_alone(&mut errors);
        cat.add_gslb_names(gslb_names, &mut errors);
        let names: Vec<Vec<u8>> = cat.nodes.keys().cloned().collect();
        for n in names {
            if let Some(z) = cat.nodes.get(&n).map(|x| x.zone) {
                cat.add_ancestors(&n, z);
            }
        }
        if errors.is_empty() {
            Ok(cat)
        } else {
            Err(errors)
        }
    }

    /// Indexes zone `zi` of `per_zone`: its records (those a deeper zone does not own) and its
    /// SOA, synthesized when it has none.
    fn add_zone(&mut self, per_zone: &[ZoneSource], zi: usize, errors: &mut Vec<CatalogError>) {
        let ZoneSource {
            origin,
            text,
            records,
        } = &per_zone[zi];
        let mut soa = None;
        let mut count = 0;
        for r in records {
            // Zones nest (example.com. and sub.example.com.): a record goes to the deepest zone.
            let deepest = per_zone
                .iter()
                .enumerate()
                .filter(|(_, s)| in_zone(&r.owner, &s.origin))
                .max_by_key(|(_, s)| s.origin.len())
                .map(|(i, _)| i);
            if deepest != Some(zi) {
                if !in_zone(&r.owner, origin) {
                    errors.push(CatalogError {
                        key: format!("dns.zone[{zi}]"),
                        file: None,
                        message: format!("{} is outside the zone {text}", r.text),
                    });
                }
                continue;
            }
            if r.rtype == TYPE_SOA {
                if r.owner != *origin {
                    errors.push(CatalogError {
                        key: format!("dns.zone[{zi}]"),
                        file: None,
                        message: format!(
                            "an SOA belongs at the zone's apex {text}, not at {}",
                            wire_to_text(&r.owner)
                        ),
                    });
                    continue;
                }
                if soa.is_some() {
                    continue;
                }
                soa = Some(r.clone());
            }
            self.insert(zi as u16, r);
            count += 1;
        }
        let synthetic = soa.is_none();
        let soa = soa.unwrap_or_else(|| {
            let s = synthetic_soa(origin);
            self.insert(zi as u16, &s);
            s
        });
        let neg = soa.ttl.min(soa.soa_minimum.unwrap_or(soa.ttl));
        self.zone_index.insert(origin.clone(), zi as u16);
        self.zones.push(ZoneMeta {
            origin: origin.clone(),
            origin_text: text.clone(),
            negative_soa: fixed(&soa, neg),
            synthetic_soa: synthetic,
            records: count,
        });
    }

    /// CNAME and other data cannot share a name (RFC 1034 §3.6.2).
    fn check_cnames_stand_alone(&self, errors: &mut Vec<CatalogError>) {
        for (name, node) in &self.nodes {
            if node.get(TYPE_CNAME).is_some() && node.rrsets.len() > 1 {
                errors.push(CatalogError {
                    key: format!("dns.zone[{}]", node.zone),
                    file: None,
                    message: format!(
                        "{} has a CNAME and other records; a CNAME must stand alone",
                        wire_to_text(name)
                    ),
                });
            }
        }
    }

    /// Marks each GSLB name's node (creating it in the zone the name is in), which must not be
    /// a CNAME.
    fn add_gslb_names(&mut self, gslb_names: &[Vec<u8>], errors: &mut Vec<CatalogError>) {
        for (gi, name) in gslb_names.iter().enumerate() {
            let zone = self.zone_of(name).unwrap_or(0);
            let node = self.nodes.entry(name.clone()).or_insert_with(|| Node {
                zone,
                ..Node::default()
            });
            if node.get(TYPE_CNAME).is_some() {
                errors.push(CatalogError {
                    key: format!("gslb.name[{gi}].fqdn"),
                    file: None,
                    message: format!("{} is also a CNAME in the zone", wire_to_text(name)),
                });
            }
            node.gslb = Some(gi as u16);
            self.add_ancestors(name, zone);
        }
    }

    fn insert(&mut self, zone: u16, r: &ZoneRecord) {
        let node = self.nodes.entry(r.owner.clone()).or_insert_with(|| Node {
            zone,
            ..Node::default()
        });
        let ttl = r.ttl;
        let set = match node.rrsets.iter_mut().position(|s| s.rtype == r.rtype) {
            Some(i) => &mut node.rrsets[i],
            None => {
                node.rrsets.push(RrSet {
                    rtype: r.rtype,
                    count: 0,
                    bytes: Vec::new(),
                    target: None,
                    starts: Vec::new(),
                });
                node.rrsets.last_mut().expect("just pushed")
            }
        };
        // Identical records are one record.
        let enc = fixed(r, ttl);
        let dup = set.starts.iter().enumerate().any(|(k, &s)| {
            let end = set
                .starts
                .get(k + 1)
                .map_or(set.bytes.len(), |e| *e as usize);
            set.bytes[s as usize + 8..end] == enc[8..]
        });
        if dup {
            return;
        }
        set.starts.push(set.bytes.len() as u32);
        set.bytes.extend_from_slice(&enc);
        set.count += 1;
        if r.target.is_some() {
            set.target.clone_from(&r.target);
        }
        if r.rtype == TYPE_NS {
            self.cuts.insert(r.owner.clone());
        }
    }

    /// Empty non-terminals exist (NODATA, not NXDOMAIN): `a.b.example.com` makes
    /// `b.example.com` a name.
    fn add_ancestors(&mut self, name: &[u8], zone: u16) {
        let origin_len = self.zones.get(zone as usize).map_or(1, |z| z.origin.len());
        let mut i = 0;
        while name.len() - i > origin_len {
            i += 1 + name[i] as usize;
            if name.len() - i <= origin_len {
                break;
            }
            self.nodes
                .entry(name[i..].to_vec())
                .or_insert_with(|| Node {
                    zone,
                    ..Node::default()
                });
        }
    }

    /// The deepest zone containing `name`.
    pub fn zone_of(&self, name: &[u8]) -> Option<u16> {
        let mut i = 0;
        loop {
            if let Some(&z) = self.zone_index.get(&name[i..]) {
                return Some(z);
            }
            let len = *name.get(i)? as usize;
            if len == 0 {
                return None;
            }
            i += 1 + len;
            if i >= name.len() {
                return None;
            }
        }
    }

    pub fn node(&self, name: &[u8]) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// The delegation point at or above `name` (below its zone's apex), if any.
    pub fn cut_above<'n>(&self, name: &'n [u8], zone: u16) -> Option<&'n [u8]> {
        if self.cuts.is_empty() {
            return None;
        }
        let origin = &self.zones[zone as usize].origin;
        let mut found = None;
        let mut i = 0;
        // Walk from the name up to the apex; the highest cut wins.
        while name.len() - i > origin.len() {
            if self.cuts.contains(&name[i..]) {
                found = Some(&name[i..]);
            }
            i += 1 + name[i] as usize;
        }
        found
    }

    /// Whether the catalog has any wildcard owner in `zone` (skips the lookup otherwise).
    pub fn wildcard(&self, name: &[u8], zone: u16) -> Option<(&Node, usize)> {
        // The closest encloser: the longest existing ancestor; then `*.<encloser>`.
        let origin_len = self.zones[zone as usize].origin.len();
        let mut i = 0;
        let mut buf = [0u8; 256];
        while name.len() - i > origin_len {
            i += 1 + name[i] as usize;
            let enc = &name[i..];
            if self.nodes.contains_key(enc) || enc.len() == origin_len {
                buf[0] = 1;
                buf[1] = b'*';
                buf[2..2 + enc.len()].copy_from_slice(enc);
                return self.nodes.get(&buf[..2 + enc.len()]).map(|n| (n, i));
            }
        }
        None
    }

    pub fn records(&self) -> usize {
        self.zones.iter().map(|z| z.records).sum()
    }
}
