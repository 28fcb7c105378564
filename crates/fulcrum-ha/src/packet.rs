//! VRRPv3 advertisements (RFC 5798 §5) for IPv4 and IPv6, VRRPv2 advertisements (RFC 3768 §5,
//! IPv4 only: keepalived's default) and the IPv4 header around them (an IPv6 raw socket hands
//! over the payload only; its addresses and hop limit come as ancillary data, see `net`).
//!
//! Written by hand: the format is eight bytes and a list of addresses, and no maintained crate
//! parses VRRPv3 with the IPv4 pseudo-header checksum keepalived expects.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// VRRPv3's smallest advertisement interval (one centisecond).
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// IP protocol number of VRRP.
pub const PROTO_VRRP: u8 = 112;
/// The IPv4 multicast group of VRRP (RFC 5798 §5.1.1.2).
pub const GROUP_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// The IPv6 multicast group of VRRP (RFC 5798 §5.1.2.2).
pub const GROUP_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// Adverts must be sent with, and are only accepted with, this TTL (RFC 5798 §5.1.1.3).
pub const TTL: u8 = 255;

const TYPE_ADVERTISEMENT: u8 = 1;
const HEADER_LEN: usize = 8;
/// VRRPv2's authentication data after the addresses (RFC 3768 §5.3.10): sent as zeros with
/// authentication type 0, the only type RFC 3768 keeps (types 1 and 2 were removed).
const V2_AUTH_LEN: usize = 8;

/// One advertisement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// 3 (RFC 5798) or 2 (RFC 3768, IPv4 only; its interval is whole seconds on the wire).
    pub version: u8,
    pub vrid: u8,
    pub priority: u8,
    /// Max Advertise Interval in centiseconds (12 bits); a VRRPv2 interval (seconds) is read as
    /// 100 × its value.
    pub interval_cs: u16,
    /// All of one family: the family of the packet that carries them.
    pub addresses: Vec<IpAddr>,
}

/// Why a received packet was dropped; each reason has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Shorter than its headers or its address count says.
    Truncated,
    /// Not an IPv4 packet of protocol 112.
    NotVrrp,
    /// TTL (hop limit) is not 255: the packet crossed a router.
    Ttl,
    /// Neither version 3 nor version 2 over IPv4, or not an advertisement; also an advert of
    /// the other version than the node runs (counted by the node, not by the parser).
    Version,
    Checksum,
}

impl Drop {
    pub fn as_str(self) -> &'static str {
        match self {
            Drop::Truncated => "truncated",
            Drop::NotVrrp => "not_vrrp",
            Drop::Ttl => "ttl",
            Drop::Version => "version",
            Drop::Checksum => "checksum",
        }
    }
}

