//! Packet fixtures through BPF_PROG_RUN: an input frame, the expected XDP action, the expected
//! output frame byte for byte, and the counters. Expected frames are built from scratch by
//! `fulcrum_xdp::packet` (full RFC 1071 checksums), so a match also verifies the data plane's
//! incremental checksum updates. Needs root (CI runs as root), like loading any BPF program.

use std::net::IpAddr;

use fulcrum_xdp::hash::flow_hash;
use fulcrum_xdp::packet::*;
use fulcrum_xdp::*;

const LB: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const MEMBER_PORT: u16 = 8080;

fn rmac(i: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 1, i]
}

fn a(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn vip(v6: bool) -> IpAddr {
    a(if v6 { "2001:db8::10" } else { "198.18.0.10" })
}
fn client(v6: bool) -> IpAddr {
    a(if v6 { "2001:db8:2::2" } else { "198.18.2.2" })
}
fn router(v6: bool) -> IpAddr {
    a(if v6 { "2001:db8:3::1" } else { "198.18.3.1" })
}
/// Real `i` (1 or 2) of the family.
fn real_addr(v6: bool, i: u8) -> IpAddr {
    if v6 {
        a(&format!("2001:db8:1::{i}"))
    } else {
        a(&format!("198.18.1.{i}"))
    }
}
/// Real indices: v4 reals are 1 and 2, v6 reals 3 and 4.
fn real_index(v6: bool, i: u8) -> u32 {
    u32::from(i) + if v6 { 2 } else { 0 }
}
/// VIP indices: 0 v4 tcp/80, 1 v4 udp/53, 2 v6 tcp/80, 3 v6 udp/53.
fn vip_index(v6: bool, proto: u8) -> u32 {
    (if v6 { 2 } else { 0 }) + u32::from(proto == UDP)
}
fn vip_port(proto: u8) -> u16 {
    if proto == UDP {
        53
    } else {
        80
    }
}

struct Fx {
    dp: Dataplane,
    mode: u32,
    /// VIP flags as last written, per VIP index (access list and limit tests).
    metas: std::cell::RefCell<Vec<u32>>,
}

fn setup_with(mode: u32, flags: u32, member_port: u16) -> Fx {
    let mut dp = Dataplane::load(Limits {
        vips: 4,
        conns: 4096,
        nat_entries: 4096,
        acl_entries: 65536,
    })
    .expect("load the XDP object (needs root)");
    dp.set_config(&Config {
        nat: mode == MODE_NAT,
        ..Config::default()
    })
    .expect("config");
    for v6 in [false, true] {
        for i in 1..=2u8 {
            dp.set_real(
                real_index(v6, i),
                Real::new(real_addr(v6, i), rmac(i), member_port, 0),
            )
            .expect("real");
        }
        for proto in [TCP, UDP] {
            let idx = vip_index(v6, proto);
            dp.set_vip(
                VipKey::new(vip(v6), vip_port(proto), proto),
                VipMeta {
                    index: idx,
                    flags: mode | flags,
                },
            )
            .expect("vip");
            dp.set_ring(idx, &vec![real_index(v6, 1); RING_SIZE])
                .expect("ring");
        }
    }
    Fx {
        dp,
        mode,
        metas: std::cell::RefCell::new(vec![mode | flags; 4]),
    }
}

fn setup(mode: u32) -> Fx {
    setup_with(mode, 0, if mode == MODE_NAT { MEMBER_PORT } else { 0 })
}

impl Fx {
    fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        self.dp.test_run(frame).expect("BPF_PROG_RUN")
    }
    fn vs(&self, v6: bool, proto: u8) -> VipStats {
        self.dp.vip_stats(vip_index(v6, proto)).expect("stats")
    }
    fn g(&self, which: Global) -> u64 {
        self.dp.global(which).expect("global")
    }
}

/// The client's segment (TCP with `flags`, or UDP) to the VIP.
fn seg(v6: bool, proto: u8, sport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    if proto == TCP {
        tcp(client(v6), sport, vip(v6), vip_port(proto), flags, payload)
    } else {
        udp(client(v6), sport, vip(v6), vip_port(proto), payload)
    }
}

fn client_packet(v6: bool, proto: u8, sport: u16, flags: u8) -> Vec<u8> {
    ip(
        client(v6),
        vip(v6),
        proto,
        &seg(v6, proto, sport, flags, b"hello"),
    )
}

fn client_frame(v6: bool, proto: u8, sport: u16, flags: u8) -> Vec<u8> {
    eth(
        LB,
        CLIENT_MAC,
        ethertype(vip(v6)),
        &client_packet(v6, proto, sport, flags),
    )
}

fn key(v6: bool, proto: u8, sport: u16) -> FlowKey {
    flow(client(v6), sport, vip(v6), vip_port(proto), proto)
}

fn dr_expected(v6: bool, proto: u8, sport: u16, flags: u8, real: u8) -> Vec<u8> {
    eth(
        rmac(real),
        LB,
        ethertype(vip(v6)),
        &client_packet(v6, proto, sport, flags),
    )
}

// ---------------------------------------------------------------------------------------- dr

fn dr_first_packet(v6: bool, proto: u8) {
    let fx = setup(MODE_DR);
    let flags = if proto == TCP { SYN } else { 0 };
    let input = client_frame(v6, proto, 40000, flags);
    let (act, out) = fx.run(&input);
    assert_eq!(act, XDP_TX);
    assert_eq!(out, dr_expected(v6, proto, 40000, flags, 1));
    let s = fx.vs(v6, proto);
    assert_eq!(
        (s.packets, s.bytes, s.new_flows),
        (1, input.len() as u64, 1)
    );
    let r = fx.dp.real_stats(real_index(v6, 1)).expect("real stats");
    assert_eq!(
        (r.packets, r.bytes, r.new_flows),
        (1, input.len() as u64, 1)
    );
    let c = fx
        .dp
        .conn(&key(v6, proto, 40000))
        .expect("conn")
        .expect("entry");
    assert_eq!(c.real, real_index(v6, 1));
}

#[test]
fn dr_v4_tcp_syn_rewrites_macs() {
    dr_first_packet(false, TCP);
}
#[test]
fn dr_v4_udp_rewrites_macs() {
    dr_first_packet(false, UDP);
}
#[test]
fn dr_v6_tcp_syn_rewrites_macs() {
    dr_first_packet(true, TCP);
}
#[test]
fn dr_v6_udp_rewrites_macs() {
    dr_first_packet(true, UDP);
}

/// A ring change does not move an established flow: the second packet hits the LRU entry.
fn dr_lru_hit(v6: bool, proto: u8) {
    let mut fx = setup(MODE_DR);
    let first = if proto == TCP { SYN } else { 0 };
    assert_eq!(fx.run(&client_frame(v6, proto, 40001, first)).0, XDP_TX);
    fx.dp
        .set_ring(vip_index(v6, proto), &vec![real_index(v6, 2); RING_SIZE])
        .expect("ring");
    let next = if proto == TCP { ACK | PSH } else { 0 };
    let (act, out) = fx.run(&client_frame(v6, proto, 40001, next));
    assert_eq!(act, XDP_TX);
    assert_eq!(
        out,
        dr_expected(v6, proto, 40001, next, 1),
        "stays on member 1"
    );
    assert_eq!(fx.vs(v6, proto).new_flows, 1);
    assert_eq!(fx.vs(v6, proto).packets, 2);
    // A new flow follows the new ring.
    let (_, out) = fx.run(&client_frame(v6, proto, 40002, first));
    assert_eq!(out, dr_expected(v6, proto, 40002, first, 2));
    assert_eq!(fx.vs(v6, proto).new_flows, 2);
}

#[test]
fn dr_v4_tcp_lru_hit_survives_ring_change() {
    dr_lru_hit(false, TCP);
}
#[test]
fn dr_v6_tcp_lru_hit_survives_ring_change() {
    dr_lru_hit(true, TCP);
}
#[test]
fn dr_v4_udp_lru_hit_survives_ring_change() {
    dr_lru_hit(false, UDP);
}
#[test]
fn dr_v6_udp_lru_hit_survives_ring_change() {
    dr_lru_hit(true, UDP);
}

/// Only a SYN starts a TCP flow: a segment of no known flow (a forged ACK, RST or FIN, or a
/// flow whose state a restart lost) goes where the ring says in dr and tunnel mode, and takes
/// no entry from the table.
#[test]
fn dr_and_tunnel_segments_without_a_flow_go_by_the_ring_and_create_nothing() {
    for mode in [MODE_DR, MODE_TUNNEL] {
        let fx = setup(mode);
        let strays = [ACK, RST, FIN | ACK, ACK | PSH, SYN | ACK];
        for (sport, flags) in (40003..).zip(strays) {
            let (act, out) = fx.run(&client_frame(false, TCP, sport, flags));
            assert_eq!(act, XDP_TX, "mode {mode} flags {flags:#x}");
            if mode == MODE_DR {
                assert_eq!(out, dr_expected(false, TCP, sport, flags, 1));
            } else {
                assert_eq!(out, tunnel_expected(&fx, false, TCP, sport, flags, 1));
            }
            assert!(
                fx.dp.conn(&key(false, TCP, sport)).expect("conn").is_none(),
                "mode {mode}: flags {flags:#x} created a flow"
            );
        }
        assert_eq!(fx.vs(false, TCP).new_flows, 0);
        assert_eq!(fx.g(Global::NoFlowForwarded), strays.len() as u64);
        let (act, _) = fx.run(&client_frame(false, TCP, 40003, SYN));
        assert_eq!(act, XDP_TX);
        assert!(fx.dp.conn(&key(false, TCP, 40003)).expect("conn").is_some());
        assert_eq!(fx.vs(false, TCP).new_flows, 1);
    }
}

