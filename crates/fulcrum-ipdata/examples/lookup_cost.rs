//! Cost of the shipped address table: decode time, resident memory it adds, and nanoseconds
//! per AS and country lookup of random IPv4 and IPv6 addresses. Bounded: a fixed number of
//! lookups (`LOOKUPS`, default 2,000,000 per kind). Run from the repository root:
//!
//!     cargo run -p fulcrum-ipdata --example lookup_cost

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

/// Resident set size in KiB, from /proc/self/status.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let lookups: usize = std::env::var("LOOKUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let before = rss_kib();
    let t = Instant::now();
    let table = match fulcrum_ipdata::shipped() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("the shipped table does not decode: {e}");
            std::process::exit(1);
        }
    };
    let decode = t.elapsed();
    let grown = rss_kib().saturating_sub(before);
    println!(
        "table {} ({}): ranges {:?}",
        table.date(),
        table.source(),
        table.counts()
    );
    println!(
        "decode: {:.1} ms, resident memory added: {:.1} MiB",
        decode.as_secs_f64() * 1e3,
        grown as f64 / 1024.0
    );
    // Addresses drawn up front so that the loop times the lookups only.
    let mut rng = fastrand::Rng::with_seed(42);
    let v4: Vec<IpAddr> = (0..4096)
        .map(|_| IpAddr::V4(Ipv4Addr::from(rng.u32(..))))
        .collect();
    // IPv6 at random is almost all unallocated (every search takes the same path): draw
    // addresses inside the table's IPv6 ranges instead, a random one of each prefix.
    let countries: Vec<String> = table.countries().map(String::from).collect();
    let v6_prefixes: Vec<ipnet::IpNet> = table
        .country_prefixes(&countries)
        .into_iter()
        .filter(|n| n.addr().is_ipv6())
        .collect();
    let v6: Vec<IpAddr> = (0..4096)
        .map(|_| {
            let n = v6_prefixes[rng.usize(..v6_prefixes.len())];
            let host = u128::MAX
                .checked_shr(u32::from(n.prefix_len()))
                .unwrap_or(0);
            let base = match n.network() {
                IpAddr::V6(a) => u128::from(a),
                IpAddr::V4(_) => 0,
            };
            IpAddr::V6(Ipv6Addr::from(base | (rng.u128(..) & host)))
        })
        .collect();
    for (name, addrs) in [("IPv4", &v4), ("IPv6", &v6)] {
        let mut found = 0usize;
        let t = Instant::now();
        for i in 0..lookups {
            found += usize::from(black_box(table.asn(addrs[i % addrs.len()])).is_some());
        }
        let asn_ns = t.elapsed().as_nanos() as f64 / lookups as f64;
        let t = Instant::now();
        for i in 0..lookups {
            found += usize::from(black_box(table.country(addrs[i % addrs.len()])).is_some());
        }
        let country_ns = t.elapsed().as_nanos() as f64 / lookups as f64;
        println!(
            "{name}: {asn_ns:.0} ns per AS lookup, {country_ns:.0} ns per country lookup \
             ({lookups} each, {:.0}% found)",
            found as f64 * 50.0 / lookups as f64
        );
    }
}
