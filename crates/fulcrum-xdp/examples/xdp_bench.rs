//! ns per packet through BPF_PROG_RUN: the forwarder's LRU-hit and new-flow paths (dr mode)
//! (also with per-VIP access lists of 10 and 10,000 prefixes, a deny-list drop, flow_limits)
//! next to a program that only returns XDP_PASS, in the same run (bench/xdp.sh; needs root).
//!
//! BPF_PROG_RUN repeats the program on the same buffer without resetting it, so only dr mode
//! (a MAC rewrite that leaves the packet a VIP packet) can be repeated meaningfully; nat and
//! tunnel rewrite the packet away from the VIP on the first run. The new-flow path is measured
//! with a zero idle timeout: every run finds the entry expired, picks from the ring and writes
//! the connection entry, as a first packet does.
//!
//! Wildcards (a tcp VIP on port 0, a `protocol = "ip"` VIP): the exact VIP's hit and new-flow
//! paths again with wildcard VIPs configured beside it, a TCP flow found through the port-0
//! VIP (exact key missed, then the port-0 key), and ESP through the ip VIP (hit and new flow).
//!
//! With `ha.sync` on, each new flow also writes a record into the `flow_events` ring buffer
//! (about 14,500 fit). That path is measured in rounds of 10,000 runs with the buffer drained
//! between rounds, next to the new-flow path without sync at the same round size; an LRU hit
//! with sync on shows that established flows do not pay for it.

use std::net::IpAddr;
use std::time::Duration;

