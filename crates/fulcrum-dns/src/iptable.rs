//! Client location: named IP tables (ISP lines, regions) from CIDRs, prefix files, AS numbers
//! and countries (the table Fulcrum ships, `fulcrum-ipdata`) and GeoIP.
//!
//! Every table's prefixes go into one longest-prefix-match structure: prefixes are flattened
//! into disjoint, sorted address ranges at load time, each carrying the table of the longest
//! prefix covering it, so a lookup is one binary search whatever the number of prefixes (the
//! public per-ISP lists run to thousands). Tables defined by AS numbers, countries or
//! continents are consulted only for clients that no prefix covers: an explicit prefix is the
//! operator's word. Of those, an AS number is the most specific and is asked first (the first
//! table in config order listing the client's AS), then countries (shipped table or GeoIP,
//! the first table in config order), then continents.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use maxminddb::Reader;

/// Where a client was placed: the table (its index in config order) and how many leading bits
/// of its address decided it (the ECS scope of an answer that depended on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub table: u16,
    pub prefix_len: u8,
}

/// Disjoint sorted ranges `[start, end]` → (table, prefix length).
#[derive(Debug, Default)]
struct Ranges<T> {
    starts: Vec<T>,
    ends: Vec<T>,
    values: Vec<Region>,
}

trait Addr: Copy + Ord + std::fmt::Debug {
    fn from_u128(v: u128) -> Self;
    fn to_u128(self) -> u128;
}

impl Addr for u32 {
    fn from_u128(v: u128) -> Self {
        v as u32
    }
    fn to_u128(self) -> u128 {
        u128::from(self)
    }
}

impl Addr for u128 {
    fn from_u128(v: u128) -> Self {
        v
    }
    fn to_u128(self) -> u128 {
        self
    }
}

impl<T: Addr> Ranges<T> {
    /// Builds from (start, end, region); of identical prefixes, the first listed wins.
    fn build(mut prefixes: Vec<(T, T, Region)>) -> Self {
        // Containing prefixes come before the ones they contain: start ascending, end descending.
        prefixes.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        prefixes.dedup_by(|b, a| a.0 == b.0 && a.1 == b.1);
        let mut out = Ranges {
            starts: Vec::new(),
            ends: Vec::new(),
            values: Vec::new(),
        };
        let mut emit = |s: u128, e: u128, v: Region| {
            if s <= e {
                out.starts.push(T::from_u128(s));
                out.ends.push(T::from_u128(e));
                out.values.push(v);
            }
        };
        // The prefixes covering the cursor, outermost first; prefixes nest or are disjoint.
        let mut stack: Vec<(u128, Region)> = Vec::new();
        let mut cursor: u128 = 0;
        for (s, e, v) in prefixes {
            let (s, e) = (s.to_u128(), e.to_u128());
            while let Some(&(top_end, top_v)) = stack.last() {
                if top_end >= s {
                    break;
                }
                emit(cursor, top_end, top_v);
                cursor = top_end.wrapping_add(1);
                stack.pop();
            }
            if let Some(&(_, top_v)) = stack.last() {
                if cursor < s {
                    emit(cursor, s - 1, top_v);
                }
            }
            cursor = s;
            stack.push((e, v));
        }
        while let Some((top_end, top_v)) = stack.pop() {
            if cursor <= top_end {
                emit(cursor, top_end, top_v);
                cursor = top_end.wrapping_add(1);
                if cursor == 0 {
                    break;
                }
            }
        }
        out
    }

    fn find(&self, a: T) -> Option<Region> {
        let i = self.starts.partition_point(|s| *s <= a);
        let i = i.checked_sub(1)?;
        (self.ends[i] >= a).then(|| self.values[i])
    }

    fn len(&self) -> usize {
        self.starts.len()
    }
}

/// A table placed by the shipped address table: its `asns`, and its `countries` when it has
/// no `geoip`.
struct ShippedTable {
    table: u16,
    asns: Vec<u32>,
    countries: Vec<String>,
}

struct GeoTable {
    table: u16,
    reader: Arc<Reader<Vec<u8>>>,
    countries: Vec<String>,
    continents: Vec<String>,
}

