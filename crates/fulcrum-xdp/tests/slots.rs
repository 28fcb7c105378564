//! Member numbers (`RealSlots`) over many reloads: the reals array holds 4,095 members, and a
//! process that sees more distinct members than that over its life must keep giving new ones
//! a number (without one a member gets no ring slots: weight 0), without ever letting a live
//! flow's entry name a number that went to another member. Needs root, like every BPF test.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use fulcrum_xdp::*;

fn member(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0xc612_0000 | n)) // 198.18.x.y
}

#[test]
fn more_than_4095_distinct_members_over_reloads_all_get_weight() {
    let mut dp = Dataplane::load(Limits {
        vips: 1,
        conns: 1024,
        nat_entries: 1024,
        acl_entries: 65536,
    })
    .expect("load the XDP object (needs root)");
    let mut slots = RealSlots::new(Duration::ZERO, Duration::ZERO);
    let per_reload = 100u32;
    let reloads = 45u32; // 4,500 distinct members
    let mut current: Vec<(IpAddr, u32)> = Vec::new();
    // A live flow of the first reload's first member: its number must outlive the member.
    let flow_key = flow(
        "198.51.100.7".parse().expect("ip"),
        40000,
        "198.18.255.1".parse().expect("ip"),
        80,
        6,
    );
    let mut pinned = None;
    for reload in 0..reloads {
        let now = Instant::now();
        for (_, index) in current.drain(..) {
            slots.retire(index, now);
        }
        // The reload's rings no longer hold the members that left.
        let mut next = Vec::new();
        for k in 0..per_reload {
            let addr = member(reload * per_reload + k);
            let index = slots
                .allocate()
                .unwrap_or_else(|| panic!("reload {reload}: member {k} got no number"));
            assert_ne!(Some(index), pinned, "a live flow's number was reused");
            dp.set_real(index, Real::new(addr, [2, 0, 0, 0, 0, 1], 0, 0))
                .expect("real");
            next.push((addr, index));
        }
        let names: Vec<String> = next.iter().map(|(a, _)| a.to_string()).collect();
        let ids: Vec<u32> = next.iter().map(|(_, i)| *i).collect();
        let ring = build_ring(&names, &vec![1; names.len()], &ids);
        for id in &ids {
            assert!(
                ring.contains(id),
                "reload {reload}: real {id} has no ring slot"
            );
        }
        dp.set_ring(0, &ring).expect("ring");
        if reload == 0 {
            let index = next[0].1;
            pinned = Some(index);
            let last = dp.now().expect("clock");
            dp.set_conn(
                flow_key,
                Conn {
                    real: index,
                    last,
                    ..Conn::default()
                },
            )
            .expect("conn");
        }
        if reload == 30 {
            // The flow ends (idles out): its number is reclaimed, its entry removed.
            let mut c = dp.conn(&flow_key).expect("conn").expect("entry");
            c.last = c.last.saturating_sub(3600 * dp.hz());
            dp.set_conn(flow_key, c).expect("age it");
            pinned = None;
        }
        current = next;
        slots.reclaim(&mut dp, Instant::now()).expect("reclaim");
    }
    assert!(
        dp.conn(&flow_key).expect("conn").is_none(),
        "stale entry removed"
    );
    assert_eq!(slots.retiring(), 0);
}