fn client_segment(v6: bool, sport: u16, flags: u8, seq_ack: (u32, u32), payload: &[u8]) -> Vec<u8> {
    let s = tcp_seq(client(v6), sport, vip(v6), 80, flags, seq_ack, payload);
    eth(
        LB,
        CLIENT_MAC,
        ethertype(vip(v6)),
        &ip(client(v6), vip(v6), TCP, &s),
    )
}

fn member_segment(v6: bool, sport: u16, flags: u8, seq_ack: (u32, u32), payload: &[u8]) -> Vec<u8> {
    let r = real_addr(v6, 1);
    let s = tcp_seq(r, MEMBER_PORT, client(v6), sport, flags, seq_ack, payload);
    eth(LB, rmac(1), ethertype(r), &ip(r, client(v6), TCP, &s))
}

/// An RST is believed only inside the window the flow has shown: the client's next sequence
/// number and up to 64 KiB before it. Others are forwarded (the member judges them) and leave
/// the connection in place.
#[test]
fn dr_rst_outside_the_window_keeps_the_connection() {
    let fx = setup(MODE_DR);
    let isn = 0xffff_f000u32; // the window wraps around 2^32
    let k = key(false, TCP, 40012);
    fx.run(&client_segment(false, 40012, SYN, (isn, 0), b""));
    fx.run(&client_segment(
        false,
        40012,
        ACK,
        (isn.wrapping_add(1), 9),
        &[7; 100],
    ));
    let next = isn.wrapping_add(101);
    for seq in [
        next.wrapping_add(1),
        next.wrapping_sub(70_000),
        next ^ 0x8000_0000,
    ] {
        let (act, _) = fx.run(&client_segment(false, 40012, RST, (seq, 0), b""));
        assert_eq!(act, XDP_TX);
        assert!(
            fx.dp.conn(&k).expect("conn").is_some(),
            "RST at {seq:#x} believed"
        );
    }
    assert_eq!(fx.g(Global::RstIgnored), 3);
    let (act, _) = fx.run(&client_segment(false, 40012, RST, (next, 0), b""));
    assert_eq!(act, XDP_TX);
    assert!(
        fx.dp.conn(&k).expect("conn").is_none(),
        "in-window RST ends it"
    );
}

/// The ring built by fulcrum-balance's Maglev and the C hash put flows where the Rust mirror of
/// the hash says: userspace can predict (and tests can check) every flow's member.
#[test]
fn dr_two_members_flows_follow_the_maglev_ring() {
    let mut fx = setup(MODE_DR);
    let names = vec!["m1".to_string(), "m2".to_string()];
    let ring = build_ring(&names, &[1, 1], &[1, 2]);
    fx.dp.set_ring(0, &ring).expect("ring");
    let mut seen = [0usize; 3];
    for sport in 41000..41064u16 {
        let k = key(false, TCP, sport);
        let want = ring[flow_hash(&k, false) as usize % RING_SIZE] as u8;
        let (act, out) = fx.run(&client_frame(false, TCP, sport, SYN));
        assert_eq!(act, XDP_TX);
        assert_eq!(
            out,
            dr_expected(false, TCP, sport, SYN, want),
            "port {sport}"
        );
        seen[want as usize] += 1;
    }
    assert!(seen[1] > 10 && seen[2] > 10, "both members used: {seen:?}");
    assert_eq!(fx.vs(false, TCP).new_flows, 64);
}

#[test]
fn dr_source_ip_persistence_keeps_a_client_on_one_member() {
    let mut fx = setup_with(MODE_DR, VIP_F_PERSIST_SRC, 0);
    let ring = build_ring(&["m1".into(), "m2".into()], &[1, 1], &[1, 2]);
    fx.dp.set_ring(0, &ring).expect("ring");
    let want = ring[flow_hash(&key(false, TCP, 0), true) as usize % RING_SIZE] as u8;
    for sport in 42000..42016u16 {
        let (_, out) = fx.run(&client_frame(false, TCP, sport, SYN));
        assert_eq!(out, dr_expected(false, TCP, sport, SYN, want));
    }
}

#[test]
fn dr_rst_removes_the_connection() {
    let fx = setup(MODE_DR);
    fx.run(&client_frame(false, TCP, 40010, SYN));
    assert!(fx.dp.conn(&key(false, TCP, 40010)).expect("conn").is_some());
    let (act, out) = fx.run(&client_frame(false, TCP, 40010, RST));
    assert_eq!(act, XDP_TX, "the RST itself still reaches the member");
    assert_eq!(out, dr_expected(false, TCP, 40010, RST, 1));
    assert!(fx.dp.conn(&key(false, TCP, 40010)).expect("conn").is_none());
}

#[test]
fn dr_fin_marks_the_connection_for_short_expiry() {
    let fx = setup(MODE_DR);
    fx.run(&client_frame(true, TCP, 40011, SYN));
    assert_eq!(
        fx.dp
            .conn(&key(true, TCP, 40011))
            .expect("c")
            .expect("e")
            .flags
            & CONN_F_FIN,
        0
    );
    fx.run(&client_frame(true, TCP, 40011, FIN | ACK));
    let c = fx.dp.conn(&key(true, TCP, 40011)).expect("c").expect("e");
    assert_eq!(c.flags & CONN_F_FIN, CONN_F_FIN);
}

#[test]
fn dr_fresh_entry_wins_over_the_ring_and_an_idle_one_expires() {
    let mut fx = setup(MODE_DR);
    fx.dp
        .set_config(&Config {
            udp_idle: std::time::Duration::from_secs(5),
            ..Config::default()
        })
        .expect("config");
    let fresh = key(false, UDP, 40020);
    fx.dp
        .set_conn(
            fresh,
            Conn {
                real: 2,
                flags: 0,
                last: fx.dp.now().expect("clock"),
                ..Conn::default()
            },
        )
        .expect("conn");
    let (_, out) = fx.run(&client_frame(false, UDP, 40020, 0));
    assert_eq!(out, dr_expected(false, UDP, 40020, 0, 2), "entry honoured");
    assert_eq!(fx.vs(false, UDP).new_flows, 0);
    let idle = key(false, UDP, 40021);
    let old = fx.dp.now().expect("clock").saturating_sub(60 * fx.dp.hz());
    fx.dp
        .set_conn(
            idle,
            Conn {
                real: 2,
                flags: 0,
                last: old,
                ..Conn::default()
            },
        )
        .expect("conn");
    let (_, out) = fx.run(&client_frame(false, UDP, 40021, 0));
    assert_eq!(
        out,
        dr_expected(false, UDP, 40021, 0, 1),
        "expired: the ring decides"
    );
    assert_eq!(fx.vs(false, UDP).new_flows, 1);
}

#[test]
fn dr_forget_real_reschedules_its_flows() {
    let mut fx = setup(MODE_DR);
    fx.run(&client_frame(false, TCP, 40030, SYN));
    fx.run(&client_frame(false, TCP, 40031, SYN));
    fx.dp.set_ring(0, &vec![2; RING_SIZE]).expect("ring");
    assert_eq!(fx.dp.forget_real(1).expect("forget"), 2);
    let (_, out) = fx.run(&client_frame(false, TCP, 40030, ACK));
    assert_eq!(out, dr_expected(false, TCP, 40030, ACK, 2));
}

#[test]
fn dr_empty_ring_drops_and_counts() {
    let mut fx = setup(MODE_DR);
    fx.dp.set_ring(0, &vec![NO_REAL; RING_SIZE]).expect("ring");
    let (act, _) = fx.run(&client_frame(false, TCP, 40040, SYN));
    assert_eq!(act, XDP_DROP);
    let s = fx.vs(false, TCP);
    assert_eq!(s.drops[DropReason::NoReal as usize], 1);
    assert_eq!(s.new_flows, 0);
}

#[test]
fn dr_member_on_another_interface_is_redirected() {
    let mut fx = setup(MODE_DR);
    fx.dp
        .set_real(1, Real::new(real_addr(false, 1), rmac(1), 0, 999))
        .expect("real");
    let (act, out) = fx.run(&client_frame(false, TCP, 40050, SYN));
    assert_eq!(act, XDP_REDIRECT);
    assert_eq!(out, dr_expected(false, TCP, 40050, SYN, 1));
}

#[test]
fn dr_ipv4_options_are_forwarded_and_counted() {
    let fx = setup(MODE_DR);
    let v4 = V4 {
        options: vec![1, 1, 1, 0], // NOP NOP NOP EOL
        ..V4::default()
    };
    let packet = ipv4(
        client(false),
        vip(false),
        TCP,
        &seg(false, TCP, 40060, SYN, b""),
        &v4,
    );
    let (act, out) = fx.run(&eth(LB, CLIENT_MAC, ETH_IP, &packet));
    assert_eq!(act, XDP_TX);
    assert_eq!(out, eth(rmac(1), LB, ETH_IP, &packet));
    assert_eq!(fx.g(Global::IpOptions), 1);
}

// ------------------------------------------------------------------------------------ tunnel

fn tunnel_expected(fx: &Fx, v6: bool, proto: u8, sport: u16, flags: u8, real: u8) -> Vec<u8> {
    let _ = fx;
    let inner = client_packet(v6, proto, sport, flags);
    let h = flow_hash(&key(v6, proto, sport), false);
    if v6 {
        let src: IpAddr = std::net::Ipv6Addr::from((1u128 << 120) | u128::from(h)).into();
        let outer = ipv6(src, real_addr(true, real), 41, &inner, 0, h & 0xfffff);
        eth(rmac(real), LB, ETH_IPV6, &outer)
    } else {
        let src: IpAddr = std::net::Ipv4Addr::from(0xac10_0000 | (h & 0xffff)).into();
        let v4 = V4 {
            id: 0,
            frag: 0,
            ..V4::default()
        };
        let outer = ipv4(src, real_addr(false, real), 4, &inner, &v4);
        eth(rmac(real), LB, ETH_IP, &outer)
    }
}