/// Places client addresses into the configured IP tables.
#[derive(Default)]
pub struct Locator {
    names: Vec<String>,
    v4: Ranges<u32>,
    v6: Ranges<u128>,
    geo: Vec<GeoTable>,
    shipped: Vec<ShippedTable>,
    /// The shipped address table, when a table uses it (decoded once per process).
    data: Option<&'static fulcrum_ipdata::Table>,
}

impl std::fmt::Debug for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locator")
            .field("tables", &self.names)
            .field("v4_ranges", &self.v4.len())
            .field("v6_ranges", &self.v6.len())
            .field("geo_tables", &self.geo.len())
            .field("shipped_tables", &self.shipped.len())
            .finish()
    }
}

/// A problem with a table: which key (or file line) and what.
#[derive(Debug, Clone)]
pub struct TableError {
    /// Config key path, e.g. `ip_table[0].file`.
    pub key: String,
    pub message: String,
}

/// Reads a prefix file: one prefix per line (`198.51.100.0/24`, or a bare address), `#` starts
/// a comment, blank lines are skipped: the format of the public per-ISP address lists.
pub fn read_prefix_file(path: &Path) -> Result<Vec<IpNet>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_prefixes(&text).map_err(|(line, msg)| format!("{}:{line}: {msg}", path.display()))
}

/// Parses prefix-list text; an error carries its 1-based line.
pub fn parse_prefixes(text: &str) -> Result<Vec<IpNet>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let net = fulcrum_config::parse_prefix(line)
            .map_err(|e| (i + 1, format!("{line:?} is not a prefix: {e}")))?;
        out.push(net);
    }
    Ok(out)
}

fn v4_range(net: &ipnet::Ipv4Net) -> (u32, u32) {
    (u32::from(net.network()), u32::from(net.broadcast()))
}

fn v6_range(net: &ipnet::Ipv6Net) -> (u128, u128) {
    (u128::from(net.network()), u128::from(net.broadcast()))
}

/// MaxMind databases opened once per path, shared by the tables that name them.
pub type GeoCache = HashMap<PathBuf, Arc<Reader<Vec<u8>>>>;

impl Locator {
    /// Builds the locator from the config's tables. `geo_cache` keeps databases open across
    /// reloads (a GeoIP file is large); it is keyed by path.
    pub fn build(
        tables: &[fulcrum_config::IpTable],
        geo_cache: &mut GeoCache,
    ) -> Result<Locator, Vec<TableError>> {
        let mut errors = Vec::new();
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut geo = Vec::new();
        let mut shipped = Vec::new();
        for (i, t) in tables.iter().enumerate() {
            let countries = if t.geoip.is_some() {
                Vec::new()
            } else {
                t.countries.clone()
            };
            if !t.asns.is_empty() || !countries.is_empty() {
                shipped.push(ShippedTable {
                    table: i as u16,
                    asns: t.asns.clone(),
                    countries,
                });
            }
            let mut prefixes = t.cidrs.clone();
            if let Some(file) = &t.file {
                match read_prefix_file(file) {
                    Ok(p) => prefixes.extend(p),
                    Err(message) => errors.push(TableError {
                        key: format!("ip_table[{i}].file"),
                        message,
                    }),
                }
            }
            for net in prefixes {
                let region = Region {
                    table: i as u16,
                    prefix_len: net.prefix_len(),
                };
                match net {
                    IpNet::V4(n) => {
                        let (s, e) = v4_range(&n);
                        v4.push((s, e, region));
                    }
                    IpNet::V6(n) => {
                        let (s, e) = v6_range(&n);
                        v6.push((s, e, region));
                    }
                }
            }
            if let Some(path) = &t.geoip {
                let reader = match geo_cache.get(path) {
                    Some(r) => Some(r.clone()),
                    None => match Reader::open_readfile(path) {
                        Ok(r) => {
                            let r = Arc::new(r);
                            geo_cache.insert(path.clone(), r.clone());
                            Some(r)
                        }
                        Err(e) => {
                            errors.push(TableError {
                                key: format!("ip_table[{i}].geoip"),
                                message: format!(
                                    "cannot open the MaxMind database {}: {e}",
                                    path.display()
                                ),
                            });
                            None
                        }
                    },
                };
                if let Some(reader) = reader {
                    geo.push(GeoTable {
                        table: i as u16,
                        reader,
                        countries: t.countries.clone(),
                        continents: t.continents.clone(),
                    });
                }
            }
        }
        let data = match shipped.first() {
            None => None,
            Some(first) => match fulcrum_ipdata::shipped() {
                Ok(data) => Some(data),
                Err(e) => {
                    errors.push(TableError {
                        key: format!("ip_table[{}]", first.table),
                        message: format!("the address table Fulcrum ships is unreadable: {e}"),
                    });
                    None
                }
            },
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Locator {
            names: tables.iter().map(|t| t.name.clone()).collect(),
            v4: Ranges::build(v4),
            v6: Ranges::build(v6),
            geo,
            shipped,
            data,
        })
    }

