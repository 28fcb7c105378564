//! The query side of the wire format, read by hand, and a response writer.
//!
//! A fast answer needs only the header, the one question and the OPT record (EDNS payload size,
//! Client Subnet). Decoding a whole `hickory_proto::op::Message` per query and encoding another
//! one back costs about as much CPU as gdnsd spends on the entire query, so the hot path reads
//! those few fields straight from the bytes and writes the response by copying pre-encoded
//! records. hickory-proto encodes those records at load time and checks this code in the tests.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Record types and classes the query path cares about.
pub const TYPE_A: u16 = 1;
pub const TYPE_NS: u16 = 2;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_SOA: u16 = 6;
pub const TYPE_HINFO: u16 = 13;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_OPT: u16 = 41;
pub const TYPE_ANY: u16 = 255;
pub const TYPE_AXFR: u16 = 252;
pub const TYPE_IXFR: u16 = 251;
pub const CLASS_IN: u16 = 1;
pub const CLASS_ANY: u16 = 255;
pub const OPTION_ECS: u16 = 8;

/// Response codes.
pub const RCODE_NOERROR: u8 = 0;
pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_NOTIMP: u8 = 4;
pub const RCODE_REFUSED: u8 = 5;
/// Extended rcode 16 (BADVERS): upper 8 bits in the OPT TTL, lower 4 (0) in the header.
pub const RCODE_BADVERS: u8 = 16;

/// Longest domain name in wire form.
pub const MAX_NAME: usize = 255;

/// EDNS Client Subnet as sent by the resolver (RFC 7871).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSubnet {
    pub family: u16,
    pub source_prefix: u8,
    /// The address, host bits beyond `source_prefix` zero.
    pub addr: IpAddr,
}

/// EDNS data of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edns {
    pub payload: u16,
    pub version: u8,
    pub ecs: Option<ClientSubnet>,
}

/// A query, as far as answering it needs.
#[derive(Debug, Clone, Copy)]
pub struct Query {
    pub id: u16,
    /// The header's second 16 bits as sent (opcode, RD, CD...).
    pub flags: u16,
    /// Question name: `len` bytes at offset 12 of the packet, as sent (case preserved).
    pub qname_len: usize,
    /// The same name lower-cased.
    pub lname: [u8; MAX_NAME],
    pub qtype: u16,
    pub qclass: u16,
    pub edns: Option<Edns>,
}

impl Query {
    pub fn lower_name(&self) -> &[u8] {
        &self.lname[..self.qname_len]
    }
    pub fn opcode(&self) -> u8 {
        ((self.flags >> 11) & 0xF) as u8
    }
    /// Offset just past the question in the packet.
    pub fn question_end(&self) -> usize {
        12 + self.qname_len + 4
    }
}

/// Why a packet could not be read as a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Not worth an answer (too short to echo, or a response): dropped.
    Drop,
    /// Answer FORMERR, echoing the header (and question, if `question` is set).
    FormErr { question: bool },
    /// A valid header with an opcode we do not implement.
    NotImp { question: bool },
}

fn u16_at(p: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(i)?, *p.get(i + 1)?]))
}

/// Reads an uncompressed name at `start`, lower-casing it into `out`; returns its wire length.
fn read_question_name(p: &[u8], start: usize, out: &mut [u8; MAX_NAME]) -> Option<usize> {
    let mut i = start;
    loop {
        let len = *p.get(i)? as usize;
        if len & 0xC0 != 0 {
            // Compression (or the reserved label types) in a question: no real client does it.
            return None;
        }
        let end = i + 1 + len;
        if end - start > MAX_NAME {
            return None;
        }
        let label = p.get(i..end)?;
        for (k, b) in label.iter().enumerate() {
            out[i - start + k] = if k == 0 { *b } else { b.to_ascii_lowercase() };
        }
        i = end;
        if len == 0 {
            return Some(i - start);
        }
    }
}

/// Skips a name (compressed or not) at `i`; returns the offset after it.
fn skip_name(p: &[u8], mut i: usize) -> Option<usize> {
    for _ in 0..128 {
        let len = *p.get(i)?;
        match len & 0xC0 {
            0x00 if len == 0 => return Some(i + 1),
            0x00 => i += 1 + len as usize,
            0xC0 => {
                p.get(i + 1)?;
                return Some(i + 2);
            }
            _ => return None,
        }
    }
    None
}

