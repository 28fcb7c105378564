//! `protocol = "ip"` VIPs and port-0 wildcards through BPF_PROG_RUN: the VIP lookup's order
//! (exact port > port 0 > ip), protocols without ports (ESP, GRE, ICMP echo) on one Maglev ring
//! hashed by the client address, and nat's address rewrite with the checksums that cover it.
//! Expected frames are built from scratch by `fulcrum_xdp::packet`. Needs root, like
//! tests/fixtures.rs.

use std::net::IpAddr;

use fulcrum_xdp::hash::flow_hash;
use fulcrum_xdp::packet::*;
use fulcrum_xdp::*;

const LB: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const ESP: u8 = 50;
const GRE: u8 = 47;

fn a(s: &str) -> IpAddr {
    s.parse().expect("address")
}
fn vip(v6: bool) -> IpAddr {
    a(if v6 { "2001:db8::10" } else { "198.18.0.10" })
}
fn client(v6: bool, i: u8) -> IpAddr {
    a(&if v6 {
        format!("2001:db8:2::{i}")
    } else {
        format!("198.18.2.{i}")
    })
}
fn rmac(i: u32) -> [u8; 6] {
    [0x02, 0, 0, 0, 1, i as u8]
}
/// Real `i` (1..=3) of the family: v4 reals are 1..=3, v6 reals 4..=6.
fn real_addr(v6: bool, i: u32) -> IpAddr {
    if v6 {
        a(&format!("2001:db8:1::{i}"))
    } else {
        a(&format!("198.18.1.{i}"))
    }
}
fn real_index(v6: bool, i: u32) -> u32 {
    i + if v6 { 3 } else { 0 }
}

/// VIP indices: 0 tcp/80 (all slots real 1), 1 tcp/0 (real 2), 2 ip (real 3); the same
/// three for IPv6 at 3, 4, 5.
fn setup(mode: u32) -> Dataplane {
    let mut dp = Dataplane::load(Limits {
        vips: 8,
        conns: 4096,
        nat_entries: 4096,
        acl_entries: 1024,
    })
    .expect("load the XDP object (needs root)");
    dp.set_config(&Config {
        nat: mode == MODE_NAT,
        wildcard: true,
        any_proto: true,
        ..Config::default()
    })
    .expect("config");
    for v6 in [false, true] {
        for i in 1..=3 {
            dp.set_real(
                real_index(v6, i),
                Real::new(real_addr(v6, i), rmac(real_index(v6, i)), 0, 0),
            )
            .expect("real");
        }
        let base = if v6 { 3 } else { 0 };
        let keys = [
            VipKey::new(vip(v6), 80, TCP),
            VipKey::new(vip(v6), 0, TCP),
            VipKey::new(vip(v6), 0, VIP_PROTO_ANY),
        ];
        for (i, k) in keys.into_iter().enumerate() {
            let index = base + i as u32;
            // ip VIPs always hash by the client address (the plane sets it).
            let persist = if i == 2 { VIP_F_PERSIST_SRC } else { 0 };
            dp.set_vip(
                k,
                VipMeta {
                    index,
                    flags: mode | persist,
                },
            )
            .expect("vip");
            dp.set_ring(index, &vec![real_index(v6, i as u32 + 1); RING_SIZE])
                .expect("ring");
        }
    }
    dp
}

fn frame(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> Vec<u8> {
    eth(LB, CLIENT_MAC, ethertype(dst), &ip(src, dst, proto, l4))
}

/// An ESP packet: SPI, sequence number, some "ciphertext".
fn esp_payload() -> Vec<u8> {
    let mut p = vec![0, 0, 0x10, 0x01, 0, 0, 0, 1];
    p.extend([0x5a; 24]);
    p
}

/// GRE (RFC 2784) carrying an IPv4 packet.
fn gre_payload() -> Vec<u8> {
    let mut p = vec![0, 0, 0x08, 0x00];
    p.extend(ip(a("10.0.0.1"), a("10.0.0.2"), UDP, &[0; 12]));
    p
}

fn sent_to(out: &[u8]) -> [u8; 6] {
    out[..6].try_into().expect("frame")
}

#[test]
fn lookup_prefers_the_exact_port_then_port_zero_then_ip() {
    for v6 in [false, true] {
        let dp = setup(MODE_DR);
        let c = client(v6, 2);
        let run = |f: Vec<u8>| dp.test_run(&f).expect("run");
        let (act, out) = run(frame(
            c,
            vip(v6),
            TCP,
            &tcp(c, 40000, vip(v6), 80, SYN, b""),
        ));
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(real_index(v6, 1))));
        let (act, out) = run(frame(
            c,
            vip(v6),
            TCP,
            &tcp(c, 40000, vip(v6), 8443, SYN, b""),
        ));
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(real_index(v6, 2))));
        let (act, out) = run(frame(c, vip(v6), UDP, &udp(c, 40000, vip(v6), 53, b"q")));
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(real_index(v6, 3))));
        let (act, out) = run(frame(c, vip(v6), ESP, &esp_payload()));
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(real_index(v6, 3))));
        let base = if v6 { 3 } else { 0 };
        let flows: Vec<u64> = (0..3)
            .map(|i| dp.vip_stats(base + i).expect("stats").new_flows)
            .collect();
        assert_eq!(flows, [1, 1, 2], "v6 {v6}");
        // The ESP flow's entry: ports 0, its own protocol.
        let k = flow(c, 0, vip(v6), 0, ESP);
        let e = dp.conn(&k).expect("conn").expect("an ESP entry");
        assert_eq!(e.real, real_index(v6, 3));
    }
}

