//! Whatever arrives on the VRRP raw socket (IP header and advert) is refused or accepted without
//! a panic, and an accepted advert survives re-encoding.
#![no_main]

use std::net::Ipv4Addr;

use fulcrum_ha::packet::{parse_ipv4, Advert};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse_ipv4(data) {
        let again = r.advert.encode(r.src, r.dst);
        assert_eq!(Advert::decode(r.src, r.dst, &again), Ok(r.advert));
    }
    // The advert decoder alone, from a fixed pair of addresses.
    let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(224, 0, 0, 18));
    if let Ok(a) = Advert::decode(src, dst, data) {
        assert_eq!(Advert::decode(src, dst, &a.encode(src, dst)), Ok(a));
    }
});
