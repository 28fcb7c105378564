//! VRRPv3 advertisements (RFC 5798 §5) for IPv4 and IPv6, and the IPv4 header around them (an
//! IPv6 raw socket hands over the payload only; its addresses and hop limit come as ancillary
//! data, see `net`).
//!
//! Written by hand: the format is eight bytes and a list of addresses, and no maintained crate
//! parses VRRPv3 with the IPv4 pseudo-header checksum keepalived expects.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol number of VRRP.
pub const PROTO_VRRP: u8 = 112;
/// The IPv4 multicast group of VRRP (RFC 5798 §5.1.1.2).
pub const GROUP_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// The IPv6 multicast group of VRRP (RFC 5798 §5.1.2.2).
pub const GROUP_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// Adverts must be sent with, and are only accepted with, this TTL (RFC 5798 §5.1.1.3).
pub const TTL: u8 = 255;

const VERSION: u8 = 3;
const TYPE_ADVERTISEMENT: u8 = 1;
const HEADER_LEN: usize = 8;

/// One advertisement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    pub vrid: u8,
    pub priority: u8,
    /// Max Advertise Interval in centiseconds (12 bits).
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
    /// Not version 3 (VRRPv2 peers are not spoken to), or not an advertisement.
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
        let mut b = Vec::with_capacity(HEADER_LEN + 16 * count);
        b.push((VERSION << 4) | TYPE_ADVERTISEMENT);
        b.push(self.vrid);
        b.push(self.priority);
        b.push(count as u8);
        b.extend_from_slice(&(self.interval_cs & 0x0fff).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        for a in addresses {
            b.extend_from_slice(&octets(a));
        }
        let c = checksum(src, dst, &b);
        b[6..8].copy_from_slice(&c.to_be_bytes());
        b
    }

    /// Parses a VRRP message (no IP header) that came from `src` to `dst`.
    pub fn decode(src: IpAddr, dst: IpAddr, b: &[u8]) -> Result<Advert, Drop> {
        if b.len() < HEADER_LEN {
            return Err(Drop::Truncated);
        }
        if b[0] != (VERSION << 4) | TYPE_ADVERTISEMENT {
            return Err(Drop::Version);
        }
        let count = usize::from(b[3]);
        let width = if src.is_ipv4() { 4 } else { 16 };
        let len = HEADER_LEN + width * count;
        if b.len() < len {
            return Err(Drop::Truncated);
        }
        // The checksum covers the message as the sender built it; bytes after it (Ethernet
        // padding is already gone at this layer, but a longer IP payload is possible) are not
        // part of it.
        if checksum(src, dst, &b[..len]) != 0 {
            return Err(Drop::Checksum);
        }
        let addresses = b[HEADER_LEN..len]
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
            vrid: b[1],
            priority: b[2],
            interval_cs: u16::from_be_bytes([b[4], b[5]]) & 0x0fff,
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
    fn rejects_what_is_not_a_v3_advert() {
        let (s, d) = (ip("198.18.0.1"), IpAddr::V4(GROUP_V4));
        assert_eq!(Advert::decode(s, d, &[0x31; 4]), Err(Drop::Truncated));
        // VRRPv2.
        assert_eq!(
            Advert::decode(s, d, &[0x21, 1, 100, 0, 0, 1, 0, 0]),
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