#[test]
fn without_wildcards_configured_nothing_else_is_looked_up() {
    let mut dp = setup(MODE_DR);
    dp.set_config(&Config::default()).expect("config");
    let c = client(false, 2);
    let (act, _) = dp
        .test_run(&frame(
            c,
            vip(false),
            TCP,
            &tcp(c, 40000, vip(false), 8443, SYN, b""),
        ))
        .expect("run");
    assert_eq!(act, XDP_PASS);
    let (act, _) = dp
        .test_run(&frame(
            c,
            vip(false),
            ICMP,
            &icmp4(8, 0, [0, 1, 0, 1], b"ping"),
        ))
        .expect("run");
    assert_eq!(act, XDP_PASS, "ICMP echo to the VIP is the host's");
}

#[test]
fn protocols_without_ports_of_one_client_share_a_member_of_the_ring() {
    let mut dp = setup(MODE_DR);
    // A real ring of the three v4 members on the ip VIP (index 2).
    let names: Vec<String> = (1..=3).map(|i| format!("m{i}")).collect();
    let ring = build_ring(&names, &[1, 1, 1], &[1, 2, 3]);
    dp.set_ring(2, &ring).expect("ring");
    let mut members = std::collections::HashSet::new();
    for i in 1..=40u8 {
        let c = client(false, i);
        let want = ring[flow_hash(&flow(c, 0, vip(false), 0, ESP), true) as usize % RING_SIZE];
        for (proto, payload) in [
            (ESP, esp_payload()),
            (GRE, gre_payload()),
            (ICMP, icmp4(8, 0, [0, 7, 0, 1], b"ping")),
            (UDP, udp(c, 500, vip(false), 500, b"ike")),
            (132, vec![0u8; 28]), // SCTP: common header and a chunk, checksum not inspected
        ] {
            let (act, out) = dp
                .test_run(&frame(c, vip(false), proto, &payload))
                .expect("run");
            assert_eq!(act, XDP_TX, "proto {proto}");
            assert_eq!(sent_to(&out), rmac(want), "client {c} proto {proto}");
        }
        members.insert(want);
    }
    assert_eq!(members.len(), 3, "clients spread over the ring");
}

#[test]
fn dr_echo_reply_without_a_flow_is_forwarded_without_state() {
    let dp = setup(MODE_DR);
    let c = client(false, 9);
    let (act, _) = dp
        .test_run(&frame(
            c,
            vip(false),
            ICMP,
            &icmp4(0, 0, [0, 7, 0, 1], b"pong"),
        ))
        .expect("run");
    assert_eq!(act, XDP_TX);
    assert!(dp
        .conn(&flow(c, 0, vip(false), 0, ICMP))
        .expect("conn")
        .is_none());
    assert_eq!(
        dp.global(Global::PortlessNoFlowForwarded).expect("global"),
        1
    );
}

#[test]
fn ipv6_neighbour_discovery_and_extension_headers_are_not_forwarded() {
    let dp = setup(MODE_DR);
    let c = client(true, 2);
    // Neighbour solicitation to the VIP: the host's.
    let ns = icmp6(c, vip(true), 135, 0, [0; 4], &[0; 16]);
    let (act, _) = dp.test_run(&frame(c, vip(true), ICMPV6, &ns)).expect("run");
    assert_eq!(act, XDP_PASS);
    // A destination-options header: dropped and counted, as before.
    let (act, _) = dp
        .test_run(&frame(c, vip(true), 60, &[TCP, 0, 1, 4, 0, 0, 0, 0]))
        .expect("run");
    assert_eq!(act, XDP_DROP);
    // ESP and ICMPv6 echo go to the ip VIP.
    for (proto, payload) in [
        (ESP, esp_payload()),
        (ICMPV6, icmp6(c, vip(true), 128, 0, [0, 7, 0, 1], b"ping")),
    ] {
        let (act, out) = dp
            .test_run(&frame(c, vip(true), proto, &payload))
            .expect("run");
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(real_index(true, 3))));
    }
}