fn parse_ecs(o: &[u8]) -> Result<ClientSubnet, ()> {
    if o.len() < 4 {
        return Err(());
    }
    let family = u16::from_be_bytes([o[0], o[1]]);
    let source = o[2];
    let addr = &o[4..];
    let (max, width) = match family {
        1 => (32u8, 4usize),
        2 => (128, 16),
        _ => return Err(()),
    };
    if source > max || addr.len() != (source as usize).div_ceil(8) || addr.len() > width {
        return Err(());
    }
    let mut full = [0u8; 16];
    full[..addr.len()].copy_from_slice(addr);
    // Bits beyond the source prefix must be zero (RFC 7871 §6).
    if !source.is_multiple_of(8) {
        let last = addr.len() - 1;
        let mask = 0xFFu8 >> (source % 8);
        if full[last] & mask != 0 {
            return Err(());
        }
    }
    let ip = if family == 1 {
        IpAddr::V4(Ipv4Addr::new(full[0], full[1], full[2], full[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(full))
    };
    Ok(ClientSubnet {
        family,
        source_prefix: source,
        addr: ip,
    })
}

/// Reads a query packet. Anything beyond what answering needs is checked only as far as needed
/// to find the OPT record.
pub fn parse_query(p: &[u8]) -> Result<Query, Malformed> {
    if p.len() < 12 {
        return Err(Malformed::Drop);
    }
    let id = u16::from_be_bytes([p[0], p[1]]);
    let flags = u16::from_be_bytes([p[2], p[3]]);
    if flags & 0x8000 != 0 {
        // A response sent to us: answering it could start a loop between two servers.
        return Err(Malformed::Drop);
    }
    let qd = u16::from_be_bytes([p[4], p[5]]);
    let an = u16::from_be_bytes([p[6], p[7]]);
    let ns = u16::from_be_bytes([p[8], p[9]]);
    let ar = u16::from_be_bytes([p[10], p[11]]);
    let opcode = (flags >> 11) & 0xF;
    if qd != 1 {
        return Err(if opcode != 0 {
            Malformed::NotImp { question: false }
        } else {
            Malformed::FormErr { question: false }
        });
    }
    let mut lname = [0u8; MAX_NAME];
    let qname_len =
        read_question_name(p, 12, &mut lname).ok_or(Malformed::FormErr { question: false })?;
    let qend = 12 + qname_len;
    let (Some(qtype), Some(qclass)) = (u16_at(p, qend), u16_at(p, qend + 2)) else {
        return Err(Malformed::FormErr { question: false });
    };
    if opcode != 0 {
        return Err(Malformed::NotImp { question: true });
    }
    let bad = Malformed::FormErr { question: true };
    let mut i = qend + 4;
    // Answer and authority records have no place in a query; skip them all the same.
    for _ in 0..(u32::from(an) + u32::from(ns)) {
        i = skip_name(p, i).ok_or(bad)?;
        let rdlen = u16_at(p, i + 8).ok_or(bad)? as usize;
        i += 10 + rdlen;
        if i > p.len() {
            return Err(bad);
        }
    }
    let mut edns = None;
    for _ in 0..ar {
        let name_start = i;
        i = skip_name(p, i).ok_or(bad)?;
        let rtype = u16_at(p, i).ok_or(bad)?;
        let class = u16_at(p, i + 2).ok_or(bad)?;
        let ttl = p.get(i + 4..i + 8).ok_or(bad)?;
        let rdlen = u16_at(p, i + 8).ok_or(bad)? as usize;
        let rdata = p.get(i + 10..i + 10 + rdlen).ok_or(bad)?;
        i += 10 + rdlen;
        if rtype != TYPE_OPT {
            continue;
        }
        // One OPT, owned by the root (RFC 6891 §6.1.1).
        if edns.is_some() || p[name_start] != 0 {
            return Err(bad);
        }
        let mut e = Edns {
            payload: class.max(512),
            version: ttl[1],
            ecs: None,
        };
        let mut o = 0;
        while o < rdata.len() {
            let code = u16_at(rdata, o).ok_or(bad)?;
            let len = u16_at(rdata, o + 2).ok_or(bad)? as usize;
            let data = rdata.get(o + 4..o + 4 + len).ok_or(bad)?;
            if code == OPTION_ECS {
                if e.ecs.is_some() {
                    return Err(bad);
                }
                e.ecs = Some(parse_ecs(data).map_err(|_| bad)?);
            }
            o += 4 + len;
        }
        edns = Some(e);
    }
    Ok(Query {
        id,
        flags,
        qname_len,
        lname,
        qtype,
        qclass,
        edns,
    })
}

/// Writes a response into a caller-owned buffer (reused across queries: no allocation).
pub struct Writer<'a> {
    pub buf: &'a mut Vec<u8>,
    pub an: u16,
    pub ns: u16,
    pub ar: u16,
}

impl<'a> Writer<'a> {
    /// Starts a response to `q`: header (AA as asked, RD copied), question copied as sent.
    pub fn start(buf: &'a mut Vec<u8>, packet: &[u8], q: &Query, aa: bool, rcode: u8) -> Self {
        buf.clear();
        buf.extend_from_slice(&q.id.to_be_bytes());
        let flags =
            0x8000 | (q.flags & 0x7900) | if aa { 0x0400 } else { 0 } | u16::from(rcode & 0xF);
        buf.extend_from_slice(&flags.to_be_bytes());
        buf.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        buf.extend_from_slice(&packet[12..q.question_end()]);
        Writer {
            buf,
            an: 0,
            ns: 0,
            ar: 0,
        }
    }

    /// A header-only response (FORMERR / NOTIMP to something we could not fully read).
    pub fn header_only(buf: &mut Vec<u8>, packet: &[u8], rcode: u8, question_len: Option<usize>) {
        buf.clear();
        buf.extend_from_slice(&packet[..2]);
        let flags = u16::from_be_bytes([packet[2], packet[3]]);
        let flags = 0x8000 | (flags & 0x7900) | u16::from(rcode & 0xF);
        buf.extend_from_slice(&flags.to_be_bytes());
        match question_len {
            Some(len) => {
                buf.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
                buf.extend_from_slice(&packet[12..12 + len]);
            }
            None => buf.extend_from_slice(&[0; 8]),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn set_rcode(&mut self, rcode: u8) {
        self.buf[3] = (self.buf[3] & 0xF0) | (rcode & 0xF);
    }

    pub fn set_aa(&mut self, aa: bool) {
        if aa {
            self.buf[2] |= 0x04;
        } else {
            self.buf[2] &= !0x04;
        }
    }

    /// Writes an owner name: a compression pointer when the name sits at an offset a pointer can
    /// reach, else `fallback` written out.
    fn owner(&mut self, ptr: usize, fallback: &[u8]) {
        if ptr < 0x3FFF {
            self.buf
                .extend_from_slice(&(0xC000 | ptr as u16).to_be_bytes());
        } else {
            self.buf.extend_from_slice(fallback);
        }
    }

    /// Appends one record: owner (pointer to `ptr`, else `name`), then the pre-encoded
    /// `type class ttl rdlength rdata`. Returns the offset of the RDATA.
    pub fn record(&mut self, ptr: usize, name: &[u8], fixed_and_rdata: &[u8]) -> usize {
        self.owner(ptr, name);
        self.buf.extend_from_slice(fixed_and_rdata);
        self.buf.len() - (fixed_and_rdata.len() - 10)
    }

    /// Appends an address record with a given TTL.
    pub fn address(&mut self, ptr: usize, name: &[u8], ip: IpAddr, ttl: u32) {
        self.owner(ptr, name);
        match ip {
            IpAddr::V4(v4) => {
                self.buf.extend_from_slice(&TYPE_A.to_be_bytes());
                self.buf.extend_from_slice(&CLASS_IN.to_be_bytes());
                self.buf.extend_from_slice(&ttl.to_be_bytes());
                self.buf.extend_from_slice(&4u16.to_be_bytes());
                self.buf.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.buf.extend_from_slice(&TYPE_AAAA.to_be_bytes());
                self.buf.extend_from_slice(&CLASS_IN.to_be_bytes());
                self.buf.extend_from_slice(&ttl.to_be_bytes());
                self.buf.extend_from_slice(&16u16.to_be_bytes());
                self.buf.extend_from_slice(&v6.octets());
            }
        }
    }

    /// Appends the OPT record: our payload size, extended rcode, and the Client Subnet echo with
    /// the scope actually used.
    pub fn opt(&mut self, payload: u16, ext_rcode: u8, ecs: Option<(ClientSubnet, u8)>) {
        self.buf.push(0);
        self.buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
        self.buf.extend_from_slice(&payload.to_be_bytes());
        self.buf.extend_from_slice(&[ext_rcode, 0, 0, 0]);
        match ecs {
            Some((e, scope)) => {
                let alen = (e.source_prefix as usize).div_ceil(8);
                let olen = 4 + alen;
                self.buf
                    .extend_from_slice(&((4 + olen) as u16).to_be_bytes());
                self.buf.extend_from_slice(&OPTION_ECS.to_be_bytes());
                self.buf.extend_from_slice(&(olen as u16).to_be_bytes());
                self.buf.extend_from_slice(&e.family.to_be_bytes());
                self.buf.push(e.source_prefix);
                self.buf.push(scope);
                match e.addr {
                    IpAddr::V4(v4) => self.buf.extend_from_slice(&v4.octets()[..alen]),
                    IpAddr::V6(v6) => self.buf.extend_from_slice(&v6.octets()[..alen]),
                }
            }
            None => self.buf.extend_from_slice(&0u16.to_be_bytes()),
        }
        self.ar += 1;
    }

    /// Writes the section counts into the header.
    pub fn finish(self) {
        self.buf[6..8].copy_from_slice(&self.an.to_be_bytes());
        self.buf[8..10].copy_from_slice(&self.ns.to_be_bytes());
        self.buf[10..12].copy_from_slice(&self.ar.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns as HEdns, Message, Query as HQuery};
    use hickory_proto::rr::rdata::opt::{ClientSubnet as HSubnet, EdnsOption};
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str, t: RecordType, ecs: Option<&str>) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0x1234;
        m.metadata.recursion_desired = true;
        m.add_query(HQuery::query(Name::from_ascii(name).unwrap(), t));
        if let Some(net) = ecs {
            let mut e = HEdns::new();
            e.set_max_payload(1400);
            e.options_mut().insert(EdnsOption::Subnet(HSubnet::from(
                net.parse::<ipnet::IpNet>().unwrap(),
            )));
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn reads_question_and_client_subnet() {
        let p = query(
            "WwW.Example.com.",
            RecordType::AAAA,
            Some("198.51.100.0/24"),
        );
        let q = parse_query(&p).unwrap();
        assert_eq!(q.id, 0x1234);
        assert_eq!(q.qtype, 28);
        assert_eq!(q.lower_name(), b"\x03www\x07example\x03com\x00");
        let e = q.edns.unwrap();
        assert_eq!(e.payload, 1400);
        assert_eq!(
            e.ecs.unwrap(),
            ClientSubnet {
                family: 1,
                source_prefix: 24,
                addr: "198.51.100.0".parse().unwrap()
            }
        );
    }

    #[test]
    fn response_decodes_with_hickory() {
        let p = query("www.example.com.", RecordType::A, Some("2001:db8::/48"));
        let q = parse_query(&p).unwrap();
        let mut buf = Vec::new();
        let mut w = Writer::start(&mut buf, &p, &q, true, RCODE_NOERROR);
        w.address(12, &[], "192.0.2.7".parse().unwrap(), 30);
        w.an += 1;
        w.opt(1232, 0, Some((q.edns.unwrap().ecs.unwrap(), 48)));
        w.finish();
        let m = Message::from_vec(&buf).unwrap();
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].name.to_ascii(), "www.example.com.");
        let edns = m.edns.unwrap();
        let Some(EdnsOption::Subnet(s)) = edns
            .options()
            .get(hickory_proto::rr::rdata::opt::EdnsCode::Subnet)
        else {
            panic!("no subnet");
        };
        assert_eq!(s.scope_prefix(), 48);
    }

    #[test]
    fn malformed_inputs() {
        assert_eq!(parse_query(&[0; 5]).unwrap_err(), Malformed::Drop);
        let mut p = query("a.", RecordType::A, None);
        p[2] |= 0x80;
        assert_eq!(parse_query(&p).unwrap_err(), Malformed::Drop);
        let mut p = query("a.", RecordType::A, None);
        p.truncate(p.len() - 1);
        assert!(matches!(parse_query(&p), Err(Malformed::FormErr { .. })));
        // ECS with host bits set beyond the source prefix.
        let p = query("a.", RecordType::A, Some("10.0.0.0/12"));
        let mut bad = p.clone();
        let n = bad.len();
        bad[n - 1] = 0xFF;
        assert!(matches!(parse_query(&bad), Err(Malformed::FormErr { .. })));
    }
}