fn tunnel_encap(v6: bool, proto: u8) {
    let fx = setup(MODE_TUNNEL);
    let flags = if proto == TCP { SYN } else { 0 };
    let input = client_frame(v6, proto, 43000, flags);
    let (act, out) = fx.run(&input);
    assert_eq!(act, XDP_TX);
    assert_eq!(out, tunnel_expected(&fx, v6, proto, 43000, flags, 1));
    let s = fx.vs(v6, proto);
    assert_eq!(
        (s.packets, s.bytes, s.new_flows),
        (1, input.len() as u64, 1)
    );
}

#[test]
fn tunnel_v4_tcp_ipip() {
    tunnel_encap(false, TCP);
}
#[test]
fn tunnel_v4_udp_ipip() {
    tunnel_encap(false, UDP);
}
#[test]
fn tunnel_v6_tcp_ip6ip6() {
    tunnel_encap(true, TCP);
}
#[test]
fn tunnel_v6_udp_ip6ip6() {
    tunnel_encap(true, UDP);
}

#[test]
fn tunnel_outer_source_varies_per_flow() {
    let fx = setup(MODE_TUNNEL);
    let mut sources = std::collections::HashSet::new();
    for sport in 43100..43116u16 {
        let (_, out) = fx.run(&client_frame(false, TCP, sport, SYN));
        assert_eq!(out, tunnel_expected(&fx, false, TCP, sport, SYN, 1));
        sources.insert(out[26..30].to_vec());
    }
    assert!(
        sources.len() >= 14,
        "{} distinct outer sources",
        sources.len()
    );
}

#[test]
fn tunnel_ethernet_padding_is_not_encapsulated_as_payload_length() {
    let fx = setup(MODE_TUNNEL);
    // 14 + 20 + 8 + 1 = 43 bytes: the NIC pads the frame to 60.
    let packet = ip(
        client(false),
        vip(false),
        UDP,
        &udp(client(false), 43200, vip(false), 53, b"x"),
    );
    let mut frame = eth(LB, CLIENT_MAC, ETH_IP, &packet);
    frame.resize(60, 0);
    let (act, out) = fx.run(&frame);
    assert_eq!(act, XDP_TX);
    let h = flow_hash(&key(false, UDP, 43200), false);
    let src: IpAddr = std::net::Ipv4Addr::from(0xac10_0000 | (h & 0xffff)).into();
    let v4 = V4 {
        id: 0,
        frag: 0,
        ..V4::default()
    };
    let mut want = eth(
        rmac(1),
        LB,
        ETH_IP,
        &ipv4(src, real_addr(false, 1), 4, &packet, &v4),
    );
    want.resize(60 + 20, 0); // the padding rides along after the IP packet, outside tot_len
    assert_eq!(out, want);
}

#[test]
fn tunnel_member_of_the_other_family_is_dropped_and_counted() {
    let mut fx = setup(MODE_TUNNEL);
    fx.dp
        .set_ring(0, &vec![real_index(true, 1); RING_SIZE])
        .expect("ring");
    let (act, _) = fx.run(&client_frame(false, TCP, 43300, SYN));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.vs(false, TCP).drops[DropReason::Family as usize], 1);
}

// --------------------------------------------------------------------------------------- nat

fn nat_in_expected(v6: bool, proto: u8, sport: u16, flags: u8, port: u16) -> Vec<u8> {
    let r = real_addr(v6, 1);
    let s = if proto == TCP {
        tcp(client(v6), sport, r, port, flags, b"hello")
    } else {
        udp(client(v6), sport, r, port, b"hello")
    };
    eth(rmac(1), LB, ethertype(r), &ip(client(v6), r, proto, &s))
}

fn member_reply(v6: bool, proto: u8, sport: u16, flags: u8, port: u16) -> Vec<u8> {
    let r = real_addr(v6, 1);
    let s = if proto == TCP {
        tcp(r, port, client(v6), sport, flags, b"world")
    } else {
        udp(r, port, client(v6), sport, b"world")
    };
    eth(LB, rmac(1), ethertype(r), &ip(r, client(v6), proto, &s))
}

fn reply_expected(v6: bool, proto: u8, sport: u16, flags: u8) -> Vec<u8> {
    let s = if proto == TCP {
        tcp(vip(v6), vip_port(proto), client(v6), sport, flags, b"world")
    } else {
        udp(vip(v6), vip_port(proto), client(v6), sport, b"world")
    };
    eth(
        CLIENT_MAC,
        LB,
        ethertype(vip(v6)),
        &ip(vip(v6), client(v6), proto, &s),
    )
}

fn nat_both_directions(v6: bool, proto: u8) {
    let fx = setup(MODE_NAT);
    assert_eq!(fx.mode, MODE_NAT);
    let first = if proto == TCP { SYN } else { 0 };
    let (act, out) = fx.run(&client_frame(v6, proto, 44000, first));
    assert_eq!(act, XDP_TX);
    assert_eq!(out, nat_in_expected(v6, proto, 44000, first, MEMBER_PORT));
    let back = if proto == TCP { SYN | ACK } else { 0 };
    let reply = member_reply(v6, proto, 44000, back, MEMBER_PORT);
    let (act, out) = fx.run(&reply);
    assert_eq!(act, XDP_TX);
    assert_eq!(out, reply_expected(v6, proto, 44000, back));
    let s = fx.vs(v6, proto);
    assert_eq!((s.packets, s.new_flows, s.reply_packets), (1, 1, 1));
    assert_eq!(s.reply_bytes, reply.len() as u64);
}

#[test]
fn nat_v4_tcp_dnat_and_reply_snat() {
    nat_both_directions(false, TCP);
}
#[test]
fn nat_v4_udp_dnat_and_reply_snat() {
    nat_both_directions(false, UDP);
}
#[test]
fn nat_v6_tcp_dnat_and_reply_snat() {
    nat_both_directions(true, TCP);
}
#[test]
fn nat_v6_udp_dnat_and_reply_snat() {
    nat_both_directions(true, UDP);
}

#[test]
fn nat_many_flows_checksums_stay_exact() {
    // Different ports and payloads walk the incremental update through carries and 0xffff.
    let fx = setup(MODE_NAT);
    for sport in (1024..65535u16).step_by(2047) {
        for flags in [SYN, ACK | PSH] {
            let (_, out) = fx.run(&client_frame(false, TCP, sport, flags));
            assert_eq!(
                out,
                nat_in_expected(false, TCP, sport, flags, MEMBER_PORT),
                "{sport}"
            );
        }
        let (_, out) = fx.run(&client_frame(true, UDP, sport, 0));
        assert_eq!(
            out,
            nat_in_expected(true, UDP, sport, 0, MEMBER_PORT),
            "{sport}"
        );
    }
}

#[test]
fn nat_member_port_zero_keeps_the_vip_port() {
    let fx = setup_with(MODE_NAT, 0, 0);
    let (_, out) = fx.run(&client_frame(false, TCP, 44100, SYN));
    assert_eq!(out, nat_in_expected(false, TCP, 44100, SYN, 80));
    let (act, out) = fx.run(&member_reply(false, TCP, 44100, SYN | ACK, 80));
    assert_eq!(act, XDP_TX);
    assert_eq!(out, reply_expected(false, TCP, 44100, SYN | ACK));
}

#[test]
fn nat_v4_udp_without_checksum_stays_without() {
    let fx = setup(MODE_NAT);
    let mut s = udp(client(false), 44200, vip(false), 53, b"hello");
    s[6] = 0;
    s[7] = 0;
    let (act, out) = fx.run(&eth(
        LB,
        CLIENT_MAC,
        ETH_IP,
        &ip(client(false), vip(false), UDP, &s),
    ));
    assert_eq!(act, XDP_TX);
    let r = real_addr(false, 1);
    let mut w = udp(client(false), 44200, r, MEMBER_PORT, b"hello");
    w[6] = 0;
    w[7] = 0;
    assert_eq!(
        out,
        eth(rmac(1), LB, ETH_IP, &ip(client(false), r, UDP, &w))
    );
}

#[test]
fn nat_reply_without_state_passes_untouched() {
    let fx = setup(MODE_NAT);
    let reply = member_reply(false, TCP, 44300, ACK, MEMBER_PORT);
    let (act, out) = fx.run(&reply);
    assert_eq!(act, XDP_PASS);
    assert_eq!(out, reply);
    assert_eq!(fx.g(Global::PassNonVip), 1);
}

#[test]
fn nat_client_rst_clears_both_tables() {
    let fx = setup(MODE_NAT);
    fx.run(&client_frame(false, TCP, 44400, SYN));
    let rk = flow(real_addr(false, 1), MEMBER_PORT, client(false), 44400, TCP);
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_some());
    let (act, out) = fx.run(&client_frame(false, TCP, 44400, RST));
    assert_eq!(act, XDP_TX);
    assert_eq!(out, nat_in_expected(false, TCP, 44400, RST, MEMBER_PORT));
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
    assert!(fx.dp.conn(&key(false, TCP, 44400)).expect("conn").is_none());
}

#[test]
fn nat_member_rst_clears_both_tables() {
    let fx = setup(MODE_NAT);
    fx.run(&client_frame(true, TCP, 44500, SYN));
    fx.run(&member_reply(true, TCP, 44500, SYN | ACK, MEMBER_PORT));
    let (act, out) = fx.run(&member_reply(true, TCP, 44500, RST, MEMBER_PORT));
    assert_eq!(act, XDP_TX);
    assert_eq!(out, reply_expected(true, TCP, 44500, RST));
    let rk = flow(real_addr(true, 1), MEMBER_PORT, client(true), 44500, TCP);
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
    assert!(fx.dp.conn(&key(true, TCP, 44500)).expect("conn").is_none());
}

