//! Writes small MaxMind DB files (the GeoIP2 format) for tests: no GeoIP database ships with
//! the tests, so they build one with exactly the networks they need.
//!
//! The format (maxmind.github.io/MaxMind-DB): a binary search tree over the address bits
//! (IPv6, with IPv4 at `::/96`), 24-bit records, a 16-byte separator, the data section, then
//! the metadata map after the marker `\xAB\xCD\xEFMaxMind.com`.

use std::net::IpAddr;

/// One network and the country / continent codes it maps to (a GeoIP2 Country record).
#[derive(Debug, Clone)]
pub struct GeoEntry {
    pub network: ipnet::IpNet,
    pub country: String,
    pub continent: String,
}

#[derive(Default)]
struct Node {
    child: [Option<usize>; 2],
    data: [Option<usize>; 2],
}

fn ctrl(kind: u8, size: usize, out: &mut Vec<u8>) {
    assert!(size < 29, "test data stays small");
    if kind <= 7 {
        out.push((kind << 5) | size as u8);
    } else {
        out.push(size as u8);
        out.push(kind - 7);
    }
}

fn string(s: &str, out: &mut Vec<u8>) {
    ctrl(2, s.len(), out);
    out.extend_from_slice(s.as_bytes());
}

fn uint(kind: u8, v: u64, out: &mut Vec<u8>) {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    ctrl(kind, 8 - skip, out);
    out.extend_from_slice(&bytes[skip..]);
}

fn country_record(country: &str, continent: &str, out: &mut Vec<u8>) {
    ctrl(7, 2, out);
    string("continent", out);
    ctrl(7, 1, out);
    string("code", out);
    string(continent, out);
    string("country", out);
    ctrl(7, 1, out);
    string("iso_code", out);
    string(country, out);
}

/// The bits of a network in the IPv6 tree: IPv4 sits at ::/96.
fn bits(net: &ipnet::IpNet) -> (u128, u8) {
    match net {
        ipnet::IpNet::V4(n) => (u128::from(u32::from(n.network())), 96 + n.prefix_len()),
        ipnet::IpNet::V6(n) => (u128::from(n.network()), n.prefix_len()),
    }
}

/// Builds a database; later entries override earlier ones where they overlap more specifically.
pub fn build(entries: &[GeoEntry]) -> Vec<u8> {
    let mut nodes = vec![Node::default()];
    let mut data = Vec::new();
    for e in entries {
        let offset = data.len();
        country_record(&e.country, &e.continent, &mut data);
        let (addr, len) = bits(&e.network);
        assert!(len > 0, "a /0 network cannot be stored");
        let mut n = 0;
        for i in 0..len {
            let bit = ((addr >> (127 - i)) & 1) as usize;
            if i == len - 1 {
                nodes[n].data[bit] = Some(offset);
                nodes[n].child[bit] = None;
            } else {
                n = match nodes[n].child[bit] {
                    Some(c) => c,
                    None => {
                        nodes.push(Node::default());
                        let c = nodes.len() - 1;
                        // A more specific network under one with data inherits that data.
                        let inherited = nodes[n].data[bit].take();
                        nodes[c].data = [inherited, inherited];
                        nodes[n].child[bit] = Some(c);
                        c
                    }
                };
            }
        }
    }
    let count = nodes.len();
    let mut out = Vec::new();
    for node in &nodes {
        for side in 0..2 {
            let v = match (node.child[side], node.data[side]) {
                (Some(c), _) => c,
                (None, Some(off)) => count + 16 + off,
                (None, None) => count,
            };
            out.extend_from_slice(&(v as u32).to_be_bytes()[1..]);
        }
    }
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
    let mut meta = Vec::new();
    ctrl(7, 9, &mut meta);
    string("node_count", &mut meta);
    uint(6, count as u64, &mut meta);
    string("record_size", &mut meta);
    uint(5, 24, &mut meta);
    string("ip_version", &mut meta);
    uint(5, 6, &mut meta);
    string("database_type", &mut meta);
    string("Fulcrum-Test-Country", &mut meta);
    string("languages", &mut meta);
    ctrl(11, 1, &mut meta);
    string("en", &mut meta);
    string("binary_format_major_version", &mut meta);
    uint(5, 2, &mut meta);
    string("binary_format_minor_version", &mut meta);
    uint(5, 0, &mut meta);
    string("build_epoch", &mut meta);
    uint(9, 1_700_000_000, &mut meta);
    string("description", &mut meta);
    ctrl(7, 1, &mut meta);
    string("en", &mut meta);
    string("test", &mut meta);
    out.extend_from_slice(&meta);
    out
}

/// Convenience: an entry from text.
pub fn entry(network: &str, country: &str, continent: &str) -> GeoEntry {
    GeoEntry {
        network: network.parse().unwrap_or_else(|_| {
            let ip: IpAddr = network.parse().expect("a network or an address");
            ipnet::IpNet::from(ip)
        }),
        country: country.into(),
        continent: continent.into(),
    }
}