use fulcrum_xdp::packet::*;
use fulcrum_xdp::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeat: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let rounds = 5;
    let limits = Limits {
        vips: 2,
        conns: 65536,
        nat_entries: 1024,
        acl_entries: 65536,
    };
    let mut dp = match std::env::var_os("FULCRUM_XDP_OBJECT") {
        Some(path) => Dataplane::load_object(&std::fs::read(path)?, limits)?,
        None => Dataplane::load(limits)?,
    };
    let vip: IpAddr = "198.18.0.10".parse()?;
    let client: IpAddr = "198.18.2.2".parse()?;
    dp.set_vip(
        VipKey::new(vip, 80, TCP),
        VipMeta {
            index: 0,
            flags: MODE_DR,
        },
    )?;
    for i in 1..=3u8 {
        let addr: IpAddr = format!("198.18.1.{i}").parse()?;
        dp.set_real(u32::from(i), Real::new(addr, [2, 0, 0, 0, 1, i], 0, 0))?;
    }
    let names: Vec<String> = (1..=3).map(|i| format!("m{i}")).collect();
    dp.set_ring(0, &build_ring(&names, &[1, 1, 1], &[1, 2, 3]))?;
    let packet = ip(
        client,
        vip,
        TCP,
        &tcp(client, 40000, vip, 80, ACK, &[0u8; 18]),
    );
    let frame = eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0xaa], ETH_IP, &packet);
    // Only a SYN starts a flow: the new-flow paths run on one, hits on the ACK.
    let syn_packet = ip(
        client,
        vip,
        TCP,
        &tcp(client, 40000, vip, 80, SYN, &[0u8; 18]),
    );
    let syn = eth(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 0xaa],
        ETH_IP,
        &syn_packet,
    );

    let median = |f: &mut dyn FnMut() -> Result<Duration, Error>| -> Result<f64, Error> {
        let mut v = Vec::new();
        for _ in 0..rounds {
            v.push(f()?.as_nanos() as f64);
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Ok(v[v.len() / 2])
    };

    let pass = median(&mut || {
        let (act, d) = dp.bench(PASS_PROGRAM, &frame, repeat)?;
        assert_eq!(act, XDP_PASS);
        Ok(d)
    })?;
    dp.test_run(&syn)?; // creates the connection entry
    let hit = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &frame, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.set_config(&Config {
        tcp_idle: Duration::ZERO,
        ..Config::default()
    })?;
    let new = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    let vs = dp.vip_stats(0)?;
    assert!(vs.new_flows >= u64::from(repeat), "new-flow path taken");

    // Access list of 10,000 prefixes (lengths 16 to 32, spread over the IPv4 space, the
    // client's /24 among them; 20,000 trie entries with the IPv4-mapped copies): a new flow of
    // an allowed client, the drop of a denied one, and an LRU hit (TCP flows that exist are not
    // looked up). Then flow_limits (a bucket that never runs dry, and a cap far away): the cost
    // of the atomic accounting on the new-flow path.
    let mut x = 0x2545_f491u32;
    let mut prefixes: Vec<(IpAddr, u8)> = (0..9_999)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (IpAddr::V4(std::net::Ipv4Addr::from(x)), 16 + (i % 17) as u8)
        })
        .collect();
    prefixes.push(("198.18.2.0".parse()?, 24));
    let key = VipKey::new(vip, 80, TCP);
    let few = &prefixes[prefixes.len() - 10..];
    let few_flags = dp.set_acl(0, true, few, &[])?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR | few_flags,
        },
    )?;
    let new_acl_few = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.clear_acl(0, false)?;
    let acl_flags = dp.set_acl(0, false, &prefixes, &[])?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR | acl_flags,
        },
    )?;
    let new_acl = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.clear_acl(0, true)?;
    let acl_entries = dp.acl_len()?;
    let deny_flags = dp.set_acl(0, true, &[], &prefixes)?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR | deny_flags,
        },
    )?;
    dp.clear_acl(0, false)?;
    let denied = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, repeat)?;
        assert_eq!(act, XDP_DROP);
        Ok(d)
    })?;
    dp.set_acl(0, false, &prefixes, &[])?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR | acl_flags,
        },
    )?;
    dp.clear_acl(0, true)?;
    dp.set_config(&Config::default())?;
    dp.test_run(&syn)?;
    let hit_acl = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &frame, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.clear_acl(0, false)?;
    dp.set_config(&Config {
        tcp_idle: Duration::ZERO,
        ..Config::default()
    })?;
    let limit_flag = dp.set_flow_limits(
        0,
        Some(FlowLimits {
            new_per_second: 100_000_000,
            burst: 100_000_000,
            max: u64::MAX / 2,
        }),
    )?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR | limit_flag,
        },
    )?;
    let new_limits = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.set_flow_limits(0, None)?;
    dp.set_vip(
        key,
        VipMeta {
            index: 0,
            flags: MODE_DR,
        },
    )?;

    let wild = wildcard_rows(&mut dp, &frame, &syn, repeat, &median)?;

    // ha.sync: rounds small enough for the ring buffer, drained between rounds.
    let small = 10_000u32;
    let mut events = dp.take_flow_events()?;
    let new_small = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, small)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    dp.set_config(&Config {
        tcp_idle: Duration::ZERO,
        sync: true,
        ..Config::default()
    })?;
    let mut drained = 0usize;
    let new_sync = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &syn, small)?;
        assert_eq!(act, XDP_TX);
        loop {
            let got = events.read(Duration::ZERO, 100_000).len();
            if got == 0 {
                break;
            }
            drained += got;
        }
        Ok(d)
    })?;
    assert_eq!(
        dp.global(Global::SyncLost)?,
        0,
        "the ring buffer never filled"
    );
    assert!(
        drained >= (rounds * small) as usize,
        "every new flow reported"
    );
    dp.set_config(&Config {
        sync: true,
        ..Config::default()
    })?;
    dp.test_run(&syn)?;
    let hit_sync = median(&mut || {
        let (act, d) = dp.bench(PROGRAM, &frame, repeat)?;
        assert_eq!(act, XDP_TX);
        Ok(d)
    })?;
    assert_eq!(
        events.read(Duration::ZERO, 10).len(),
        0,
        "hits report nothing"
    );
    // The userspace recount behind flow_limits.max: a full table (65,536 flows from distinct
    // sources, made by SYNs through BPF_PROG_RUN) walked once.
    dp.set_config(&Config::default())?;
    let flows = limits.conns;
    for i in 0..flows {
        let src = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | i));
        let p = ip(src, vip, TCP, &tcp(src, 40000, vip, 80, SYN, &[]));
        dp.test_run(&eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0xaa], ETH_IP, &p))?;
    }
    let t = std::time::Instant::now();
    let live = dp.recount_flows(&[0])?;
    let walk = t.elapsed();
    let counted = live.get(&0).copied().unwrap_or(0);
    println!(
        "recount_flows over {counted} live flows ({} CPUs): {:.0} ms ({:.2} µs per flow)\n",
        aya::util::nr_cpus().unwrap_or(1),
        walk.as_secs_f64() * 1e3,
        walk.as_secs_f64() * 1e6 / counted.max(1) as f64
    );
    println!("| path | ns/packet | × XDP_PASS |");
    println!("|---|---|---|");
    println!("| XDP_PASS (baseline) | {pass:.1} | 1.00 |");
    println!("| dr, LRU hit | {hit:.1} | {:.2} |", hit / pass);
    println!(
        "| dr, new flow (ring pick + LRU write) | {new:.1} | {:.2} |",
        new / pass
    );
    println!(
        "| dr, new flow, allow list of {} prefixes | {new_acl_few:.1} | {:.2} |",
        few.len(),
        new_acl_few / pass
    );
    println!(
        "| dr, new flow, allow list of {} prefixes ({acl_entries} trie entries) | {new_acl:.1} | {:.2} |",
        prefixes.len(),
        new_acl / pass
    );
    println!(
        "| dr, SYN dropped by a deny list of {} prefixes | {denied:.1} | {:.2} |",
        prefixes.len(),
        denied / pass
    );
    println!(
        "| dr, LRU hit, with that allow list | {hit_acl:.1} | {:.2} |",
        hit_acl / pass
    );
    println!(
        "| dr, new flow, flow_limits (bucket and cap accounting) | {new_limits:.1} | {:.2} |",
        new_limits / pass
    );
    println!(
        "| dr, new flow, rounds of {small} | {new_small:.1} | {:.2} |",
        new_small / pass
    );
    println!(
        "| dr, new flow + ha.sync record, rounds of {small} | {new_sync:.1} | {:.2} |",
        new_sync / pass
    );
    println!(
        "| dr, LRU hit, ha.sync on | {hit_sync:.1} | {:.2} |",
        hit_sync / pass
    );
    for (name, ns) in &wild {
        println!("| {name} | {ns:.1} | {:.2} |", ns / pass);
    }
    println!(
        "\n{rounds} rounds of {repeat} runs each, median; {}-byte TCP frame (IPv4, ACK); kernel {}",
        frame.len(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    Ok(())
}

type Median<'a> = dyn Fn(&mut dyn FnMut() -> Result<Duration, Error>) -> Result<f64, Error> + 'a;

/// The rows of the wildcard VIPs (VIP index 1: a tcp port-0 VIP and an ip VIP on another
/// address, sharing the three members); leaves the program as it found it but for the VIPs.
fn wildcard_rows(
    dp: &mut Dataplane,
    frame: &[u8],
    syn: &[u8],
    repeat: u32,
    median: &Median<'_>,
) -> Result<Vec<(&'static str, f64)>, Box<dyn std::error::Error>> {
    let other: IpAddr = "198.18.0.11".parse()?;
    let client: IpAddr = "198.18.2.2".parse()?;
    let meta = VipMeta {
        index: 1,
        flags: MODE_DR | VIP_F_PERSIST_SRC,
    };
    dp.set_vip(VipKey::new(other, 0, TCP), meta)?;
    dp.set_vip(VipKey::new(other, 0, VIP_PROTO_ANY), meta)?;
    let names: Vec<String> = (1..=3).map(|i| format!("m{i}")).collect();
    dp.set_ring(1, &build_ring(&names, &[1, 1, 1], &[1, 2, 3]))?;
    let wildcards = Config {
        wildcard: true,
        any_proto: true,
        ..Config::default()
    };
    let expiring = Config {
        tcp_idle: Duration::ZERO,
        other_idle: Duration::ZERO,
        ..wildcards
    };
    let frame_of = |p: Vec<u8>| eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0xaa], ETH_IP, &p);
    let to_other = |flags: u8| {
        frame_of(ip(
            client,
            other,
            TCP,
            &tcp(client, 40000, other, 8443, flags, &[0u8; 18]),
        ))
    };
    let esp = frame_of(ip(client, other, 50, &[0x11u8; 26]));
    let run = |dp: &Dataplane, packet: &[u8]| {
        median(&mut || {
            let (act, d) = dp.bench(PROGRAM, packet, repeat)?;
            assert_eq!(act, XDP_TX);
            Ok(d)
        })
    };
    let mut rows = Vec::new();
    // The exact VIP's paths with the wildcards beside it: nothing more is looked up.
    dp.set_config(&wildcards)?;
    dp.test_run(syn)?; // its connection entry
    rows.push(("dr, LRU hit, wildcard VIPs configured", run(dp, frame)?));
    dp.set_config(&expiring)?;
    rows.push(("dr, new flow, wildcard VIPs configured", run(dp, syn)?));
    // Through the port-0 VIP: the exact key misses, the address is a VIP's, port 0 matches.
    rows.push((
        "dr, new flow via a tcp port-0 VIP",
        run(dp, &to_other(SYN))?,
    ));
    dp.set_config(&wildcards)?;
    dp.test_run(&to_other(SYN))?;
    rows.push(("dr, LRU hit via a tcp port-0 VIP", run(dp, &to_other(ACK))?));
    // ESP to the ip VIP: found by (address, any protocol) at once.
    dp.test_run(&esp)?;
    rows.push(("dr, ESP to an ip VIP, LRU hit", run(dp, &esp)?));
    dp.set_config(&expiring)?;
    rows.push(("dr, ESP to an ip VIP, new flow", run(dp, &esp)?));
    // As the caller had it: every TCP entry expired.
    dp.set_config(&Config {
        tcp_idle: Duration::ZERO,
        ..Config::default()
    })?;
    Ok(rows)
}