/// nat: a TCP segment that is not a SYN and belongs to no flow is dropped (nothing could
/// translate the member's answer), counted, and creates nothing; the SYN then does.
#[test]
fn nat_segment_without_a_flow_is_dropped_and_creates_nothing() {
    let fx = setup(MODE_NAT);
    for v6 in [false, true] {
        let strays = [ACK, RST, FIN | ACK, ACK | PSH, SYN | ACK, SYN | RST];
        for (sport, flags) in (44800..).zip(strays) {
            let (act, _) = fx.run(&client_frame(v6, TCP, sport, flags));
            assert_eq!(act, XDP_DROP, "flags {flags:#x}");
            let rk = flow(real_addr(v6, 1), MEMBER_PORT, client(v6), sport, TCP);
            assert!(fx.dp.conn(&key(v6, TCP, sport)).expect("conn").is_none());
            assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
        }
        let s = fx.vs(v6, TCP);
        assert_eq!(s.drops[DropReason::NoFlow as usize], strays.len() as u64);
        assert_eq!(s.new_flows, 0);
        let (act, out) = fx.run(&client_frame(v6, TCP, 44800, SYN));
        assert_eq!(act, XDP_TX);
        assert_eq!(out, nat_in_expected(v6, TCP, 44800, SYN, MEMBER_PORT));
        let rk = flow(real_addr(v6, 1), MEMBER_PORT, client(v6), 44800, TCP);
        assert!(fx.dp.conn(&key(v6, TCP, 44800)).expect("conn").is_some());
        assert!(fx.dp.nat_entry(&rk).expect("nat").is_some());
        let (act, out) = fx.run(&client_frame(v6, TCP, 44800, ACK));
        assert_eq!(act, XDP_TX);
        assert_eq!(out, nat_in_expected(v6, TCP, 44800, ACK, MEMBER_PORT));
        assert_eq!(fx.vs(v6, TCP).new_flows, 1);
    }
}

/// nat, both directions: RSTs outside the sender's window are forwarded but end nothing; a
/// data segment far ahead does not move the window for a following RST; an RST at the
/// sender's next sequence number ends the flow.
#[test]
fn nat_rst_outside_the_window_keeps_both_entries() {
    let fx = setup(MODE_NAT);
    let (c_isn, m_isn) = (1000u32, 5_000_000u32);
    let sport = 44900;
    let k = key(false, TCP, sport);
    let rk = flow(real_addr(false, 1), MEMBER_PORT, client(false), sport, TCP);
    let both = |what: &str| {
        assert!(fx.dp.conn(&k).expect("conn").is_some(), "{what}: conn gone");
        assert!(
            fx.dp.nat_entry(&rk).expect("nat").is_some(),
            "{what}: reply entry gone"
        );
    };
    let tx = |frame: Vec<u8>| assert_eq!(fx.run(&frame).0, XDP_TX);
    tx(client_segment(false, sport, SYN, (c_isn, 0), b""));
    tx(member_segment(
        false,
        sport,
        SYN | ACK,
        (m_isn, c_isn + 1),
        b"",
    ));
    tx(client_segment(
        false,
        sport,
        ACK,
        (c_isn + 1, m_isn + 1),
        &[1; 100],
    ));
    tx(member_segment(
        false,
        sport,
        ACK,
        (m_isn + 1, c_isn + 101),
        &[2; 50],
    ));
    let (c_next, m_next) = (c_isn + 101, m_isn + 51);
    for seq in [
        c_next + 1,
        c_next.wrapping_sub(70_000),
        c_next ^ 0x8000_0000,
    ] {
        tx(client_segment(false, sport, RST, (seq, 0), b""));
        both(&format!("client RST at {seq:#x}"));
    }
    for seq in [m_next + 1, m_next - 70_000, m_next ^ 0x8000_0000] {
        tx(member_segment(false, sport, RST | ACK, (seq, c_next), b""));
        both(&format!("member RST at {seq:#x}"));
    }
    // A forged segment far ahead, then an RST right after it.
    let far = c_next + (1 << 20);
    tx(client_segment(false, sport, ACK, (far, m_next), &[3; 10]));
    tx(client_segment(false, sport, RST, (far + 10, 0), b""));
    both("RST after a forged jump");
    assert_eq!(fx.g(Global::RstIgnored), 7);
    tx(client_segment(false, sport, RST, (c_next, 0), b""));
    assert!(fx.dp.conn(&k).expect("conn").is_none());
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
}

/// The member refusing the SYN (RST+ACK acknowledging it, before it sent anything) ends the
/// flow; an RST+ACK acknowledging anything else does not.
#[test]
fn nat_member_refusing_the_syn_clears_both_tables() {
    let fx = setup(MODE_NAT);
    let sport = 44950;
    let isn = 77_000u32;
    let k = key(true, TCP, sport);
    let rk = flow(real_addr(true, 1), MEMBER_PORT, client(true), sport, TCP);
    fx.run(&client_segment(true, sport, SYN, (isn, 0), b""));
    let (act, _) = fx.run(&member_segment(true, sport, RST | ACK, (0, isn + 2), b""));
    assert_eq!(act, XDP_TX);
    assert!(
        fx.dp.nat_entry(&rk).expect("nat").is_some(),
        "wrong ack believed"
    );
    assert!(fx.dp.conn(&k).expect("conn").is_some());
    let (act, _) = fx.run(&member_segment(true, sport, RST | ACK, (0, isn + 1), b""));
    assert_eq!(act, XDP_TX);
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
    assert!(fx.dp.conn(&k).expect("conn").is_none());
}

/// A reply entry lost while its flow lives (the LRU evicted it; here removed by hand) is
/// rebuilt from the connection entry by the flow's next packet in a later jiffy, and the
/// member's replies are translated again.
#[test]
fn nat_lost_reply_entry_is_restored_by_the_flows_next_packet() {
    let mut fx = setup(MODE_NAT);
    for (v6, proto) in [(false, TCP), (true, UDP)] {
        let sport = 45000;
        let (first, next) = if proto == TCP { (SYN, ACK) } else { (0, 0) };
        fx.run(&client_frame(v6, proto, sport, first));
        let rk = flow(real_addr(v6, 1), MEMBER_PORT, client(v6), sport, proto);
        let made = fx.dp.nat_entry(&rk).expect("nat").expect("entry");
        fx.dp.remove_nat_entry(&rk).expect("remove");
        // The entry is looked for once per jiffy of a flow: wait for the next one.
        let t0 = fx.dp.now().expect("clock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while fx.dp.now().expect("clock") == t0 {
            assert!(std::time::Instant::now() < deadline, "jiffies stand still");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (act, out) = fx.run(&client_frame(v6, proto, sport, next));
        assert_eq!(act, XDP_TX);
        assert_eq!(out, nat_in_expected(v6, proto, sport, next, MEMBER_PORT));
        let e = fx.dp.nat_entry(&rk).expect("nat").expect("restored");
        assert_eq!(
            (
                e.vip_addr,
                e.vip_port,
                e.client_mac,
                e.local_mac,
                e.vip_index
            ),
            (
                made.vip_addr,
                made.vip_port,
                made.client_mac,
                made.local_mac,
                made.vip_index
            )
        );
        let back = if proto == TCP { ACK } else { 0 };
        let (act, out) = fx.run(&member_reply(v6, proto, sport, back, MEMBER_PORT));
        assert_eq!(act, XDP_TX);
        assert_eq!(out, reply_expected(v6, proto, sport, back));
    }
    assert_eq!(fx.g(Global::NatReplyRestored), 2);
}

#[test]
fn nat_fin_from_member_marks_the_reply_entry() {
    let fx = setup(MODE_NAT);
    fx.run(&client_frame(false, TCP, 44550, SYN));
    fx.run(&member_reply(false, TCP, 44550, FIN | ACK, MEMBER_PORT));
    let rk = flow(real_addr(false, 1), MEMBER_PORT, client(false), 44550, TCP);
    let e = fx.dp.nat_entry(&rk).expect("nat").expect("entry");
    assert_eq!(e.flags & CONN_F_FIN, CONN_F_FIN);
}

#[test]
fn nat_idle_reply_entry_expires() {
    let mut fx = setup(MODE_NAT);
    fx.dp
        .set_config(&Config {
            nat: true,
            udp_idle: std::time::Duration::from_secs(5),
            ..Config::default()
        })
        .expect("config");
    fx.run(&client_frame(false, UDP, 44600, 0));
    let rk = flow(real_addr(false, 1), MEMBER_PORT, client(false), 44600, UDP);
    let mut e = fx.dp.nat_entry(&rk).expect("nat").expect("entry");
    e.last = fx.dp.now().expect("clock").saturating_sub(60 * fx.dp.hz());
    fx.dp.set_nat_entry(rk, e).expect("age it");
    let reply = member_reply(false, UDP, 44600, 0, MEMBER_PORT);
    let (act, out) = fx.run(&reply);
    assert_eq!(act, XDP_PASS);
    assert_eq!(out, reply);
    assert!(fx.dp.nat_entry(&rk).expect("nat").is_none());
}

#[test]
fn nat_ipv4_options_dnat_keeps_options_and_checksums() {
    let fx = setup(MODE_NAT);
    let v4 = V4 {
        options: vec![0x94, 0x04, 0, 0], // Router Alert
        ..V4::default()
    };
    let input = ipv4(
        client(false),
        vip(false),
        TCP,
        &seg(false, TCP, 44700, SYN, b"hello"),
        &v4,
    );
    let (act, out) = fx.run(&eth(LB, CLIENT_MAC, ETH_IP, &input));
    assert_eq!(act, XDP_TX);
    let r = real_addr(false, 1);
    let want = ipv4(
        client(false),
        r,
        TCP,
        &tcp(client(false), 44700, r, MEMBER_PORT, SYN, b"hello"),
        &v4,
    );
    assert_eq!(out, eth(rmac(1), LB, ETH_IP, &want));
    assert_eq!(fx.g(Global::IpOptions), 1);
}

// ------------------------------------------------------------------------ passed untouched

fn assert_passed(fx: &Fx, frame: &[u8]) {
    let (act, out) = fx.run(frame);
    assert_eq!(act, XDP_PASS);
    assert_eq!(out, frame, "passed frames are not modified");
}

#[test]
fn arp_passes_untouched() {
    let fx = setup(MODE_DR);
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend(CLIENT_MAC);
    arp.extend([198, 18, 2, 2]);
    arp.extend([0; 6]);
    arp.extend([198, 18, 0, 10]);
    assert_passed(&fx, &eth([0xff; 6], CLIENT_MAC, ETH_ARP, &arp));
    assert_eq!(fx.g(Global::PassNonIp), 1);
    assert_eq!(fx.vs(false, TCP).packets, 0);
}

#[test]
fn unknown_vip_port_passes_untouched() {
    let fx = setup(MODE_DR);
    let p = ip(
        client(false),
        vip(false),
        TCP,
        &tcp(client(false), 45000, vip(false), 443, SYN, b""),
    );
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IP, &p));
    let p = ip(
        client(true),
        a("2001:db8::99"),
        UDP,
        &udp(client(true), 45000, a("2001:db8::99"), 53, b"q"),
    );
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IPV6, &p));
    assert_eq!(fx.g(Global::PassNonVip), 2);
}

