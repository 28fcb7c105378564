//! Frame builder for the fixtures and the benchmark: every header and checksum computed from
//! scratch (RFC 1071 over the whole header / pseudo-header), independently of the data plane's
//! incremental updates, so a byte-exact comparison also verifies those.

use std::net::IpAddr;

pub const ETH_IP: u16 = 0x0800;
pub const ETH_IPV6: u16 = 0x86dd;
pub const ETH_ARP: u16 = 0x0806;
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const ICMPV6: u8 = 58;

pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;

/// RFC 1071 one's-complement sum folded to 16 bits (not inverted).
pub fn sum16(data: &[u8], mut acc: u64) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

pub fn checksum(data: &[u8]) -> u16 {
    !sum16(data, 0)
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Checksum of an L4 segment with the IPv4/IPv6 pseudo-header.
pub fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, segment: &[u8]) -> u16 {
    let mut pseudo = addr_bytes(src);
    pseudo.extend(addr_bytes(dst));
    let len = segment.len() as u32;
    if src.is_ipv4() {
        pseudo.extend([0, proto]);
        pseudo.extend((len as u16).to_be_bytes());
    } else {
        pseudo.extend(len.to_be_bytes());
        pseudo.extend([0, 0, 0, proto]);
    }
    let acc = u64::from(sum16(&pseudo, 0));
    !sum16(segment, acc)
}

/// The sequence number `tcp` gives every segment.
pub const SEQ: u32 = 0x0102_0304;
/// The acknowledgment number `tcp` gives segments with ACK.
pub const ACK_SEQ: u32 = 0x0506_0708;

pub fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let ack = if flags & ACK != 0 { ACK_SEQ } else { 0 };
    tcp_seq(src, sport, dst, dport, flags, (SEQ, ack), payload)
}

/// A TCP segment with the given (sequence, acknowledgment) numbers.
pub fn tcp_seq(
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
    flags: u8,
    (seq, ack): (u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut s = Vec::with_capacity(20 + payload.len());
    s.extend(sport.to_be_bytes());
    s.extend(dport.to_be_bytes());
    s.extend(seq.to_be_bytes());
    s.extend(ack.to_be_bytes());
    s.extend([5 << 4, flags]);
    s.extend(64240u16.to_be_bytes());
    s.extend([0, 0, 0, 0]); // checksum, urgent
    s.extend(payload);
    let c = l4_checksum(src, dst, TCP, &s);
    s[16..18].copy_from_slice(&c.to_be_bytes());
    s
}

pub fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(8 + payload.len());
    s.extend(sport.to_be_bytes());
    s.extend(dport.to_be_bytes());
    s.extend(((8 + payload.len()) as u16).to_be_bytes());
    s.extend([0, 0]);
    s.extend(payload);
    let mut c = l4_checksum(src, dst, UDP, &s);
    if c == 0 {
        c = 0xffff;
    }
    s[6..8].copy_from_slice(&c.to_be_bytes());
    s
}

/// IPv4 header fields the fixtures vary.
#[derive(Clone, Debug)]
pub struct V4 {
    pub tos: u8,
    pub id: u16,
    pub frag: u16,
    pub ttl: u8,
    pub options: Vec<u8>,
}

impl Default for V4 {
    fn default() -> V4 {
        V4 {
            tos: 0,
            id: 0x1234,
            frag: 0x4000, // DF
            ttl: 64,
            options: Vec::new(),
        }
    }
}

pub fn ipv4(src: IpAddr, dst: IpAddr, proto: u8, payload: &[u8], f: &V4) -> Vec<u8> {
    let hl = 20 + f.options.len();
    let mut h = Vec::with_capacity(hl + payload.len());
    h.push(0x40 | (hl / 4) as u8);
    h.push(f.tos);
    h.extend(((hl + payload.len()) as u16).to_be_bytes());
    h.extend(f.id.to_be_bytes());
    h.extend(f.frag.to_be_bytes());
    h.extend([f.ttl, proto, 0, 0]);
    h.extend(addr_bytes(src));
    h.extend(addr_bytes(dst));
    h.extend(&f.options);
    let c = checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend(payload);
    h
}

pub fn ipv6(src: IpAddr, dst: IpAddr, next: u8, payload: &[u8], tc: u8, label: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(40 + payload.len());
    let first = (6u32 << 28) | (u32::from(tc) << 20) | (label & 0xfffff);
    h.extend(first.to_be_bytes());
    h.extend((payload.len() as u16).to_be_bytes());
    h.extend([next, 64]);
    h.extend(addr_bytes(src));
    h.extend(addr_bytes(dst));
    h.extend(payload);
    h
}

/// An IP packet (v4 with default header fields, or v6) around an L4 segment.
pub fn ip(src: IpAddr, dst: IpAddr, proto: u8, segment: &[u8]) -> Vec<u8> {
    if src.is_ipv4() {
        ipv4(src, dst, proto, segment, &V4::default())
    } else {
        ipv6(src, dst, proto, segment, 0, 0)
    }
}

pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend(dst);
    f.extend(src);
    f.extend(ethertype.to_be_bytes());
    f.extend(payload);
    f
}

pub fn ethertype(a: IpAddr) -> u16 {
    if a.is_ipv4() {
        ETH_IP
    } else {
        ETH_IPV6
    }
}

/// ICMP (v4) message with type, code, the 4 "rest" bytes and the quoted packet.
pub fn icmp4(ty: u8, code: u8, rest: [u8; 4], quoted: &[u8]) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0];
    m.extend(rest);
    m.extend(quoted);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

pub fn icmp6(src: IpAddr, dst: IpAddr, ty: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0];
    m.extend(rest);
    m.extend(body);
    let c = l4_checksum(src, dst, ICMPV6, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}
