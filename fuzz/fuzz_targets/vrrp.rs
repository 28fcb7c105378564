//! Whatever arrives on a VRRP raw socket is refused or accepted without a panic, and an accepted
//! advert survives re-encoding: an IPv4 datagram (header and advert), and an IPv6 payload (an
//! IPv6 raw socket hands over the advert alone).
#![no_main]

use std::net::{IpAddr, Ipv6Addr};

use fulcrum_ha::packet::{parse_ipv4, Advert, GROUP_V4, GROUP_V6};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse_ipv4(data) {
        let again = r.advert.encode(r.src, r.dst);
        assert_eq!(Advert::decode(r.src, r.dst, &again), Ok(r.advert));
    }
    let v4 = (IpAddr::from([198, 18, 0, 1]), IpAddr::V4(GROUP_V4));
    let v6 = (
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(GROUP_V6),
    );
    for (src, dst) in [v4, v6] {
        if let Ok(a) = Advert::decode(src, dst, data) {
            assert_eq!(Advert::decode(src, dst, &a.encode(src, dst)), Ok(a));
        }
    }
});