#[test]
fn ipv6_neighbour_solicitation_for_the_vip_passes() {
    let fx = setup(MODE_DR);
    let mut body = vec![0; 0];
    body.extend(match vip(true) {
        IpAddr::V6(v) => v.octets(),
        IpAddr::V4(_) => unreachable!(),
    });
    let ns = icmp6(client(true), vip(true), 135, 0, [0; 4], &body);
    let p = ipv6(client(true), vip(true), ICMPV6, &ns, 0, 0);
    assert_passed(
        &fx,
        &eth([0x33, 0x33, 0xff, 0, 0, 0x10], CLIENT_MAC, ETH_IPV6, &p),
    );
}

#[test]
fn icmp_echo_to_the_vip_passes() {
    let fx = setup(MODE_DR);
    let echo = icmp4(8, 0, [0, 1, 0, 1], b"ping");
    let p = ipv4(client(false), vip(false), ICMP, &echo, &V4::default());
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IP, &p));
}

// ----------------------------------------------------------- fragments, malformed headers

#[test]
fn ipv4_first_fragment_to_a_vip_is_dropped_and_counted() {
    let fx = setup(MODE_DR);
    let v4 = V4 {
        frag: 0x2000,
        ..V4::default()
    }; // MF
    let p = ipv4(
        client(false),
        vip(false),
        UDP,
        &udp(client(false), 46000, vip(false), 53, &[7; 64]),
        &v4,
    );
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IP, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(
        fx.vs(false, TCP).drops[DropReason::Fragment as usize],
        1,
        "counted on the address's first VIP"
    );
}

#[test]
fn ipv4_later_fragment_to_a_vip_is_dropped() {
    let fx = setup(MODE_DR);
    let v4 = V4 {
        frag: 185,
        ..V4::default()
    }; // offset 1480, last fragment
    let p = ipv4(client(false), vip(false), UDP, &[7; 40], &v4);
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IP, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.vs(false, TCP).drops[DropReason::Fragment as usize], 1);
}

#[test]
fn ipv4_fragment_to_another_address_passes() {
    let fx = setup(MODE_DR);
    let v4 = V4 {
        frag: 0x2000,
        ..V4::default()
    };
    let p = ipv4(
        client(false),
        a("198.18.0.99"),
        UDP,
        &udp(client(false), 1, a("198.18.0.99"), 53, &[7; 64]),
        &v4,
    );
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IP, &p));
}

#[test]
fn ipv6_fragment_header_to_a_vip_is_dropped_and_counted() {
    let fx = setup(MODE_DR);
    let mut body = vec![TCP, 0, 0, 1, 0, 0, 0, 42]; // next TCP, offset 0, M=1
    body.extend(tcp(client(true), 46100, vip(true), 80, SYN, b""));
    let p = ipv6(client(true), vip(true), 44, &body, 0, 0);
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IPV6, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.vs(true, TCP).drops[DropReason::Fragment as usize], 1);
}

#[test]
fn ipv6_hop_by_hop_header_to_a_vip_is_dropped_and_counted() {
    let fx = setup(MODE_DR);
    let mut body = vec![TCP, 0, 1, 4, 0, 0, 0, 0]; // Hop-by-Hop, PadN
    body.extend(tcp(client(true), 46200, vip(true), 80, SYN, b""));
    let p = ipv6(client(true), vip(true), 0, &body, 0, 0);
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IPV6, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(
        fx.vs(true, TCP).drops[DropReason::Ipv6Extension as usize],
        1
    );
}

#[test]
fn truncated_tcp_header_to_a_vip_is_dropped_and_counted() {
    let fx = setup(MODE_DR);
    let t = tcp(client(false), 46300, vip(false), 80, SYN, b"");
    let p = ipv4(client(false), vip(false), TCP, &t[..12], &V4::default());
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IP, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.vs(false, TCP).drops[DropReason::Malformed as usize], 1);
    assert_eq!(fx.vs(false, TCP).packets, 0);
}

#[test]
fn tcp_data_offset_below_five_is_dropped() {
    let fx = setup(MODE_DR);
    let mut t = tcp(client(true), 46400, vip(true), 80, SYN, b"");
    t[12] = 0x40;
    let p = ipv6(client(true), vip(true), TCP, &t, 0, 0);
    let (act, _) = fx.run(&eth(LB, CLIENT_MAC, ETH_IPV6, &p));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.vs(true, TCP).drops[DropReason::Malformed as usize], 1);
}

#[test]
fn truncated_ipv4_header_passes_and_is_counted() {
    let fx = setup(MODE_DR);
    let p = client_packet(false, TCP, 46500, SYN);
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IP, &p[..12]));
    assert_eq!(fx.g(Global::MalformedL3), 1);
}

#[test]
fn ip_length_beyond_the_frame_passes_and_is_counted() {
    let fx = setup(MODE_DR);
    for v6 in [false, true] {
        let f = client_frame(v6, TCP, 46600, SYN);
        assert_passed(&fx, &f[..f.len() - 3]);
    }
    assert_eq!(fx.g(Global::MalformedL3), 2);
}

#[test]
fn ipv4_header_length_below_five_passes() {
    let fx = setup(MODE_DR);
    let mut f = client_frame(false, TCP, 46700, SYN);
    f[14] = 0x44;
    assert_passed(&fx, &f);
    assert_eq!(fx.g(Global::MalformedL3), 1);
}

// --------------------------------------------------------------------- ICMP errors (PMTUD)

/// What a router on the client's path sends when the VIP's reply (member -> client, source VIP)
/// is too big: ICMP fragmentation-needed / ICMPv6 packet-too-big to the VIP, quoting it.
fn too_big(v6: bool, sport: u16) -> Vec<u8> {
    let quoted = ip(
        vip(v6),
        client(v6),
        TCP,
        &tcp(vip(v6), 80, client(v6), sport, ACK, b""),
    );
    if v6 {
        let m = icmp6(router(v6), vip(v6), 2, 0, 1280u32.to_be_bytes(), &quoted);
        eth(
            LB,
            CLIENT_MAC,
            ETH_IPV6,
            &ipv6(router(v6), vip(v6), ICMPV6, &m, 0, 0),
        )
    } else {
        let m = icmp4(3, 4, [0, 0, 0x05, 0x78], &quoted);
        eth(
            LB,
            CLIENT_MAC,
            ETH_IP,
            &ipv4(router(v6), vip(v6), ICMP, &m, &V4::default()),
        )
    }
}

#[test]
fn icmp4_frag_needed_goes_to_the_member_that_owns_the_flow_dr() {
    let mut fx = setup(MODE_DR);
    fx.dp
        .set_conn(
            key(false, TCP, 47000),
            Conn {
                real: 2,
                flags: 0,
                last: fx.dp.now().expect("clock"),
                ..Conn::default()
            },
        )
        .expect("conn");
    let input = too_big(false, 47000);
    let (act, out) = fx.run(&input);
    assert_eq!(act, XDP_TX);
    let mut want = input.clone();
    want[..6].copy_from_slice(&rmac(2));
    want[6..12].copy_from_slice(&LB);
    assert_eq!(out, want, "member 2 owns the flow (the ring says member 1)");
    assert_eq!(fx.g(Global::IcmpForwarded), 1);
    assert_eq!(
        fx.vs(false, TCP).new_flows,
        0,
        "an ICMP error creates no flow"
    );
}

#[test]
fn icmp6_packet_too_big_is_tunnelled_like_its_flow() {
    let fx = setup(MODE_TUNNEL);
    let input = too_big(true, 47100);
    let (act, out) = fx.run(&input);
    assert_eq!(act, XDP_TX);
    let h = flow_hash(&key(true, TCP, 47100), false);
    let src: IpAddr = std::net::Ipv6Addr::from((1u128 << 120) | u128::from(h)).into();
    let outer = ipv6(src, real_addr(true, 1), 41, &input[14..], 0, h & 0xfffff);
    assert_eq!(out, eth(rmac(1), LB, ETH_IPV6, &outer));
    assert_eq!(fx.g(Global::IcmpForwarded), 1);
}