    /// The table names, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The table a client address belongs to: the longest prefix covering it, else the first
    /// table listing its AS, else the first whose countries (shipped table or GeoIP), then
    /// continents, include it.
    pub fn locate(&self, ip: IpAddr) -> Option<Region> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let hit = match ip {
            IpAddr::V4(a) => self.v4.find(u32::from(a)),
            IpAddr::V6(a) => self.v6.find(u128::from(a)),
        };
        if hit.is_some() || (self.geo.is_empty() && self.shipped.is_empty()) {
            return hit;
        }
        let (by_asn, shipped_country) = self.locate_shipped(ip);
        if by_asn.is_some() {
            return by_asn;
        }
        let (geo_country, by_continent) = self.locate_geo(ip);
        let by_country = match (shipped_country, geo_country) {
            (Some(a), Some(b)) => Some(if a.table < b.table { a } else { b }),
            (a, b) => a.or(b),
        };
        by_country.or(by_continent)
    }

    /// The first table (config order) listing the client's AS, and the first whose shipped
    /// countries include it.
    fn locate_shipped(&self, ip: IpAddr) -> (Option<Region>, Option<Region>) {
        let Some(data) = self.data else {
            return (None, None);
        };
        let region = |table, prefix_len| Region { table, prefix_len };
        let asn = data.asn(ip);
        let by_asn = asn.and_then(|hit| {
            let t = self.shipped.iter().find(|t| t.asns.contains(&hit.value))?;
            Some(region(t.table, hit.prefix_len))
        });
        if by_asn.is_some() {
            return (by_asn, None);
        }
        let by_country = data.country(ip).and_then(|hit| {
            let t = self
                .shipped
                .iter()
                .find(|t| t.countries.iter().any(|c| c == hit.value))?;
            Some(region(t.table, hit.prefix_len))
        });
        (None, by_country)
    }

    /// The first GeoIP table whose countries include the client, and the first whose
    /// continents do.
    fn locate_geo(&self, ip: IpAddr) -> (Option<Region>, Option<Region>) {
        let mut by_continent = None;
        // Tables usually share one database: look the address up once per database.
        let mut seen: Vec<(*const Reader<Vec<u8>>, Option<GeoHit>)> = Vec::new();
        for g in &self.geo {
            let key = Arc::as_ptr(&g.reader);
            let found = match seen.iter().find(|(k, _)| *k == key) {
                Some((_, f)) => f.clone(),
                None => {
                    let f = geo_lookup(&g.reader, ip);
                    seen.push((key, f.clone()));
                    f
                }
            };
            let Some((country, continent, prefix_len)) = found else {
                continue;
            };
            let region = Region {
                table: g.table,
                prefix_len,
            };
            if g.countries.contains(&country) {
                return (Some(region), by_continent);
            }
            if by_continent.is_none() && g.continents.contains(&continent) {
                by_continent = Some(region);
            }
        }
        (None, by_continent)
    }
}

/// Country ISO code, continent code and the database network's prefix length.
type GeoHit = (String, String, u8);