/// Ones' complement sum (RFC 1071) of `data`, folded into `acc`.
fn sum16(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

fn octets(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The VRRPv3 checksum over `vrrp` with the pseudo-header of the packet's family (RFC 5798
/// §5.2.8): IPv4 source, destination, zero, protocol 112, length (RFC 768 style); IPv6 source,
/// destination, 32-bit length, zeros, next header 112 (RFC 8200 §8.1). A message that carries a
/// correct checksum sums to 0.
pub fn checksum(src: IpAddr, dst: IpAddr, vrrp: &[u8]) -> u16 {
    let mut acc = sum16(0, &octets(&src));
    acc = sum16(acc, &octets(&dst));
    acc += u32::from(PROTO_VRRP);
    let len = vrrp.len() as u32;
    acc += (len >> 16) + (len & 0xffff);
    fold(sum16(acc, vrrp))
}

impl Advert {
    /// The VRRP message (no IP header) sent from `src` to `dst`, checksum filled in. Addresses
    /// of the other family than `src` are left out.
    pub fn encode(&self, src: IpAddr, dst: IpAddr) -> Vec<u8> {
        let addresses: Vec<&IpAddr> = self
            .addresses
            .iter()
            .filter(|a| a.is_ipv4() == src.is_ipv4())
            .take(255)
            .collect();
        let count = addresses.len();
        let mut b = Vec::with_capacity(HEADER_LEN + 16 * count + V2_AUTH_LEN);
        b.push((self.version << 4) | TYPE_ADVERTISEMENT);
        b.push(self.vrid);
        b.push(self.priority);
        b.push(count as u8);
        if self.version == 2 {
            // Authentication type 0, then the interval in whole seconds (at least 1).
            b.push(0);
            b.push((self.interval_cs / 100).clamp(1, 255) as u8);
        } else {
            b.extend_from_slice(&(self.interval_cs & 0x0fff).to_be_bytes());
        }
        b.extend_from_slice(&[0, 0]);
        for a in addresses {
            b.extend_from_slice(&octets(a));
        }
        let c = if self.version == 2 {
            // VRRPv2's checksum covers the VRRP message alone, no pseudo-header.
            b.extend_from_slice(&[0; V2_AUTH_LEN]);
            fold(sum16(0, &b))
        } else {
            checksum(src, dst, &b)
        };
        b[6..8].copy_from_slice(&c.to_be_bytes());
        b
    }

    /// Parses a VRRP message (no IP header) that came from `src` to `dst`.
    pub fn decode(src: IpAddr, dst: IpAddr, b: &[u8]) -> Result<Advert, Drop> {
        if b.len() < HEADER_LEN {
            return Err(Drop::Truncated);
        }
        let version = b[0] >> 4;
        if b[0] & 0x0f != TYPE_ADVERTISEMENT || !(version == 3 || version == 2 && src.is_ipv4()) {
            return Err(Drop::Version);
        }
        let count = usize::from(b[3]);
        let width = if src.is_ipv4() { 4 } else { 16 };
        let addresses_end = HEADER_LEN + width * count;
        let len = if version == 2 {
            addresses_end + V2_AUTH_LEN
        } else {
            addresses_end
        };
        if b.len() < len {
            return Err(Drop::Truncated);
        }
        // The checksum covers the message as the sender built it; bytes after it (Ethernet
        // padding is already gone at this layer, but a longer IP payload is possible) are not
        // part of it.
        let sum = if version == 2 {
            fold(sum16(0, &b[..len]))
        } else {
            checksum(src, dst, &b[..len])
        };
        if sum != 0 {
            return Err(Drop::Checksum);
        }
        let interval_cs = if version == 2 {
            // 0 is not a VRRPv2 interval: read it as the protocol's default of 1 s, the least
            // a sender can mean (and what this side would send back).
            u16::from(b[5]).max(1) * 100
        } else {
            u16::from_be_bytes([b[4], b[5]]) & 0x0fff
        };
        let addresses = b[HEADER_LEN..addresses_end]
            .chunks_exact(width)
            .map(|c| match <[u8; 4]>::try_from(c) {
                Ok(v4) => IpAddr::from(v4),
                Err(_) => {
                    let mut v6 = [0u8; 16];
                    v6.copy_from_slice(c);
                    IpAddr::from(v6)
                }
            })
            .collect();
        Ok(Advert {
            version,
            vrid: b[1],
            priority: b[2],
            interval_cs,
            addresses,
        })
    }
}

/// A received IPv4 datagram of protocol 112: source, destination and the advert in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub advert: Advert,
}

/// Parses what a raw IPv4 socket hands over: the IP header, then VRRP.
pub fn parse_ipv4(b: &[u8]) -> Result<Received, Drop> {
    if b.len() < 20 {
        return Err(Drop::Truncated);
    }
    if b[0] >> 4 != 4 || b[9] != PROTO_VRRP {
        return Err(Drop::NotVrrp);
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
    if ihl < 20 || b.len() < ihl || total < ihl {
        return Err(Drop::Truncated);
    }
    if b[8] != TTL {
        return Err(Drop::Ttl);
    }
    let src = IpAddr::from([b[12], b[13], b[14], b[15]]);
    let dst = IpAddr::from([b[16], b[17], b[18], b[19]]);
    let end = total.min(b.len());
    let advert = Advert::decode(src, dst, &b[ihl..end])?;
    Ok(Received { src, dst, advert })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    /// An IPv4 header (checksum left 0: the kernel checked it before a raw socket sees it).
    fn ipv4(src: IpAddr, dst: IpAddr, ttl: u8, payload: &[u8]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 0, 0, 0, 0, 0, ttl, PROTO_VRRP, 0, 0];
        let total = (20 + payload.len()) as u16;
        h[2..4].copy_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&octets(&src));
        h.extend_from_slice(&octets(&dst));
        h.extend_from_slice(payload);
        h
    }

    #[test]
    fn round_trip_and_checksum() {
        let a = Advert {
            version: 3,
            vrid: 51,
            priority: 150,
            interval_cs: 10,
            addresses: vec![ip("198.18.0.100"), ip("198.18.0.101")],
        };
        let (s, d) = (ip("198.18.0.1"), IpAddr::V4(GROUP_V4));
        let b = a.encode(s, d);
        assert_eq!(b.len(), 16);
        assert_eq!(Advert::decode(s, d, &b), Ok(a.clone()));
        // The pseudo-header counts: the same bytes from another source do not verify.
        assert_eq!(Advert::decode(ip("198.18.0.2"), d, &b), Err(Drop::Checksum));
        let mut bad = b.clone();
        bad[2] ^= 1;
        assert_eq!(Advert::decode(s, d, &bad), Err(Drop::Checksum));
        let r = parse_ipv4(&ipv4(s, d, 255, &b)).expect("parse");
        assert_eq!((r.src, r.dst, r.advert), (s, d, a));
        assert_eq!(parse_ipv4(&ipv4(s, d, 254, &b)), Err(Drop::Ttl));
    }

    /// The advert keepalived sends at its defaults (vrid 51, priority 100, advert_int 1, one VIP);
    /// the interoperability tests check the real thing on the wire.
    #[test]
    fn accepts_an_advert_with_keepalived_defaults() {
        let vrrp = [
            0x31, 0x33, 0x64, 0x01, 0x00, 0x64, 0x00, 0x00, 198, 18, 0, 100,
        ];
        let mut vrrp = vrrp.to_vec();
        let c = checksum(ip("198.18.0.2"), IpAddr::V4(GROUP_V4), &vrrp);
        vrrp[6..8].copy_from_slice(&c.to_be_bytes());
        let a = Advert::decode(ip("198.18.0.2"), IpAddr::V4(GROUP_V4), &vrrp).expect("decode");
        assert_eq!(
            (a.vrid, a.priority, a.interval_cs, a.addresses.len()),
            (51, 100, 100, 1)
        );
    }

    #[test]
    fn vrrpv2_layout_round_trip_and_checksum() {
        let a = Advert {
            version: 2,
            vrid: 51,
            priority: 100,
            interval_cs: 100,
            addresses: vec![ip("198.18.0.100")],
        };
        let (s, d) = (ip("198.18.0.1"), IpAddr::V4(GROUP_V4));
        let b = a.encode(s, d);
        // RFC 3768 §5.1: version/type, VRID, priority, count, auth type 0, interval 1 s,
        // checksum, the address, 8 bytes of authentication data.
        assert_eq!(b.len(), 8 + 4 + 8);
        assert_eq!(&b[..6], &[0x21, 51, 100, 1, 0, 1]);
        assert_eq!(&b[8..12], &[198, 18, 0, 100]);
        assert_eq!(&b[12..], &[0; 8]);
        // The checksum is over the message alone: any pseudo-header would change it.
        assert_eq!(fold(sum16(0, &b)), 0);
        assert_eq!(Advert::decode(s, d, &b), Ok(a.clone()));
        assert_eq!(
            Advert::decode(ip("198.18.0.9"), ip("198.18.0.2"), &b),
            Ok(a.clone())
        );
        let mut bad = b.clone();
        bad[2] = 101;
        assert_eq!(Advert::decode(s, d, &bad), Err(Drop::Checksum));
        // Sub-second intervals cannot be said in VRRPv2: whole seconds, at least one.
        let fast = Advert {
            interval_cs: 10,
            ..a.clone()
        };
        assert_eq!(fast.encode(s, d)[5], 1);
        let slow = Advert {
            interval_cs: 300,
            ..a
        };
        assert_eq!(
            Advert::decode(s, d, &slow.encode(s, d)).map(|x| x.interval_cs),
            Ok(300)
        );
    }

    #[test]
    fn rejects_what_is_not_an_advert() {
        let (s, d) = (ip("198.18.0.1"), IpAddr::V4(GROUP_V4));
        assert_eq!(Advert::decode(s, d, &[0x31; 4]), Err(Drop::Truncated));
        // VRRPv1, and a VRRPv3 message of type 2.
        assert_eq!(
            Advert::decode(s, d, &[0x11, 1, 100, 0, 0, 1, 0, 0]),
            Err(Drop::Version)
        );
        assert_eq!(
            Advert::decode(s, d, &[0x32, 1, 100, 0, 0, 1, 0, 0]),
            Err(Drop::Version)
        );
        // VRRPv2 without its 8 bytes of authentication data.
        assert_eq!(
            Advert::decode(s, d, &[0x21, 1, 100, 0, 0, 1, 0, 0]),
            Err(Drop::Truncated)
        );
        // VRRPv2 exists for IPv4 only.
        let (s6, d6) = (ip("2001:db8::1"), IpAddr::V6(GROUP_V6));
        assert_eq!(
            Advert::decode(s6, d6, &[0x21, 1, 100, 0, 0, 1, 0, 0]),
            Err(Drop::Version)
        );
        // Count says 3 addresses, one present.
        assert_eq!(
            Advert::decode(s, d, &[0x31, 1, 100, 3, 0, 100, 0, 0, 1, 2, 3, 4]),
            Err(Drop::Truncated)
        );
        assert_eq!(parse_ipv4(&[0x45; 10]), Err(Drop::Truncated));
        let mut not_vrrp = ipv4(s, d, 255, &[0; 8]);
        not_vrrp[9] = 6;
        assert_eq!(parse_ipv4(&not_vrrp), Err(Drop::NotVrrp));
        // An IHL that points past the buffer.
        let mut long_ihl = ipv4(s, d, 255, &[]);
        long_ihl[0] = 0x4f;
        assert_eq!(parse_ipv4(&long_ihl), Err(Drop::Truncated));
    }

    /// What the fuzz target checks, on a fixed budget: random bytes and single-byte mutations
    /// of a valid packet never panic, and whatever parses survives re-encoding.
    #[test]
    fn mutated_packets_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (s, d) = (ip("198.18.0.1"), IpAddr::V4(GROUP_V4));
        let valid = ipv4(
            s,
            d,
            255,
            &Advert {
                version: 3,
                vrid: 7,
                priority: 100,
                interval_cs: 100,
                addresses: vec![ip("198.18.0.100")],
            }
            .encode(s, d),
        );
        let mut parsed = 0;
        for i in 0..200_000 {
            let mut b = if i % 2 == 0 {
                valid.clone()
            } else {
                (0..(next() % 64)).map(|_| next() as u8).collect()
            };
            if !b.is_empty() {
                let at = (next() as usize) % b.len();
                b[at] = next() as u8;
                b.truncate(b.len() - (next() as usize % 3).min(b.len()));
            }
            if let Ok(r) = parse_ipv4(&b) {
                parsed += 1;
                let again = r.advert.encode(r.src, r.dst);
                assert_eq!(Advert::decode(r.src, r.dst, &again), Ok(r.advert));
            }
        }
        assert!(parsed > 0);
    }
}