/// nat: the member gets the error about its own packet (real address and port in the quote).
fn nat_too_big(v6: bool, quote_len: Option<usize>) {
    let fx = setup(MODE_NAT);
    fx.run(&client_frame(v6, TCP, 47200, SYN));
    let r = real_addr(v6, 1);
    let cut = |p: Vec<u8>| match quote_len {
        Some(n) => p[..n].to_vec(),
        None => p,
    };
    let quoted = cut(ip(
        vip(v6),
        client(v6),
        TCP,
        &tcp(vip(v6), 80, client(v6), 47200, ACK, b""),
    ));
    let want_quoted = cut(ip(
        r,
        client(v6),
        TCP,
        &tcp(r, MEMBER_PORT, client(v6), 47200, ACK, b""),
    ));
    let (input, want) = if v6 {
        let m = icmp6(router(v6), vip(v6), 2, 0, 1280u32.to_be_bytes(), &quoted);
        let w = icmp6(router(v6), r, 2, 0, 1280u32.to_be_bytes(), &want_quoted);
        (
            eth(
                LB,
                CLIENT_MAC,
                ETH_IPV6,
                &ipv6(router(v6), vip(v6), ICMPV6, &m, 0, 0),
            ),
            eth(
                rmac(1),
                LB,
                ETH_IPV6,
                &ipv6(router(v6), r, ICMPV6, &w, 0, 0),
            ),
        )
    } else {
        let m = icmp4(3, 4, [0, 0, 0x05, 0x78], &quoted);
        let w = icmp4(3, 4, [0, 0, 0x05, 0x78], &want_quoted);
        (
            eth(
                LB,
                CLIENT_MAC,
                ETH_IP,
                &ipv4(router(v6), vip(v6), ICMP, &m, &V4::default()),
            ),
            eth(
                rmac(1),
                LB,
                ETH_IP,
                &ipv4(router(v6), r, ICMP, &w, &V4::default()),
            ),
        )
    };
    let (act, out) = fx.run(&input);
    assert_eq!(act, XDP_TX);
    assert_eq!(out, want);
    assert_eq!(fx.g(Global::IcmpForwarded), 1);
}

#[test]
fn nat_icmp4_frag_needed_is_rewritten_for_the_member() {
    nat_too_big(false, None);
}

#[test]
fn nat_icmpv6_packet_too_big_is_rewritten_for_the_member() {
    nat_too_big(true, None);
}

#[test]
fn nat_icmp4_with_an_eight_byte_quote_is_rewritten_too() {
    // RFC 792 routers quote the IP header and 8 bytes: the quoted TCP checksum is not there.
    nat_too_big(false, Some(28));
}

#[test]
fn icmp_unreachable_for_a_non_vip_flow_passes() {
    let fx = setup(MODE_DR);
    let quoted = ip(
        a("198.18.9.9"),
        client(false),
        UDP,
        &udp(a("198.18.9.9"), 53, client(false), 1234, b""),
    );
    let m = icmp4(3, 3, [0; 4], &quoted);
    let p = ipv4(router(false), a("198.18.9.9"), ICMP, &m, &V4::default());
    assert_passed(&fx, &eth(LB, CLIENT_MAC, ETH_IP, &p));
}

#[test]
fn layout_and_hash_mirror_agree_with_the_kernel_for_v6() {
    // The v6 ring pick goes through the same mirror; checked over many flows.
    let mut fx = setup(MODE_DR);
    let ring = build_ring(&["a".into(), "b".into()], &[1, 3], &[3, 4]);
    fx.dp.set_ring(3, &ring).expect("ring");
    for sport in 48000..48032u16 {
        let want = ring[flow_hash(&key(true, UDP, sport), false) as usize % RING_SIZE];
        let (_, out) = fx.run(&client_frame(true, UDP, sport, 0));
        assert_eq!(out, dr_expected(true, UDP, sport, 0, (want - 2) as u8));
    }
}

// --------------------------------------------------------------- member-side decapsulation

#[test]
fn decap_strips_what_tunnel_mode_adds_v4_and_v6() {
    let mut fx = setup(MODE_TUNNEL);
    fx.dp
        .set_decap_sources(&Config::default().tunnel_sources())
        .expect("decap sources");
    for v6 in [false, true] {
        let (_, encapsulated) = fx.run(&client_frame(v6, TCP, 49000, SYN));
        let (act, out) = fx
            .dp
            .test_run_program(DECAP_PROGRAM, &encapsulated)
            .expect("decap");
        assert_eq!(act, XDP_PASS);
        assert_eq!(
            out,
            dr_expected(v6, TCP, 49000, SYN, 1),
            "inner packet, outer MACs"
        );
    }
    assert_eq!(fx.g(Global::Decapsulated), 2);
}

/// Tunnel packets whose outer source is not a balancer's tunnel source are dropped and
/// counted, not stripped and delivered to the VIP.
#[test]
fn decap_drops_tunnel_packets_from_other_sources() {
    let mut fx = setup(MODE_TUNNEL);
    let decap = |fx: &Fx, frame: &[u8]| {
        fx.dp
            .test_run_program(DECAP_PROGRAM, frame)
            .expect("decap")
            .0
    };
    let tunnelled = |outer_src: &str, v6: bool| {
        let inner = client_packet(v6, TCP, 49200, SYN);
        let dst = real_addr(v6, 1);
        let outer = if v6 {
            ipv6(a(outer_src), dst, 41, &inner, 0, 0)
        } else {
            ipv4(a(outer_src), dst, 4, &inner, &V4::default())
        };
        eth(rmac(1), LB, ethertype(dst), &outer)
    };
    // Nothing configured: nothing accepted.
    assert_eq!(decap(&fx, &tunnelled("172.16.3.4", false)), XDP_DROP);
    fx.dp
        .set_decap_sources(&Config::default().tunnel_sources())
        .expect("decap sources");
    for (src, v6) in [
        ("198.18.9.9", false),
        ("172.17.0.1", false),
        ("2001:db8:9::9", true),
        ("100::1:0:0", true),
    ] {
        assert_eq!(decap(&fx, &tunnelled(src, v6)), XDP_DROP, "{src}");
    }
    assert_eq!(fx.g(Global::DecapRefused), 5);
    assert_eq!(fx.g(Global::Decapsulated), 0);
    for (src, v6) in [("172.16.255.1", false), ("100::ffff:1", true)] {
        assert_eq!(decap(&fx, &tunnelled(src, v6)), XDP_PASS, "{src}");
    }
    assert_eq!(fx.g(Global::Decapsulated), 2);
}

#[test]
fn decap_passes_other_traffic_untouched() {
    let fx = setup(MODE_TUNNEL);
    for frame in [
        client_frame(false, UDP, 49100, 0),
        client_frame(true, TCP, 49100, ACK),
    ] {
        let (act, out) = fx
            .dp
            .test_run_program(DECAP_PROGRAM, &frame)
            .expect("decap");
        assert_eq!((act, out), (XDP_PASS, frame));
    }
    assert_eq!(fx.g(Global::Decapsulated), 0);
}

#[test]
fn measured_hz_is_the_kernels() {
    let fx = setup(MODE_DR);
    let hz = fx.dp.hz();
    assert!([100, 250, 300, 1000].contains(&hz), "{hz}");
    // Where the kernel publishes its configuration, the measurement must agree with it.
    if let Ok(out) = std::process::Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep '^CONFIG_HZ='",
        ])
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(v) = text.trim().strip_prefix("CONFIG_HZ=") {
            assert_eq!(v.parse::<u64>().expect("CONFIG_HZ"), hz);
        }
    }
}

/// Robustness in place of a fuzz target (the parser is BPF C, which cargo-fuzz cannot drive;
/// the verifier already proves memory safety): thousands of mutated and truncated frames of
/// every kind, in every mode, through BPF_PROG_RUN. The program must always decide (pass,
/// drop, tx, redirect), never abort, and never grow a frame by more than a tunnel header.
#[test]
fn mutated_frames_never_abort() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut bases = Vec::new();
    for v6 in [false, true] {
        for proto in [TCP, UDP] {
            bases.push(client_frame(v6, proto, 50000, SYN));
            bases.push(member_reply(v6, proto, 50000, ACK, MEMBER_PORT));
        }
        bases.push(too_big(v6, 50000));
    }
    for mode in [MODE_DR, MODE_TUNNEL, MODE_NAT] {
        let fx = setup(mode);
        // Established state, so replies and hits are exercised too.
        for v6 in [false, true] {
            for proto in [TCP, UDP] {
                fx.run(&client_frame(v6, proto, 50000, SYN));
            }
        }
        for i in 0..1500 {
            let mut f = bases[i % bases.len()].clone();
            let edits = 1 + next() % 4;
            for _ in 0..edits {
                match next() % 3 {
                    0 => {
                        let at = (next() % f.len() as u64) as usize;
                        f[at] = next() as u8;
                    }
                    1 => {
                        // Header bytes where the parser looks (version, IHL, lengths, flags).
                        let at = 14 + (next() % 48) as usize;
                        if at < f.len() {
                            f[at] ^= 1 << (next() % 8);
                        }
                    }
                    _ => {
                        let keep = 14 + (next() % (f.len() as u64 - 13)) as usize;
                        f.truncate(keep);
                    }
                }
            }
            for program in [PROGRAM, DECAP_PROGRAM] {
                let (act, out) = fx.dp.test_run_program(program, &f).expect("BPF_PROG_RUN");
                assert!(
                    matches!(act, XDP_PASS | XDP_DROP | XDP_TX | XDP_REDIRECT),
                    "mode {mode} {program}: action {act} for {f:02x?}"
                );
                assert!(
                    out.len() <= f.len() + 40,
                    "frame grew by more than a header"
                );
            }
        }
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data, zeroed then filled by CPU_SET; sched_setaffinity reads
    // it for the calling thread (pid 0) only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "pin to CPU {cpu}");
    }
}