/// An echo request (ICMPv6 type 128, ICMP 8) or reply (129, 0) of `s` to `d`.
fn icmp_echo(v6: bool, ty6: u8, s: IpAddr, d: IpAddr) -> Vec<u8> {
    if v6 {
        icmp6(s, d, ty6, 0, [0, 9, 0, 1], b"ping")
    } else {
        icmp4(if ty6 == 128 { 8 } else { 0 }, 0, [0, 9, 0, 1], b"ping")
    }
}

#[test]
fn nat_rewrites_the_address_and_only_the_checksums_that_cover_it() {
    let dp = setup(MODE_NAT);
    let lb_side = |src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8], mac: [u8; 6]| {
        eth(mac, LB, ethertype(dst), &ip(src, dst, proto, l4))
    };
    for v6 in [false, true] {
        let c = client(v6, 3);
        let member = real_addr(v6, 3);
        let mmac = rmac(real_index(v6, 3));
        let echo = |s: IpAddr, d: IpAddr| icmp_echo(v6, 128, s, d);
        let reply = |s: IpAddr, d: IpAddr| icmp_echo(v6, 129, s, d);
        let icmp = if v6 { ICMPV6 } else { ICMP };
        // In: the destination becomes the member, ICMPv6's checksum follows (pseudo-header).
        let (act, out) = dp
            .test_run(&frame(c, vip(v6), icmp, &echo(c, vip(v6))))
            .expect("run");
        assert_eq!(act, XDP_TX);
        assert_eq!(out, lb_side(c, member, icmp, &echo(c, member), mmac));
        // Out: the member's reply leaves from the VIP.
        let from_member = eth(
            LB,
            mmac,
            ethertype(c),
            &ip(member, c, icmp, &reply(member, c)),
        );
        let (act, out) = dp.test_run(&from_member).expect("run");
        assert_eq!(act, XDP_TX);
        assert_eq!(
            out,
            lb_side(vip(v6), c, icmp, &reply(vip(v6), c), CLIENT_MAC)
        );
        // ESP and GRE: addresses only, their payload untouched.
        for (proto, payload) in [(ESP, esp_payload()), (GRE, gre_payload())] {
            let (act, out) = dp
                .test_run(&frame(c, vip(v6), proto, &payload))
                .expect("run");
            assert_eq!(act, XDP_TX);
            assert_eq!(out, lb_side(c, member, proto, &payload, mmac));
            let back = eth(LB, mmac, ethertype(c), &ip(member, c, proto, &payload));
            let (act, out) = dp.test_run(&back).expect("run");
            assert_eq!(act, XDP_TX);
            assert_eq!(out, lb_side(vip(v6), c, proto, &payload, CLIENT_MAC));
        }
        let s = dp.vip_stats(if v6 { 5 } else { 2 }).expect("stats");
        assert_eq!((s.new_flows, s.reply_packets), (3, 3), "v6 {v6}");
    }
}

#[test]
fn nat_echo_reply_without_a_flow_is_dropped() {
    let dp = setup(MODE_NAT);
    let c = client(false, 4);
    let (act, _) = dp
        .test_run(&frame(
            c,
            vip(false),
            ICMP,
            &icmp4(0, 0, [0, 7, 0, 1], b"pong"),
        ))
        .expect("run");
    assert_eq!(act, XDP_DROP);
    let s = dp.vip_stats(2).expect("stats");
    assert_eq!(s.drops[DropReason::NoFlow as usize], 1);
}

#[test]
fn fragments_of_protocols_without_ports_follow_their_flow() {
    let dp = setup(MODE_DR);
    let c = client(false, 5);
    for frag in [0x2000u16, 0x0010] {
        let f = V4 {
            frag,
            ..V4::default()
        };
        let packet = ipv4(c, vip(false), ESP, &esp_payload(), &f);
        let (act, out) = dp
            .test_run(&eth(LB, CLIENT_MAC, ETH_IP, &packet))
            .expect("run");
        assert_eq!((act, sent_to(&out)), (XDP_TX, rmac(3)), "frag {frag:#x}");
    }
    // TCP fragments still cannot be put on their flow: dropped.
    let packet = ipv4(
        c,
        vip(false),
        TCP,
        &tcp(c, 1, vip(false), 8443, ACK, b"x"),
        &V4 {
            frag: 0x0010,
            ..V4::default()
        },
    );
    let (act, _) = dp
        .test_run(&eth(LB, CLIENT_MAC, ETH_IP, &packet))
        .expect("run");
    assert_eq!(act, XDP_DROP);
}