fn geo_lookup(reader: &Reader<Vec<u8>>, ip: IpAddr) -> Option<GeoHit> {
    let res = reader.lookup(ip).ok()?;
    if !res.has_data() {
        return None;
    }
    let prefix = res.network().ok()?.prefix();
    let c: maxminddb::geoip2::Country = res.decode().ok()??;
    let mut prefix = prefix;
    if ip.is_ipv4() && prefix > 32 {
        // An IPv4 address found in an IPv6 database: the tree depth includes the ::/96 part.
        prefix = prefix.saturating_sub(96);
    }
    Some((
        c.country.iso_code.unwrap_or_default().to_string(),
        c.continent.code.unwrap_or_default().to_string(),
        prefix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn table(name: &str, cidrs: &[&str]) -> fulcrum_config::IpTable {
        fulcrum_config::IpTable {
            name: name.into(),
            cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            file: None,
            geoip: None,
            countries: vec![],
            continents: vec![],
            asns: vec![],
        }
    }

    #[test]
    fn longest_prefix_wins_in_v4_and_v6() {
        let l = Locator::build(
            &[
                table("wide", &["10.0.0.0/8", "2001:db8::/32"]),
                table("narrow", &["10.1.2.0/24", "2001:db8:1::/48"]),
                table("host", &["10.1.2.3/32", "0.0.0.0/0"]),
            ],
            &mut GeoCache::new(),
        )
        .unwrap();
        let at = |s: &str| {
            l.locate(s.parse().unwrap())
                .map(|r| (r.table, r.prefix_len))
        };
        assert_eq!(at("10.9.9.9"), Some((0, 8)));
        assert_eq!(at("10.1.2.9"), Some((1, 24)));
        assert_eq!(at("10.1.2.3"), Some((2, 32)));
        assert_eq!(at("10.1.3.0"), Some((0, 8)));
        assert_eq!(at("11.0.0.0"), Some((2, 0)));
        assert_eq!(at("255.255.255.255"), Some((2, 0)));
        assert_eq!(at("2001:db8:1::5"), Some((1, 48)));
        assert_eq!(at("2001:db8:2::5"), Some((0, 32)));
        assert_eq!(at("2001:db9::"), None);
        assert_eq!(at("::ffff:10.1.2.3"), Some((2, 32)));
    }

    #[test]
    fn prefix_files_skip_comments_and_name_bad_lines() {
        assert_eq!(
            parse_prefixes("# ISP list\n1.0.1.0/24\n\n1.0.2.0/23 # trailing\n2001:db8::/32\n")
                .unwrap()
                .len(),
            3
        );
        let e = parse_prefixes("1.0.1.0/24\nnot-a-prefix\n").unwrap_err();
        assert_eq!(e.0, 2);
    }

    #[test]
    fn flattening_matches_a_brute_force_scan() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..50 {
            let mut nets = Vec::new();
            for _ in 0..30 {
                let len = rng.u8(0..=12);
                let addr = rng.u32(..) & 0xFFF0_0000;
                nets.push(format!("{}/{len}", std::net::Ipv4Addr::from(addr)));
            }
            let refs: Vec<&str> = nets.iter().map(String::as_str).collect();
            let l = Locator::build(&[table("t", &refs)], &mut GeoCache::new()).unwrap();
            let parsed: Vec<ipnet::Ipv4Net> = nets
                .iter()
                .map(|n| n.parse::<ipnet::Ipv4Net>().unwrap().trunc())
                .collect();
            for _ in 0..500 {
                let a = std::net::Ipv4Addr::from(rng.u32(..));
                let best = parsed
                    .iter()
                    .filter(|n| n.contains(&a))
                    .map(|n| n.prefix_len())
                    .max();
                assert_eq!(
                    l.locate(a.into()).map(|r| r.prefix_len),
                    best,
                    "{a} in {nets:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod shipped_tests {
    use super::*;

    fn table(name: &str) -> fulcrum_config::IpTable {
        super::tests::table(name, &[])
    }

    #[test]
    fn asns_then_countries_from_the_shipped_table_after_every_explicit_prefix() {
        let data = fulcrum_ipdata::shipped().unwrap();
        // An address of AS4134 (China Telecom) and one of China in another AS, per the table.
        let telecom = data.asn_prefixes(&[4134])[0];
        let telecom_ip = telecom.network();
        let china_ip = data
            .country_prefixes(&["CN".into()])
            .iter()
            .map(|n| n.network())
            .find(|ip| data.asn(*ip).is_none_or(|h| h.value != 4134))
            .unwrap();
        assert_eq!(data.country(telecom_ip).unwrap().value, "CN");
        let mut china = table("china");
        china.countries = vec!["CN".into()];
        let mut ct = table("ct");
        ct.asns = vec![4134, 4812];
        let mut office = table("office");
        office.cidrs = vec![IpNet::new(telecom_ip, telecom.prefix_len().max(24))
            .unwrap()
            .trunc()];
        let l = Locator::build(&[china, ct, office], &mut GeoCache::new()).unwrap();
        let name = |ip: IpAddr| l.locate(ip).map(|r| l.names()[r.table as usize].as_str());
        assert_eq!(name(telecom_ip), Some("office"), "an explicit prefix first");
        let beyond = data
            .asn_prefixes(&[4134])
            .into_iter()
            .find(|n| !n.contains(&telecom_ip));
        let beyond = beyond.unwrap().network();
        assert_eq!(
            name(beyond),
            Some("ct"),
            "an AS before a country listed earlier"
        );
        assert_eq!(name(china_ip), Some("china"));
        let hit = data.asn(beyond).unwrap();
        assert_eq!(
            l.locate(beyond).unwrap().prefix_len,
            hit.prefix_len,
            "the ECS scope"
        );
        assert_eq!(name("::ffff:0.0.0.1".parse().unwrap()), None);
    }

    #[test]
    fn every_shipped_country_is_an_iso_code_config_accepts() {
        let data = fulcrum_ipdata::shipped().unwrap();
        for code in data.countries() {
            assert!(fulcrum_config::COUNTRIES.contains(&code), "{code}");
        }
    }
}

#[cfg(test)]
mod geo_tests {
    use super::*;
    use fulcrum_testkit::mmdb;

    #[test]
    fn geoip_countries_then_continents_and_prefixes_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("geo.mmdb");
        std::fs::write(
            &path,
            mmdb::build(&[
                mmdb::entry("192.0.2.0/24", "CN", "AS"),
                mmdb::entry("198.51.100.0/24", "JP", "AS"),
                mmdb::entry("203.0.113.0/24", "DE", "EU"),
                mmdb::entry("2001:db8:1::/48", "CN", "AS"),
            ]),
        )
        .unwrap();
        let geo = |name: &str, countries: &[&str], continents: &[&str]| fulcrum_config::IpTable {
            name: name.into(),
            cidrs: vec![],
            file: None,
            geoip: Some(path.clone()),
            countries: countries.iter().map(|s| s.to_string()).collect(),
            continents: continents.iter().map(|s| s.to_string()).collect(),
            asns: vec![],
        };
        let mut explicit = geo("office", &[], &[]);
        explicit.geoip = None;
        explicit.cidrs = vec!["192.0.2.128/25".parse().unwrap()];
        let l = Locator::build(
            &[
                geo("asia", &[], &["AS"]),
                geo("china", &["CN"], &[]),
                explicit,
            ],
            &mut GeoCache::new(),
        )
        .unwrap();
        let at = |s: &str| {
            l.locate(s.parse().unwrap())
                .map(|r| (l.names()[r.table as usize].clone(), r.prefix_len))
        };
        assert_eq!(
            at("192.0.2.7"),
            Some(("china".into(), 24)),
            "a country beats a continent"
        );
        assert_eq!(at("198.51.100.7"), Some(("asia".into(), 24)));
        assert_eq!(at("203.0.113.7"), None);
        assert_eq!(
            at("192.0.2.200"),
            Some(("office".into(), 25)),
            "a prefix beats GeoIP"
        );
        assert_eq!(at("2001:db8:1::1"), Some(("china".into(), 48)));
        assert_eq!(at("10.0.0.1"), None);
    }
}