/// A flow whose packets move to another CPU (RSS rehash, RPS, veth senders that migrate) keeps
/// its member: the empty per-CPU slot adopts the entry another CPU holds.
#[test]
fn flow_moving_to_another_cpu_keeps_its_member() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("one CPU: the cross-CPU path cannot be exercised here");
        return;
    }
    let result = std::thread::spawn(|| {
        let mut fx = setup(MODE_DR);
        pin_to_cpu(0);
        fx.run(&client_frame(false, TCP, 51000, SYN));
        fx.dp.set_ring(0, &vec![2; RING_SIZE]).expect("ring");
        pin_to_cpu(1);
        let (act, out) = fx.run(&client_frame(false, TCP, 51000, ACK));
        assert_eq!(act, XDP_TX);
        assert_eq!(
            out,
            dr_expected(false, TCP, 51000, ACK, 1),
            "adopted member 1"
        );
        assert_eq!(fx.vs(false, TCP).new_flows, 1, "not a new flow");
        // A new flow on this CPU follows the new ring.
        let (_, out) = fx.run(&client_frame(false, TCP, 51001, SYN));
        assert_eq!(out, dr_expected(false, TCP, 51001, SYN, 2));
    })
    .join();
    assert!(result.is_ok(), "cross-CPU case failed");
}

// ------------------------------------------------------------------------------- ha.sync

/// With SET_F_SYNC, the first packet of each flow (and only it) is reported in flow_events
/// with its key, real, VIP and the frame's source MAC; without the flag nothing is.
#[test]
fn new_flows_are_reported_only_when_sync_is_on() {
    let mut fx = setup(MODE_NAT);
    let mut events = fx.dp.take_flow_events().expect("flow_events");
    let none = std::time::Duration::ZERO;
    // Off: a new flow, nothing reported.
    let (act, _) = fx.run(&client_frame(false, TCP, 41000, SYN));
    assert_eq!(act, XDP_TX);
    assert!(events.read(none, 10).is_empty());
    fx.dp
        .set_config(&Config {
            nat: true,
            sync: true,
            ..Config::default()
        })
        .expect("config");
    for (v6, proto, sport) in [(false, TCP, 41001), (true, UDP, 41002)] {
        let flags = if proto == TCP { SYN } else { 0 };
        let (act, _) = fx.run(&client_frame(v6, proto, sport, flags));
        assert_eq!(act, XDP_TX);
        let got = events.read(std::time::Duration::from_millis(100), 10);
        assert_eq!(got.len(), 1, "{got:?}");
        let e = got[0];
        assert_eq!(e.key, key(v6, proto, sport));
        assert_eq!(e.real, real_index(v6, 1));
        assert_eq!(e.vip_index, vip_index(v6, proto));
        assert_eq!(e.client_mac, CLIENT_MAC);
        assert_eq!(e.ifindex, 1, "BPF_PROG_RUN's packets come in on lo");
        // The flow's next packet is an LRU hit: not reported again.
        let (act, _) = fx.run(&client_frame(
            v6,
            proto,
            sport,
            if proto == TCP { ACK } else { 0 },
        ));
        assert_eq!(act, XDP_TX);
        assert!(events.read(none, 10).is_empty());
    }
    assert_eq!(fx.g(Global::SyncLost), 0);
    // Every live connection with its real, for the full dump.
    let all = fx.dp.connections().expect("connections");
    assert!(all
        .iter()
        .any(|(k, c)| *k == key(true, UDP, 41002) && c.real == real_index(true, 1)));
    assert_eq!(all.len(), 3);
}

/// A connection entry written by ha.sync carries CONN_F_SYNCED (the node's refresh does not
/// resend it); the first packet of the flow seen here clears it.
#[test]
fn a_synced_entry_becomes_this_nodes_own_with_its_first_packet() {
    // BPF_PROG_RUN runs on the calling CPU: pin to CPU 0, whose slot `conn` reads first.
    // SAFETY: sched_setaffinity on this thread (pid 0) with a zeroed, then filled cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
    let mut fx = setup(MODE_DR);
    let k = key(false, TCP, 42000);
    let now = fx.dp.now().expect("now");
    fx.dp
        .set_conn(
            k,
            Conn {
                real: real_index(false, 2),
                flags: CONN_F_SYNCED,
                last: now,
                ..Conn::default()
            },
        )
        .expect("conn");
    let (act, out) = fx.run(&client_frame(false, TCP, 42000, ACK));
    assert_eq!(act, XDP_TX);
    // The synced member, not the ring's (which holds member 1 only).
    assert_eq!(out, dr_expected(false, TCP, 42000, ACK, 2));
    let c = fx.dp.conn(&k).expect("read").expect("entry");
    assert_eq!(c.real, real_index(false, 2));
    assert_eq!(c.flags & CONN_F_SYNCED, 0, "{c:?}");
}

// ------------------------------------------------------------------- access lists, flow limits

fn pfx(s: &str) -> (IpAddr, u8) {
    let (addr, len) = s.split_once('/').expect("prefix");
    (a(addr), len.parse().expect("length"))
}

impl Fx {
    /// Puts an access list in force on a VIP the way the plane does: the new list under the
    /// other generation, the VIP's flags flipped, the old generation removed.
    fn acl(&mut self, v6: bool, proto: u8, allow: &[&str], deny: &[&str]) {
        let idx = vip_index(v6, proto);
        let k = VipKey::new(vip(v6), vip_port(proto), proto);
        let meta = self.vip_meta(v6, proto);
        let old_gen = meta.flags & VIP_F_ACL_GEN != 0;
        let allow: Vec<_> = allow.iter().map(|s| pfx(s)).collect();
        let deny: Vec<_> = deny.iter().map(|s| pfx(s)).collect();
        let flags = self
            .dp
            .set_acl(idx, !old_gen, &allow, &deny)
            .expect("set_acl");
        self.dp
            .set_vip(
                k,
                VipMeta {
                    index: idx,
                    flags: (meta.flags & !VIP_F_ACL_MASK) | flags,
                },
            )
            .expect("vip");
        self.dp.clear_acl(idx, old_gen).expect("clear_acl");
        self.metas.borrow_mut()[idx as usize] = (meta.flags & !VIP_F_ACL_MASK) | flags;
    }

    fn limits(&mut self, v6: bool, proto: u8, l: Option<FlowLimits>) {
        let idx = vip_index(v6, proto);
        let meta = self.vip_meta(v6, proto);
        let flag = self.dp.set_flow_limits(idx, l).expect("limits");
        let flags = (meta.flags & !VIP_F_LIMITS) | flag;
        self.dp
            .set_vip(
                VipKey::new(vip(v6), vip_port(proto), proto),
                VipMeta { index: idx, flags },
            )
            .expect("vip");
        self.metas.borrow_mut()[idx as usize] = flags;
    }

    fn vip_meta(&self, v6: bool, proto: u8) -> VipMeta {
        let idx = vip_index(v6, proto);
        VipMeta {
            index: idx,
            flags: self.metas.borrow()[idx as usize],
        }
    }

    fn drops(&self, v6: bool, proto: u8, r: DropReason) -> u64 {
        self.vs(v6, proto).drops[r as usize]
    }
}

/// A client segment (or datagram) to the VIP from any source address.
fn frame_from(src: IpAddr, proto: u8, sport: u16, flags: u8) -> Vec<u8> {
    let v6 = src.is_ipv6();
    let seg = if proto == TCP {
        tcp(src, sport, vip(v6), vip_port(proto), flags, b"hello")
    } else {
        udp(src, sport, vip(v6), vip_port(proto), b"hello")
    };
    eth(
        LB,
        CLIENT_MAC,
        ethertype(src),
        &ip(src, vip(v6), proto, &seg),
    )
}

fn acl_setup(mode: u32) -> Fx {
    setup(mode)
}

/// `deny`: a source in a denied prefix is dropped before it gets a flow, counted per VIP;
/// other sources pass (IPv4 and IPv6, TCP and UDP, every mode).
#[test]
fn acl_denied_source_is_dropped_and_counted() {
    for mode in [MODE_DR, MODE_TUNNEL, MODE_NAT] {
        for v6 in [false, true] {
            for proto in [TCP, UDP] {
                let mut fx = acl_setup(mode);
                let deny = if v6 {
                    "2001:db8:2::/48"
                } else {
                    "198.18.2.0/24"
                };
                fx.acl(v6, proto, &[], &[deny]);
                let flags = if proto == TCP { SYN } else { 0 };
                let (act, _) = fx.run(&client_frame(v6, proto, 41000, flags));
                assert_eq!(act, XDP_DROP, "mode {mode} v6 {v6} proto {proto}");
                assert_eq!(fx.drops(v6, proto, DropReason::AclDenied), 1);
                assert!(fx.dp.conn(&key(v6, proto, 41000)).expect("conn").is_none());
                assert_eq!(fx.vs(v6, proto).new_flows, 0);
                let other = a(if v6 { "2001:db8:9::9" } else { "198.18.9.9" });
                let (act, _) = fx.run(&frame_from(other, proto, 41001, flags));
                assert_ne!(act, XDP_DROP, "mode {mode} v6 {v6} proto {proto}");
                assert_eq!(fx.vs(v6, proto).new_flows, 1);
                // The other VIPs have no list.
                let (act, _) = fx.run(&client_frame(!v6, proto, 41002, flags));
                assert_ne!(act, XDP_DROP);
            }
        }
    }
}

/// `allow`: only listed sources are served; the rest is dropped as not_allowed.
#[test]
fn acl_allow_admits_listed_sources_only() {
    for v6 in [false, true] {
        let mut fx = acl_setup(MODE_DR);
        let allow = if v6 {
            "2001:db8:2::2/128"
        } else {
            "198.18.2.2/32"
        };
        fx.acl(v6, TCP, &[allow], &[]);
        let (act, out) = fx.run(&client_frame(v6, TCP, 41010, SYN));
        assert_eq!(act, XDP_TX);
        assert_eq!(out, dr_expected(v6, TCP, 41010, SYN, 1));
        let other = a(if v6 { "2001:db8:2::3" } else { "198.18.2.3" });
        let (act, _) = fx.run(&frame_from(other, TCP, 41011, SYN));
        assert_eq!(act, XDP_DROP);
        assert_eq!(fx.drops(v6, TCP, DropReason::AclNotAllowed), 1);
        assert_eq!(fx.drops(v6, TCP, DropReason::AclDenied), 0);
        // Not only SYNs: a stray segment of an unlisted source goes nowhere either.
        let (act, _) = fx.run(&frame_from(other, TCP, 41012, ACK));
        assert_eq!(act, XDP_DROP);
        assert_eq!(fx.drops(v6, TCP, DropReason::AclNotAllowed), 2);
    }
}

