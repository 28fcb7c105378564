use super::*;

/// Writes a table as `scripts/ipdata.py` does, for hand-made data.
fn encode(codes: &[&str], sections: [&[(u128, u128, u32)]; 4]) -> Vec<u8> {
    fn varint(mut x: u128, out: &mut Vec<u8>) {
        loop {
            let b = (x & 0x7F) as u8;
            x >>= 7;
            if x == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn scaled(x: u128, out: &mut Vec<u8>) {
        let t = if x == 0 { 0 } else { x.trailing_zeros() };
        varint(((x >> t) << 8) | u128::from(t), out);
    }
    let mut out = MAGIC.to_vec();
    for s in ["2026-01-02", "test data"] {
        varint(s.len() as u128, &mut out);
        out.extend_from_slice(s.as_bytes());
    }
    varint(codes.len() as u128, &mut out);
    for c in codes {
        out.extend_from_slice(c.as_bytes());
    }
    for records in sections {
        varint(records.len() as u128, &mut out);
        let mut next = 0u128;
        for &(s, e, v) in records {
            scaled(s - next, &mut out);
            scaled(e.wrapping_sub(s).wrapping_add(1), &mut out);
            varint(u128::from(v), &mut out);
            next = e.wrapping_add(1);
        }
    }
    out
}

fn v4(s: &str) -> u128 {
    u128::from(u32::from(s.parse::<std::net::Ipv4Addr>().unwrap()))
}

fn v6(s: &str) -> u128 {
    u128::from(s.parse::<std::net::Ipv6Addr>().unwrap())
}

fn sample() -> Table {
    let asn4 = [
        (v4("1.0.0.0"), v4("1.0.0.255"), 13335),
        (v4("8.8.8.0"), v4("8.8.8.255"), 15169),
        (v4("10.0.0.0"), v4("10.2.255.255"), 64500),
        (v4("255.255.255.0"), v4("255.255.255.255"), 7),
    ];
    let asn6 = [(
        v6("2001:db8::"),
        v6("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"),
        64501,
    )];
    let c4 = [
        (v4("1.0.1.0"), v4("1.0.3.255"), 0),
        (v4("8.0.0.0"), v4("8.255.255.255"), 1),
    ];
    let c6 = [(
        v6("2001:200::"),
        v6("2001:200:ffff:ffff:ffff:ffff:ffff:ffff"),
        2,
    )];
    Table::decode(&encode(&["CN", "US", "JP"], [&asn4, &asn6, &c4, &c6])).unwrap()
}

#[test]
fn lookups_give_the_value_and_the_widest_prefix_inside_the_range() {
    let t = sample();
    let at = |s: &str| t.asn(s.parse().unwrap()).map(|h| (h.value, h.prefix_len));
    assert_eq!(at("1.0.0.7"), Some((13335, 24)));
    assert_eq!(at("8.8.8.8"), Some((15169, 24)));
    assert_eq!(at("8.8.9.8"), None);
    // 10.0.0.0-10.2.255.255 is a /15 and a /16: each address gets the prefix it sits in.
    assert_eq!(at("10.1.2.3"), Some((64500, 15)));
    assert_eq!(at("10.2.2.3"), Some((64500, 16)));
    assert_eq!(at("255.255.255.255"), Some((7, 24)));
    assert_eq!(at("::ffff:8.8.8.8"), Some((15169, 24)));
    assert_eq!(at("2001:db8:1::1"), Some((64501, 32)));
    assert_eq!(at("2001:db9::1"), None);
    let country = |s: &str| {
        t.country(s.parse().unwrap())
            .map(|h| (h.value, h.prefix_len))
    };
    assert_eq!(country("1.0.2.1"), Some(("CN", 23)));
    assert_eq!(country("1.0.1.1"), Some(("CN", 24)));
    assert_eq!(country("8.8.8.8"), Some(("US", 8)));
    assert_eq!(country("2001:200:5::1"), Some(("JP", 32)));
    assert!(t.has_country("JP") && !t.has_country("DE"));
    assert_eq!((t.date(), t.source()), ("2026-01-02", "test data"));
}

#[test]
fn prefixes_of_asns_and_countries_cover_exactly_their_ranges() {
    let t = sample();
    let p: Vec<String> = t
        .asn_prefixes(&[64500, 64501])
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(p, ["10.0.0.0/15", "10.2.0.0/16", "2001:db8::/32"]);
    let p: Vec<String> = t
        .country_prefixes(&["CN".into()])
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(p, ["1.0.1.0/24", "1.0.2.0/23"]);
    let mut out = Vec::new();
    range_to_prefixes(0, u128::MAX, 128, &mut out);
    assert_eq!(out, ["::/0".parse::<IpNet>().unwrap()]);
    out.clear();
    range_to_prefixes(0, u128::from(u32::MAX), 32, &mut out);
    assert_eq!(out, ["0.0.0.0/0".parse::<IpNet>().unwrap()]);
}

#[test]
fn range_splitting_matches_a_brute_force_walk() {
    let mut rng = fastrand::Rng::with_seed(11);
    for _ in 0..2000 {
        let s = rng.u32(..) as u128 & 0xFFFF_FF00;
        let e = (s + rng.u128(0..100_000)).min(u128::from(u32::MAX));
        let mut out = Vec::new();
        range_to_prefixes(s, e, 32, &mut out);
        let mut next = s;
        for net in &out {
            let IpNet::V4(n) = net else { panic!() };
            assert_eq!(u128::from(u32::from(n.network())), next, "{out:?}");
            next = u128::from(u32::from(n.broadcast())) + 1;
        }
        assert_eq!(next, e + 1);
    }
}

#[test]
fn damaged_data_is_refused_never_a_panic() {
    let good = encode(
        &["CN", "US"],
        [
            &[(1, 5, 9), (1000, 2000, 4)],
            &[(7, 1 << 90, 3)],
            &[(0, 10, 1)],
            &[],
        ],
    );
    assert!(Table::decode(&good).is_ok());
    for cut in 0..good.len() {
        assert!(Table::decode(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..20_000 {
        let mut bad = good.clone();
        for _ in 0..rng.usize(1..4) {
            let i = rng.usize(..bad.len());
            bad[i] = rng.u8(..);
        }
        let _ = Table::decode(&bad);
    }
    // A country index past the codes, and an IPv4 range past 255.255.255.255.
    assert!(Table::decode(&encode(&["CN"], [&[], &[], &[(0, 1, 1)], &[]])).is_err());
    assert!(Table::decode(&encode(&[], [&[(0, 1 << 32, 1)], &[], &[], &[]])).is_err());
}

#[test]
fn the_shipped_table_decodes_and_agrees_with_its_header() {
    let t = shipped().unwrap();
    let a = about();
    assert_eq!((t.date(), t.source()), (a.date, a.source));
    assert!(a.source.contains("CC BY 4.0"), "{}", a.source);
    let [asn4, asn6, c4, c6] = t.counts();
    assert!(asn4 > 100_000 && asn6 > 10_000 && c4 > 50_000 && c6 > 10_000);
    // Each range answers for every address in it: check the prefixes of a few ASNs.
    for asn in [4134, 13335, 15169] {
        let nets = t.asn_prefixes(&[asn]);
        assert!(!nets.is_empty(), "AS{asn}");
        for n in nets.iter().step_by(nets.len() / 50 + 1) {
            for ip in [n.network(), n.broadcast()] {
                let hit = t.asn(ip).unwrap();
                assert_eq!(hit.value, asn, "{ip}");
                assert!(hit.prefix_len <= n.prefix_len(), "{ip} in {n}");
            }
        }
    }
}
