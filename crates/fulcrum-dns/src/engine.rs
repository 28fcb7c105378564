//! Answering: one query in, one response out, into a reused buffer.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::catalog::{in_zone, Catalog, Node};
use crate::gslb::GslbState;
use crate::rrl::{Rrl, Verdict};
use crate::wire::*;

/// How many CNAMEs an answer follows inside our zones.
const MAX_CHAIN: usize = 8;

/// Transport a query came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Counters of one worker (a UDP socket thread, or the TCP side): summed at scrape time, so no
/// cache line is shared between cores on the hot path.
#[derive(Debug, Default)]
pub struct Counters {
    pub udp_queries: AtomicU64,
    pub tcp_queries: AtomicU64,
    /// Responses by rcode (0..=15, and 16 for BADVERS).
    pub rcodes: [AtomicU64; 17],
    /// Packets dropped without an answer (too short, a response, unreadable).
    pub dropped: AtomicU64,
    /// UDP responses sent truncated (TC) because they did not fit.
    pub truncated: AtomicU64,
    pub rrl_dropped: AtomicU64,
    pub rrl_slipped: AtomicU64,
}

impl Counters {
    fn rcode(&self, rc: u8) {
        if let Some(c) = self.rcodes.get(rc as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the server should do with the buffer after `answer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    Drop,
}

/// Everything answering needs, swapped whole on reload.
pub struct Engine {
    pub catalog: Catalog,
    pub gslb: Arc<GslbState>,
    /// Largest UDP response to an EDNS client.
    pub udp_payload: u16,
    pub rrl: Option<Arc<Rrl>>,
}

/// The client address GSLB should use, and the ECS option to echo.
struct Ecs {
    peer: IpAddr,
    subnet: Option<ClientSubnet>,
    scope: u8,
}

impl Engine {
    /// Answers `packet` from `peer` into `out`.
    pub fn answer(
        &self,
        packet: &[u8],
        peer: IpAddr,
        transport: Transport,
        out: &mut Vec<u8>,
        stats: &Counters,
    ) -> Action {
        match transport {
            Transport::Udp => stats.udp_queries.fetch_add(1, Ordering::Relaxed),
            Transport::Tcp => stats.tcp_queries.fetch_add(1, Ordering::Relaxed),
        };
        let q = match parse_query(packet) {
            Ok(q) => q,
            Err(Malformed::Drop) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                return Action::Drop;
            }
            Err(m) => {
                let (rc, question) = match m {
                    Malformed::NotImp { question } => (RCODE_NOTIMP, question),
                    Malformed::FormErr { question } => (RCODE_FORMERR, question),
                    Malformed::Drop => (RCODE_FORMERR, false),
                };
                let qlen = if question { question_len(packet) } else { None };
                Writer::header_only(out, packet, rc, qlen);
                stats.rcode(rc);
                return self.limit(peer, transport, out, stats);
            }
        };
        if let Some(e) = q.edns {
            if e.version != 0 {
                let mut w = Writer::start(out, packet, &q, false, 0);
                w.opt(self.udp_payload, RCODE_BADVERS >> 4, None);
                w.finish();
                stats.rcode(RCODE_BADVERS);
                return self.limit(peer, transport, out, stats);
            }
        }
        let rcode = self.resolve(packet, &q, peer, transport, out);
        stats.rcode(rcode);
        {
            let limit = match (transport, q.edns) {
                // A TCP message's length is a 16-bit field.
                (Transport::Tcp, _) => usize::from(u16::MAX),
                (Transport::Udp, Some(e)) => e.payload.min(self.udp_payload).max(512) as usize,
                (Transport::Udp, None) => 512,
            };
            if out.len() > limit {
                stats.truncated.fetch_add(1, Ordering::Relaxed);
                self.truncated(packet, &q, out);
            }
        }
        self.limit(peer, transport, out, stats)
    }

    /// Response rate limiting (UDP only: a TCP client has proven its address).
    fn limit(
        &self,
        peer: IpAddr,
        transport: Transport,
        out: &mut Vec<u8>,
        stats: &Counters,
    ) -> Action {
        let Some(rrl) = &self.rrl else {
            return Action::Send;
        };
        if transport == Transport::Tcp {
            return Action::Send;
        }
        match rrl.check(peer) {
            Verdict::Pass => Action::Send,
            Verdict::Drop => {
                stats.rrl_dropped.fetch_add(1, Ordering::Relaxed);
                Action::Drop
            }
            Verdict::Slip => {
                // A truncated empty answer: a real client retries over TCP, a spoofed victim
                // gets nothing bigger than the query.
                stats.rrl_slipped.fetch_add(1, Ordering::Relaxed);
                if out.len() >= 12 {
                    let qd = u16::from_be_bytes([out[4], out[5]]);
                    let keep = if qd == 1 {
                        12 + question_len_at(out).unwrap_or(0)
                    } else {
                        12
                    };
                    out.truncate(keep);
                    out[2] |= 0x02;
                    out[6..12].fill(0);
                    if qd == 1 && keep == 12 {
                        out[4..6].fill(0);
                    }
                }
                Action::Send
            }
        }
    }

    /// Replaces the response by an empty one with TC set (and the OPT): the client retries
    /// over TCP.
    fn truncated(&self, packet: &[u8], q: &Query, out: &mut Vec<u8>) {
        let rcode = out[3] & 0xF;
        let aa = out[2] & 0x04 != 0;
        let mut w = Writer::start(out, packet, q, aa, rcode);
        w.buf[2] |= 0x02;
        if let Some(e) = q.edns {
            w.opt(self.udp_payload, 0, e.ecs.map(|s| (s, 0)));
        }
        w.finish();
    }

    fn resolve(
        &self,
        packet: &[u8],
        q: &Query,
        peer: IpAddr,
        transport: Transport,
        out: &mut Vec<u8>,
    ) -> u8 {
        let mut ecs = Ecs {
            peer,
            subnet: q.edns.and_then(|e| e.ecs),
            scope: 0,
        };
        if q.qclass != CLASS_IN && q.qclass != CLASS_ANY {
            return self.refuse(packet, q, &ecs, out);
        }
        if q.qtype == TYPE_AXFR || q.qtype == TYPE_IXFR {
            // Zone transfers are not offered.
            return self.refuse(packet, q, &ecs, out);
        }
        let Some(zone) = self.catalog.zone_of(q.lower_name()) else {
            return self.refuse(packet, q, &ecs, out);
        };
        let mut w = Writer::start(out, packet, q, true, RCODE_NOERROR);
        let rcode = self.answer_chain(&mut w, q, transport, zone, &mut ecs);
        w.set_rcode(rcode);
        if q.edns.is_some() {
            let echo = ecs
                .subnet
                .map(|s| (s, ecs.scope.min(if s.family == 1 { 32 } else { 128 })));
            w.opt(self.udp_payload, 0, echo);
        }
        w.finish();
        rcode
    }

    fn refuse(&self, packet: &[u8], q: &Query, ecs: &Ecs, out: &mut Vec<u8>) -> u8 {
        let mut w = Writer::start(out, packet, q, false, RCODE_REFUSED);
        if q.edns.is_some() {
            w.opt(self.udp_payload, 0, ecs.subnet.map(|s| (s, 0)));
        }
        w.finish();
        RCODE_REFUSED
    }

    /// Answers the query's name (in `zone`), following CNAMEs through the zones served for up
    /// to `MAX_CHAIN` hops; returns the rcode.
    fn answer_chain(
        &self,
        w: &mut Writer<'_>,
        q: &Query,
        transport: Transport,
        mut zone: u16,
        ecs: &mut Ecs,
    ) -> u8 {
        let lname = q.lower_name();
        // The name being answered: where it sits in the response (for compression pointers) and
        // its lower-case wire form.
        let mut name_at = 12usize;
        let mut name_buf = [0u8; MAX_NAME];
        name_buf[..lname.len()].copy_from_slice(lname);
        let mut name_len = lname.len();
        for hop in 0..=MAX_CHAIN {
            let name = &name_buf[..name_len];
            if let Some(cut) = self.catalog.cut_above(name, zone) {
                if hop == 0 {
                    self.referral(w, name_at, name, cut);
                }
                break;
            }
            let node = match self.catalog.node(name) {
                Some(n) => Some(n),
                None => self.catalog.wildcard(name, zone).map(|(n, _)| n),
            };
            let Some(node) = node else {
                self.negative(w, zone, name_at, name);
                return RCODE_NXDOMAIN;
            };
            // A GSLB name answers addresses by site; other types from the zone's data.
            if let Some(gi) = node.gslb {
                let wrote = self.gslb_addresses(w, q, ecs, gi as usize, name_at, name)
                    || self.rrset_of(w, name_at, name, node, q.qtype);
                if !wrote {
                    self.negative(w, zone, name_at, name);
                }
                break;
            }
            if q.qtype == TYPE_ANY {
                self.answer_any(w, transport, node, zone, name_at, name);
                break;
            }
            if self.rrset_of(w, name_at, name, node, q.qtype) {
                break;
            }
            let Some(cname) = node.get(TYPE_CNAME) else {
                self.negative(w, zone, name_at, name);
                break;
            };
            let rdata_at = write_rr(w, name_at, name, cname, 0);
            w.an += 1;
            let Some(target) = cname.target.as_deref() else {
                break;
            };
            match self.catalog.zone_of(target) {
                Some(z) if hop < MAX_CHAIN && !chain_loops(node, target, name) => {
                    zone = z;
                    name_at = rdata_at;
                    name_buf[..target.len()].copy_from_slice(target);
                    name_len = target.len();
                }
                // The target is elsewhere: the resolver follows it.
                _ => break,
            }
        }
        RCODE_NOERROR
    }

    /// A referral: the child's NS, not authoritative.
    fn referral(&self, w: &mut Writer<'_>, name_at: usize, name: &[u8], cut: &[u8]) {
        w.set_aa(false);
        if let Some(ns) = self.catalog.node(cut).and_then(|n| n.get(TYPE_NS)) {
            let ptr = name_at + (name.len() - cut.len());
            for k in 0..ns.count as usize {
                write_rr(w, ptr, cut, ns, k);
                w.ns += 1;
            }
            self.glue(w, ns);
        }
    }

    /// The addresses GSLB name `gi` answers an A, AAAA or ANY query with; widens the ECS scope
    /// to what the choice depended on. Returns whether any was written.
    fn gslb_addresses(
        &self,
        w: &mut Writer<'_>,
        q: &Query,
        ecs: &mut Ecs,
        gi: usize,
        name_at: usize,
        name: &[u8],
    ) -> bool {
        let families: &[bool] = match q.qtype {
            TYPE_A => &[false],
            TYPE_AAAA => &[true],
            TYPE_ANY => &[false, true],
            _ => return false,
        };
        let client_ip = match ecs.subnet {
            Some(s) if s.source_prefix > 0 => s.addr,
            _ => ecs.peer,
        };
        let client = self.gslb.client(
            client_ip,
            ecs.subnet.map(|s| s.source_prefix).filter(|p| *p > 0),
        );
        let ttl = self.gslb.names[gi].ttl;
        let mut wrote = false;
        for &v6 in families {
            let mut n = 0;
            let scope = self.gslb.select(gi, &client, v6, None, &mut |ip| {
                w.address(name_at, name, ip, ttl);
                n += 1;
            });
            if let Some(s) = scope {
                ecs.scope = ecs.scope.max(s);
            }
            w.an += n;
            wrote |= n > 0;
        }
        wrote
    }

    /// Writes the node's records of type `qtype`, if it has them; returns whether it did.
    fn rrset_of(
        &self,
        w: &mut Writer<'_>,
        name_at: usize,
        name: &[u8],
        node: &Node,
        qtype: u16,
    ) -> bool {
        let Some(set) = node.get(qtype) else {
            return false;
        };
        self.rrset(w, name_at, name, set);
        true
    }

    fn answer_any(
        &self,
        w: &mut Writer<'_>,
        transport: Transport,
        node: &Node,
        zone: u16,
        name_at: usize,
        name: &[u8],
    ) {
        if transport == Transport::Udp && !node.rrsets.is_empty() {
            // RFC 8482: over UDP, ANY gets a small synthesized answer, not everything.
            hinfo_rfc8482(w, name_at, name);
        } else if node.rrsets.is_empty() {
            self.negative(w, zone, name_at, name);
        } else {
            for set in &node.rrsets {
                self.rrset(w, name_at, name, set);
            }
        }
    }

    fn rrset(&self, w: &mut Writer<'_>, name_at: usize, name: &[u8], set: &crate::catalog::RrSet) {
        // Round-robin the order of a multi-record set, as most servers do.
        let n = set.count as usize;
        let start = if n > 1 { fastrand::usize(..n) } else { 0 };
        for k in 0..n {
            write_rr(w, name_at, name, set, (start + k) % n);
            w.an += 1;
        }
    }

    /// NXDOMAIN / NODATA: the zone's SOA in the authority section.
    fn negative(&self, w: &mut Writer<'_>, zone: u16, name_at: usize, name: &[u8]) {
        let z = &self.catalog.zones[zone as usize];
        let ptr = if in_zone(name, &z.origin) {
            name_at + (name.len() - z.origin.len())
        } else {
            usize::MAX
        };
        w.record(ptr, &z.origin, &z.negative_soa);
        w.ns += 1;
    }

    /// Addresses of in-zone name servers of a referral.
    fn glue(&self, w: &mut Writer<'_>, ns: &crate::catalog::RrSet) {
        for k in 0..ns.count as usize {
            let s = ns.starts[k] as usize;
            let target =
                &ns.bytes[s + 10..ns.starts.get(k + 1).map_or(ns.bytes.len(), |e| *e as usize)];
            if let Some(node) = self.catalog.node(target) {
                for t in [TYPE_A, TYPE_AAAA] {
                    if let Some(set) = node.get(t) {
                        for j in 0..set.count as usize {
                            write_rr(w, usize::MAX, target, set, j);
                            w.ar += 1;
                        }
                    }
                }
            }
        }
    }
}

/// Whether following `target` from `name` would come back to a name already answered: a
/// CNAME to itself (longer loops stop at `MAX_CHAIN`).
fn chain_loops(_node: &Node, target: &[u8], name: &[u8]) -> bool {
    target == name
}

/// Writes record `k` of `set` with the owner at `ptr` (or written out); returns where its RDATA
/// starts.
fn write_rr(
    w: &mut Writer<'_>,
    ptr: usize,
    owner: &[u8],
    set: &crate::catalog::RrSet,
    k: usize,
) -> usize {
    let s = set.starts[k] as usize;
    let e = set
        .starts
        .get(k + 1)
        .map_or(set.bytes.len(), |e| *e as usize);
    w.record(ptr, owner, &set.bytes[s..e])
}

fn hinfo_rfc8482(w: &mut Writer<'_>, ptr: usize, name: &[u8]) {
    let mut fixed = [0u8; 10 + 9];
    fixed[0..2].copy_from_slice(&TYPE_HINFO.to_be_bytes());
    fixed[2..4].copy_from_slice(&CLASS_IN.to_be_bytes());
    fixed[4..8].copy_from_slice(&3600u32.to_be_bytes());
    fixed[8..10].copy_from_slice(&9u16.to_be_bytes());
    fixed[10] = 7;
    fixed[11..18].copy_from_slice(b"RFC8482");
    fixed[18] = 0;
    w.record(ptr, name, &fixed);
    w.an += 1;
}

/// Length of the question (name + type + class) at offset 12, if readable.
fn question_len(packet: &[u8]) -> Option<usize> {
    question_len_at(packet)
}

fn question_len_at(p: &[u8]) -> Option<usize> {
    let mut i = 12;
    loop {
        let len = *p.get(i)? as usize;
        if len & 0xC0 != 0 {
            return None;
        }
        i += 1 + len;
        if len == 0 {
            break;
        }
    }
    (i + 4 <= p.len()).then_some(i + 4 - 12)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, Query as HQuery};
    use hickory_proto::rr::{Name, RecordType};

    fn engine(records: &[String]) -> Engine {
        let mut text = String::from("[dns]\nlisten = \"127.0.0.1:5353\"\n[[dns.zone]]\norigin = \"example.com.\"\nrecords = [\n");
        for r in records {
            text.push_str(&format!("  {r:?},\n"));
        }
        text.push_str("]\n");
        let config = fulcrum_config::parse(&text, "t.toml", std::path::Path::new(".")).unwrap();
        let compiled = crate::compile(&config, &mut crate::iptable::GeoCache::new()).unwrap();
        Engine {
            catalog: compiled.catalog,
            gslb: Arc::new(GslbState::build(&config, compiled.locator, None)),
            udp_payload: 1232,
            rrl: None,
        }
    }

    fn ask(e: &Engine, name: &str, t: RecordType, transport: Transport) -> (Vec<u8>, Message) {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.add_query(HQuery::query(Name::from_ascii(name).unwrap(), t));
        let mut out = Vec::new();
        let action = e.answer(
            &m.to_vec().unwrap(),
            "192.0.2.1".parse().unwrap(),
            transport,
            &mut out,
            &Counters::default(),
        );
        assert_eq!(action, Action::Send);
        let decoded = Message::from_vec(&out).unwrap();
        (out, decoded)
    }

    #[test]
    fn huge_answers_over_tcp_keep_valid_names_past_the_pointer_range() {
        // 340 TXT records of ~200 bytes: ~74 KB, beyond both the 14-bit pointer range and the
        // 16-bit TCP length; 150 of them: ~33 KB, past the pointer range only.
        let txt = "x".repeat(200);
        let mut recs: Vec<String> = (0..150)
            .map(|i| format!("big 60 IN TXT \"{i} {txt}\""))
            .collect();
        recs.push("alias 60 IN CNAME big".into());
        let e = engine(&recs);
        let (out, m) = ask(&e, "alias.example.com.", RecordType::TXT, Transport::Tcp);
        assert!(out.len() > 0x4000, "{}", out.len());
        assert_eq!(m.answers.len(), 151);
        assert!(m.answers[1..]
            .iter()
            .all(|r| r.name.to_ascii() == "big.example.com."));
        // Over UDP the same answer is truncated.
        let (out, m) = ask(&e, "alias.example.com.", RecordType::TXT, Transport::Udp);
        assert!(m.metadata.truncation && m.answers.is_empty() && out.len() <= 512);

        let recs: Vec<String> = (0..340)
            .map(|i| format!("big 60 IN TXT \"{i} {txt}\""))
            .collect();
        let e = engine(&recs);
        let (_, m) = ask(&e, "big.example.com.", RecordType::TXT, Transport::Tcp);
        assert!(m.metadata.truncation, "longer than a TCP message can carry");
    }

    #[test]
    fn negative_answers_after_a_chain_point_at_the_right_zone() {
        let e = engine(&[
            "@ 60 IN SOA ns hm 1 2 3 4 5".into(),
            "a 60 IN CNAME b".into(),
            "b 60 IN CNAME gone".into(),
        ]);
        let (_, m) = ask(&e, "A.example.com.", RecordType::A, Transport::Udp);
        assert_eq!(
            u16::from(m.metadata.response_code),
            3,
            "NXDOMAIN at the end of the chain"
        );
        assert_eq!(m.answers.len(), 2);
        assert_eq!(m.authorities.len(), 1);
        assert_eq!(m.authorities[0].name.to_ascii(), "example.com.");
        assert_eq!(m.authorities[0].ttl, 5);
    }

    #[test]
    fn edns_versions_classes_and_transfers() {
        let e = engine(&["www 60 IN A 192.0.2.1".into()]);
        let mut m = Message::query();
        m.add_query(HQuery::query(
            Name::from_ascii("www.example.com.").unwrap(),
            RecordType::A,
        ));
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_version(1);
        m.set_edns(edns);
        let mut out = Vec::new();
        let stats = Counters::default();
        e.answer(
            &m.to_vec().unwrap(),
            "192.0.2.1".parse().unwrap(),
            Transport::Udp,
            &mut out,
            &stats,
        );
        let r = Message::from_vec(&out).unwrap();
        assert_eq!(
            r.edns.as_ref().map(|e| e.rcode_high()),
            Some(1),
            "BADVERS = 16"
        );
        assert!(r.answers.is_empty());
        assert_eq!(stats.rcodes[16].load(Ordering::Relaxed), 1);

        let (_, r) = ask(&e, "example.com.", RecordType::AXFR, Transport::Tcp);
        assert_eq!(u16::from(r.metadata.response_code), 5, "no zone transfers");
        let mut m = Message::query();
        let mut q = HQuery::query(
            Name::from_ascii("www.example.com.").unwrap(),
            RecordType::TXT,
        );
        q.set_query_class(hickory_proto::rr::DNSClass::CH);
        m.add_query(q);
        e.answer(
            &m.to_vec().unwrap(),
            "192.0.2.1".parse().unwrap(),
            Transport::Udp,
            &mut out,
            &stats,
        );
        let r = Message::from_vec(&out).unwrap();
        assert_eq!(u16::from(r.metadata.response_code), 5, "CHAOS is refused");
    }
}