/// `deny` wins over `allow` whatever the prefix lengths (as AccessList::permits): a denied /16
/// holding an allowed /32 refuses it; a denied /32 inside an allowed /16 refuses only itself.
#[test]
fn acl_deny_wins_over_allow_whatever_the_lengths() {
    let mut fx = acl_setup(MODE_DR);
    fx.acl(false, TCP, &["198.18.2.2/32"], &["198.18.0.0/16"]);
    let (act, _) = fx.run(&client_frame(false, TCP, 41020, SYN));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.drops(false, TCP, DropReason::AclDenied), 1);

    fx.acl(false, TCP, &["198.18.0.0/16"], &["198.18.2.2/32"]);
    let (act, _) = fx.run(&client_frame(false, TCP, 41021, SYN));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.drops(false, TCP, DropReason::AclDenied), 2);
    let (act, _) = fx.run(&frame_from(a("198.18.2.3"), TCP, 41022, SYN));
    assert_eq!(act, XDP_TX);
    // Outside the allowed /16.
    let (act, _) = fx.run(&frame_from(a("198.19.2.3"), TCP, 41023, SYN));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.drops(false, TCP, DropReason::AclNotAllowed), 1);
    // IPv4 prefixes also hold IPv4-mapped IPv6 sources (to an IPv6 VIP with the same lists).
    fx.acl(true, TCP, &["198.18.0.0/16"], &["198.18.2.2/32"]);
    let (act, _) = fx.run(&frame_from(a("::ffff:198.18.2.2"), TCP, 41024, SYN));
    assert_eq!(act, XDP_DROP);
    assert_eq!(fx.drops(true, TCP, DropReason::AclDenied), 1);
    let (act, _) = fx.run(&frame_from(a("::ffff:198.18.2.3"), TCP, 41025, SYN));
    assert_eq!(act, XDP_TX);
}

/// A new list replaces the old one whole (generations) and leaves TCP flows that exist alone;
/// UDP is checked on every datagram, like the proxy does.
#[test]
fn acl_change_keeps_established_tcp_flows_and_removes_the_old_list() {
    let mut fx = acl_setup(MODE_DR);
    fx.acl(false, TCP, &[], &["203.0.113.0/24"]);
    fx.acl(false, UDP, &[], &["203.0.113.0/24"]);
    let before = fx.dp.acl_len().expect("len");
    fx.run(&client_frame(false, TCP, 41030, SYN));
    fx.run(&client_frame(false, UDP, 41030, 0));
    fx.acl(false, TCP, &[], &["198.18.2.0/24"]);
    fx.acl(false, UDP, &[], &["198.18.2.0/24"]);
    assert_eq!(
        fx.dp.acl_len().expect("len"),
        before,
        "old generation removed"
    );
    let (act, _) = fx.run(&client_frame(false, TCP, 41030, ACK));
    assert_eq!(act, XDP_TX, "an established connection goes on");
    let (act, _) = fx.run(&client_frame(false, TCP, 41031, SYN));
    assert_eq!(act, XDP_DROP, "a new one is refused");
    let (act, _) = fx.run(&client_frame(false, UDP, 41030, 0));
    assert_eq!(act, XDP_DROP, "udp: every datagram");
    fx.acl(false, TCP, &[], &[]);
    assert_eq!(fx.vip_meta(false, TCP).flags & VIP_F_ACL, 0);
    let (act, _) = fx.run(&client_frame(false, TCP, 41031, SYN));
    assert_eq!(act, XDP_TX);
}

/// new_per_second / burst: SYNs past the burst are dropped (flow_rate_limited) and take no
/// entry; packets of flows that exist are not limited.
#[test]
fn flow_rate_limit_drops_syns_past_the_burst() {
    for mode in [MODE_DR, MODE_NAT] {
        let mut fx = acl_setup(mode);
        fx.limits(
            false,
            TCP,
            Some(FlowLimits {
                new_per_second: 1,
                burst: 3,
                max: 0,
            }),
        );
        for port in 42000..42003 {
            let (act, _) = fx.run(&client_frame(false, TCP, port, SYN));
            assert_eq!(act, XDP_TX, "mode {mode} port {port}");
        }
        let (act, _) = fx.run(&client_frame(false, TCP, 42003, SYN));
        assert_eq!(act, XDP_DROP, "mode {mode}: past the burst");
        assert_eq!(fx.drops(false, TCP, DropReason::FlowRate), 1);
        assert!(fx.dp.conn(&key(false, TCP, 42003)).expect("conn").is_none());
        let (act, _) = fx.run(&client_frame(false, TCP, 42000, ACK));
        assert_eq!(act, XDP_TX, "established flows are not limited");
        assert_eq!(fx.vs(false, TCP).new_flows, 3);
        // Another VIP has its own bucket.
        let (act, _) = fx.run(&client_frame(false, UDP, 42003, 0));
        assert_eq!(act, XDP_TX);
    }
}

/// max: at the cap new flows are dropped (flow_limit_reached); a flow that ends (accepted RST)
/// or that userspace's recount finds idle makes room.
#[test]
fn flow_cap_counts_created_and_ended_flows() {
    let mut fx = acl_setup(MODE_DR);
    fx.limits(
        false,
        TCP,
        Some(FlowLimits {
            new_per_second: 0,
            burst: 0,
            max: 2,
        }),
    );
    for port in [43000, 43001] {
        assert_eq!(fx.run(&client_frame(false, TCP, port, SYN)).0, XDP_TX);
    }
    assert_eq!(fx.run(&client_frame(false, TCP, 43002, SYN)).0, XDP_DROP);
    assert_eq!(fx.drops(false, TCP, DropReason::FlowMax), 1);
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 2);
    // The RST ends a flow: room for one.
    assert_eq!(fx.run(&client_frame(false, TCP, 43000, RST)).0, XDP_TX);
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 1);
    assert_eq!(fx.run(&client_frame(false, TCP, 43002, SYN)).0, XDP_TX);
    assert_eq!(fx.run(&client_frame(false, TCP, 43003, SYN)).0, XDP_DROP);
    // A flow gone idle: the program never hears of it, the recount does.
    let k = key(false, TCP, 43001);
    let mut c = fx.dp.conn(&k).expect("conn").expect("entry");
    c.last = c.last.saturating_sub(3600 * fx.dp.hz());
    fx.dp.set_conn(k, c).expect("set_conn");
    let live = fx.dp.recount_flows(&[0]).expect("recount");
    assert_eq!(live.get(&0), Some(&1));
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 1);
    assert_eq!(fx.run(&client_frame(false, TCP, 43003, SYN)).0, XDP_TX);
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 2);
    // Limits off: no cap, nothing counted. Back on: the count starts from 0 (the program did
    // not count meanwhile) until the recount finds the live flows.
    fx.limits(false, TCP, None);
    for port in [43004, 43005] {
        assert_eq!(fx.run(&client_frame(false, TCP, port, SYN)).0, XDP_TX);
    }
    fx.limits(
        false,
        TCP,
        Some(FlowLimits {
            new_per_second: 0,
            burst: 0,
            max: 2,
        }),
    );
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 0);
    assert_eq!(
        fx.dp.recount_flows(&[0]).expect("recount").get(&0),
        Some(&4)
    );
    assert_eq!(fx.dp.flow_state(0).expect("state").1, 4);
    assert_eq!(fx.run(&client_frame(false, TCP, 43006, SYN)).0, XDP_DROP);
}

/// A flood of ACKs and RSTs from random sources takes no state, no token and no flow from
/// the cap: after it, a real client's SYN still gets the VIP's only flow.
#[test]
fn stray_acks_and_rsts_from_random_sources_create_no_state() {
    for mode in [MODE_DR, MODE_TUNNEL, MODE_NAT] {
        let mut fx = acl_setup(mode);
        fx.limits(
            false,
            TCP,
            Some(FlowLimits {
                new_per_second: 1,
                burst: 1,
                max: 1,
            }),
        );
        let mut n = 0u64;
        for i in 0..200u32 {
            let src = std::net::Ipv4Addr::from(0x0a00_0000 | (i.wrapping_mul(2_654_435_761) >> 8));
            let flags = [ACK, RST, RST | ACK, FIN | ACK][i as usize % 4];
            let (act, _) = fx.run(&frame_from(IpAddr::V4(src), TCP, 1024 + i as u16, flags));
            if mode == MODE_NAT {
                assert_eq!(act, XDP_DROP);
            } else {
                assert_eq!(act, XDP_TX);
            }
            n += 1;
        }
        assert_eq!(fx.dp.conn_count().expect("count"), 0, "mode {mode}");
        assert_eq!(fx.vs(false, TCP).new_flows, 0);
        let (st, flows) = fx.dp.flow_state(0).expect("state");
        assert_eq!((st.created, flows), (0, 0), "mode {mode}");
        assert_eq!(fx.drops(false, TCP, DropReason::FlowRate), 0);
        if mode == MODE_NAT {
            assert_eq!(fx.drops(false, TCP, DropReason::NoFlow), n);
        }
        assert_eq!(fx.run(&client_frame(false, TCP, 44000, SYN)).0, XDP_TX);
        assert_eq!(fx.dp.conn_count().expect("count"), 1);
    }
}
