//! VRRP failover between two Fulcrum nodes on a shared Ethernet segment (a bridge), with a client
//! on the segment: a master that dies, preemption, a node whose members are all down, a split
//! brain healing. Everything runs inside namespaces the tests create (198.18.0.0/24).

#[path = "common/lab.rs"]
mod lab;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::ha_node_config as node_config;
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const VIP: &str = "198.18.0.100";

fn vip() -> SocketAddr {
    SocketAddr::from(([198, 18, 0, 100], 80))
}

struct Pair {
    lab: Lab,
    a: Ns,
    b: Ns,
    c: Ns,
    backend_a: Backend,
    backend_b: Backend,
}

fn pair(tag: &str) -> Pair {
    pair_on(tag, ["198.18.0.1/24", "198.18.0.2/24", "198.18.0.10/24"])
}

/// Two nodes and a client on one segment with these addresses (a, b, c).
fn pair_on(tag: &str, cidrs: [&str; 3]) -> Pair {
    let mut lab = Lab::new(tag);
    let a = lab.ns("a").expect("ns a");
    let b = lab.ns("b").expect("ns b");
    let c = lab.ns("c").expect("ns c");
    segment(&mut lab, &[(&a, cidrs[0]), (&b, cidrs[1]), (&c, cidrs[2])]);
    let local = SocketAddr::from(([127, 0, 0, 1], 8080));
    let backend_a = Backend::start(&a, local, "a");
    let backend_b = Backend::start(&b, local, "b");
    Pair {
        lab,
        a,
        b,
        c,
        backend_a,
        backend_b,
    }
}

fn expect_role(f: &NsFulcrum, role: &str, within: Duration) {
    assert!(
        wait_for(within, || f.role() == role),
        "{} is {} rather than {role}: {}\n{}",
        f.ns.name,
        f.role(),
        f.ha(),
        f.logs()
    );
}

/// The client in `c` gets an answer from `who` within `within`.
fn expect_served_by(c: &Ns, who: &str, within: Duration) {
    expect_served_at(c, vip(), who, within);
}

fn expect_served_at(c: &Ns, at: SocketAddr, who: &str, within: Duration) {
    let name = who.to_string();
    let c2 = c.clone();
    let ok = wait_for(within, move || {
        let who = name.clone();
        in_ns(&c2, move || {
            http_get(at, Duration::from_millis(300)).is_ok_and(|b| b == who)
        })
    });
    assert!(ok, "{at} is not served by {who}");
}

#[test]
fn master_dies_backup_takes_over_and_the_better_node_preempts_when_it_returns() {
    let mut p = pair("haf");
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &node_config("a", 150, ""));
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &node_config("b", 100, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(holds(&p.a, VIP) && !holds(&p.b, VIP));
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    assert!(wait_for(Duration::from_secs(5), || fb.ha()["peer"]
        ["address"]
        == "198.18.0.1"));
    let hb = fb.ha();
    assert_eq!(hb["peer"]["priority"], 150);
    assert!(hb["adverts"]["received"].as_u64().unwrap() > 0);
    assert_eq!(hb["dropped"]["checksum"], 0);
    let ha = fa.ha();
    assert_eq!(ha["last_transition"]["to"], "master", "{ha}");
    assert!(ha["adverts"]["sent"].as_u64().unwrap() > 0);
    let (_, metrics) = api_raw(&p.a, "GET", "/metrics", "");
    assert!(
        metrics.contains("fulcrum_ha_state{vrid=\"51\",state=\"master\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("fulcrum_ha_adverts_sent_total{vrid=\"51\"}"));
    let (_, metrics) = api_raw(&p.b, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_ha_state{vrid=\"51\",state=\"backup\"} 1"));

    // The master node fails: process killed, and its link gone with it (a machine that dies
    // takes its VIP with it; a process killed alone leaves the address on a live kernel, see
    // the next phase).
    let stop = Arc::new(AtomicBool::new(false));
    let client = client_loop(&p.c, vip(), Duration::from_millis(10), 3000, stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    p.lab.kill(fa.index);
    p.a.ip(&["link", "set", "eth0", "down"]).unwrap();
    expect_role(&fb, "master", Duration::from_secs(5));
    expect_served_by(&p.c, "b", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let log = client.join().unwrap();
    let gap = log.gap("a", "b").expect("served by a, then by b");
    eprintln!(
        "failover: gap {:?}, {} failed of {} requests",
        gap,
        log.failures(),
        log.results.len()
    );
    assert!(holds(&p.b, VIP));

    // Node a comes back (link up, Fulcrum started again on the same files): the address it
    // left behind when killed is removed at start, it comes up as backup, hears a lower
    // priority master and preempts it.
    p.a.ip(&["link", "set", "eth0", "up"]).unwrap();
    assert!(
        holds(&p.a, VIP),
        "the killed process left its address behind"
    );
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &node_config("a", 150, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(!holds(&p.b, VIP), "b released the VIP");
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    assert_eq!(
        fb.ha()["last_transition"]["reason"],
        "higher priority master"
    );
}

#[test]
fn a_node_whose_members_are_all_down_hands_over() {
    let mut p = pair("hah");
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &node_config("a", 150, ""));
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &node_config("b", 100, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));

    // a's only member goes down: a resigns (priority 0) and refuses mastership.
    p.backend_a.stop();
    expect_role(&fa, "fault", Duration::from_secs(5));
    expect_role(&fb, "master", Duration::from_secs(5));
    expect_served_by(&p.c, "b", Duration::from_secs(5));
    let ha = fa.ha();
    assert_eq!(ha["healthy"], false);
    assert!(
        ha["adverts"]["priority_zero_sent"].as_u64().unwrap() >= 1,
        "{ha}"
    );
    assert!(!holds(&p.a, VIP));

    // Its member returns: a is backup again, then preempts.
    p.backend_a = Backend::start(&p.a, SocketAddr::from(([127, 0, 0, 1], 8080)), "a");
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    drop(p.backend_b);
}

#[test]
fn a_split_brain_heals_to_exactly_one_master() {
    let mut p = pair("has");
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &node_config("a", 150, ""));
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &node_config("b", 100, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));

    // b stops hearing adverts (a filter on its input): it becomes master too.
    p.b.exec("nft", &["add", "table", "inet", "splitbrain"])
        .unwrap();
    p.b.exec(
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "splitbrain",
            "in",
            "{ type filter hook input priority -300 ; }",
        ],
    )
    .unwrap();
    p.b.exec(
        "nft",
        &[
            "add",
            "rule",
            "inet",
            "splitbrain",
            "in",
            "ip",
            "protocol",
            "112",
            "drop",
        ],
    )
    .unwrap();
    expect_role(&fb, "master", Duration::from_secs(5));
    assert_eq!(fa.role(), "master");
    assert!(holds(&p.a, VIP) && holds(&p.b, VIP));

    // Heal: b hears a again and steps down; a announces itself again; one master remains.
    p.b.exec("nft", &["delete", "table", "inet", "splitbrain"])
        .unwrap();
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(!holds(&p.b, VIP));
    // Stable: it stays that way for a while (20 advert intervals).
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!((fa.role(), fb.role()), ("master".into(), "backup".into()));
    }
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    drop((p.backend_a, p.backend_b));
}

#[test]
fn unicast_peers_and_a_master_process_killed_on_a_live_host() {
    let mut p = pair("hau");
    let fa = NsFulcrum::start(
        &mut p.lab,
        &p.a,
        BIN,
        &node_config("a", 150, "peers = [\"198.18.0.2\"]"),
    );
    let fb = NsFulcrum::start(
        &mut p.lab,
        &p.b,
        BIN,
        &node_config("b", 100, "peers = [\"198.18.0.1\"]"),
    );
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(wait_for(Duration::from_secs(5), || fb.ha()["peer"]
        ["address"]
        == "198.18.0.1"));
    assert_eq!(fb.ha()["peers"], serde_json::json!(["198.18.0.1"]));
    expect_served_by(&p.c, "a", Duration::from_secs(5));

    // Only the process dies: a's kernel keeps the VIP (as with keepalived killed -9), but b's
    // gratuitous ARPs move the segment over and the client is served by b.
    p.lab.kill(fa.index);
    expect_role(&fb, "master", Duration::from_secs(5));
    expect_served_by(&p.c, "b", Duration::from_secs(5));
    assert!(
        holds(&p.a, VIP),
        "a killed process cannot remove its address"
    );
    // A stable handover: b keeps serving (the client's ARP entry stays on b).
    for _ in 0..10 {
        let ok = in_ns(&p.c, || http_get(vip(), Duration::from_millis(300)));
        assert_eq!(ok.as_deref(), Ok("b"));
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((p.backend_a, p.backend_b));
}

#[test]
fn maintenance_through_the_api_moves_the_vip_and_survives_a_restart() {
    let mut p = pair("ham");
    let files = tempfile::tempdir().unwrap();
    let state = files.path().join("state.json");
    let config_a = node_config("a", 150, "").replace(
        "[admin]\n",
        &format!("[admin]\nstate_file = \"{}\"\n", state.display()),
    );
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &config_a);
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &node_config("b", 100, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));

    // The operator takes a out (F5's "force to standby"): it resigns at once, b takes over.
    let (status, body) = api_with(
        &p.a,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance": true}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["maintenance"], true);
    expect_role(&fa, "fault", Duration::from_secs(5));
    expect_role(&fb, "master", Duration::from_secs(5));
    assert_eq!(fa.ha()["last_transition"]["reason"], "maintenance");
    expect_served_by(&p.c, "b", Duration::from_secs(5));
    let (status, _) = api_with(&p.a, "PUT", "/api/v1/ha/maintenance", r#"{"on": 1}"#);
    assert_eq!(status, 400);

    // Restarted, a is still in maintenance (admin.state_file) and does not preempt.
    p.lab.kill(fa.index);
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &config_a);
    expect_role(&fa, "fault", Duration::from_secs(5));
    assert_eq!(fa.ha()["maintenance"], true);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((fa.role(), fb.role()), ("fault".into(), "master".into()));

    // Maintenance ends: a is backup, then preempts.
    let (status, _) = api_with(
        &p.a,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance": false}"#,
    );
    assert_eq!(status, 200);
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    drop((p.backend_a, p.backend_b));
}

#[test]
fn ipv6_master_dies_and_the_backup_takes_over() {
    const VIP6: &str = "2001:db8::100";
    let vip6: SocketAddr = "[2001:db8::100]:80".parse().unwrap();
    let mut p = pair_on(
        "ha6",
        ["2001:db8::1/64", "2001:db8::2/64", "2001:db8::10/64"],
    );
    let v6 = |name: &str, priority: u8| {
        node_config(name, priority, "")
            .replace(&format!("{VIP}/24"), &format!("{VIP6}/64"))
            .replace("0.0.0.0:80", "[::]:80")
    };
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &v6("a", 150));
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &v6("b", 100));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    // Adverts come from the link-local address (RFC 5798 §5.1.2.1).
    let ha = fa.ha();
    assert!(ha["address"].as_str().unwrap().starts_with("fe80:"), "{ha}");
    assert!(
        wait_for(Duration::from_secs(5), || fb.ha()["peer"]["address"]
            == ha["address"]),
        "{}",
        fb.ha()
    );
    assert!(holds(&p.a, VIP6) && !holds(&p.b, VIP6));
    expect_served_at(&p.c, vip6, "a", Duration::from_secs(5));

    // a dies; b takes the VIP and its unsolicited neighbour advertisements move the client.
    p.lab.kill(fa.index);
    p.a.ip(&["link", "set", "eth0", "down"]).unwrap();
    expect_role(&fb, "master", Duration::from_secs(5));
    assert!(holds(&p.b, VIP6));
    expect_served_at(&p.c, vip6, "b", Duration::from_secs(5));
    assert!(fb.ha()["garps_sent"].as_u64().unwrap() >= 1);
    drop((p.backend_a, p.backend_b));
}

#[test]
fn sync_shares_member_states_set_through_the_api() {
    let mut p = pair("hay");
    let key = "a-sync-key-for-the-test-0123";
    let cfg = |name: &str, prio: u8, me: &str, peer: &str| {
        node_config(
            name,
            prio,
            &format!(
                "sync = {{ listen = \"{me}:7500\", peers = [\"{peer}:7500\"], key = \"{key}\" }}"
            ),
        )
    };
    let fa = NsFulcrum::start(
        &mut p.lab,
        &p.a,
        BIN,
        &cfg("a", 150, "198.18.0.1", "198.18.0.2"),
    );
    let fb = NsFulcrum::start(
        &mut p.lab,
        &p.b,
        BIN,
        &cfg("b", 100, "198.18.0.2", "198.18.0.1"),
    );
    let member = |ns: &Ns| api(ns, "GET", "/api/v1/pools/local/members/127.0.0.1:8080").1;
    let set = |ns: &Ns, what: &str, body: &str| {
        let path = format!("/api/v1/pools/local/members/127.0.0.1:8080/{what}");
        assert_eq!(api_with(ns, "PUT", &path, body).0, 200);
    };

    // Drained on a: b follows.
    set(&p.a, "state", r#"{"state": "drain"}"#);
    assert!(
        wait_for(Duration::from_secs(5), || member(&p.b)["state"] == "drain"),
        "{}\n{}",
        fb.ha(),
        fb.logs()
    );
    let hb = fb.ha();
    assert!(hb["sync"]["frames_received"].as_u64().unwrap() >= 1, "{hb}");
    assert!(hb["sync_lag_ms"].as_f64().is_some(), "{hb}");
    assert_eq!(hb["sync"]["auth_failures"], 0);
    assert_eq!(hb["sync"]["peer_config_matches"], true, "{hb}");
    // A weight set on b: a follows, and a's drain stays.
    set(&p.b, "weight", r#"{"weight": 5}"#);
    assert!(wait_for(Duration::from_secs(5), || member(&p.a)["weight"] == 5));
    assert_eq!(member(&p.a)["state"], "drain");

    // b restarts with no state of its own: the first frame from a (a full resync) brings it
    // back to drain and weight 5.
    p.lab.kill(fb.index);
    let fb = NsFulcrum::start(
        &mut p.lab,
        &p.b,
        BIN,
        &cfg("b", 100, "198.18.0.2", "198.18.0.1"),
    );
    assert!(
        wait_for(Duration::from_secs(5), || {
            let m = member(&p.b);
            m["state"] == "drain" && m["weight"] == 5
        }),
        "{}\n{}",
        member(&p.b),
        fb.logs()
    );
    // Back to the configuration's values on a: b follows.
    set(&p.a, "state", r#"{"state": "enabled"}"#);
    set(&p.a, "weight", r#"{"weight": 1}"#);
    assert!(wait_for(Duration::from_secs(5), || {
        let m = member(&p.b);
        m["state"] == "enabled" && m["weight"] == 1
    }));

    // b comes back with other pools than a: reported in the API and the metrics.
    p.lab.kill(fb.index);
    let other = cfg("b", 100, "198.18.0.2", "198.18.0.1").replace(
        "name = \"local\"\nmonitors",
        "name = \"local\"\nalgorithm = \"least_connections\"\nmonitors",
    );
    assert!(other.contains("least_connections"));
    let _fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &other);
    assert!(wait_for(Duration::from_secs(5), || {
        api(&p.b, "GET", "/api/v1/ha").1["sync"]["peer_config_matches"] == false
    }));
    let (_, metrics) = api_raw(&p.b, "GET", "/metrics", "");
    assert!(
        metrics.contains("fulcrum_ha_sync_config_mismatch{vrid=\"51\"} 1"),
        "{metrics}"
    );
    drop((fa, p.backend_a, p.backend_b));
}

#[test]
fn source_persistence_holds_on_the_new_master() {
    let mut lab = Lab::new("hap");
    let a = lab.ns("a").unwrap();
    let b = lab.ns("b").unwrap();
    let c = lab.ns("c").unwrap();
    let srv = lab.ns("s").unwrap();
    segment(
        &mut lab,
        &[
            (&a, "198.18.0.1/24"),
            (&b, "198.18.0.2/24"),
            (&c, "198.18.0.10/24"),
            (&srv, "198.18.0.21/24"),
        ],
    );
    srv.addr("eth0", "198.18.0.22/24").unwrap();
    let clients: Vec<std::net::IpAddr> = (10..18).map(|i| [198, 18, 0, i].into()).collect();
    for ip in &clients[1..] {
        c.addr("eth0", &format!("{ip}/24")).unwrap();
    }

    let _m1 = Backend::start(&srv, "198.18.0.21:8080".parse().unwrap(), "m1");
    let _m2 = Backend::start(&srv, "198.18.0.22:8080".parse().unwrap(), "m2");
    let config = |name: &str, prio: u8, me: &str, peer: &str| {
        format!(
            r#"[admin]
listen = "127.0.0.1:9900"
token = "lab-admin-token-0123456789"

[ha]
node = "{name}"
interface = "eth0"
vrid = 51
priority = {prio}
advert_interval = "100ms"
vips = ["{VIP}/24"]
sync = {{ listen = "{me}:7500", peers = ["{peer}:7500"], key = "a-sync-key-for-the-test-0123" }}

[[virtual_service]]
name = "web"
listen = ["0.0.0.0:80"]
protocol = "tcp"
pool = "shared"
persistence = "by-source"

[[pool]]
name = "shared"
algorithm = "round_robin"
[[pool.member]]
address = "198.18.0.21:8080"
[[pool.member]]
address = "198.18.0.22:8080"

[[persistence]]
name = "by-source"
type = "source_ip"
source_mask = 32
"#
        )
    };
    let fa = NsFulcrum::start(
        &mut lab,
        &a,
        BIN,
        &config("a", 150, "198.18.0.1", "198.18.0.2"),
    );
    let fb = NsFulcrum::start(
        &mut lab,
        &b,
        BIN,
        &config("b", 100, "198.18.0.2", "198.18.0.1"),
    );
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(wait_for(Duration::from_secs(5), || holds(&a, VIP)));

    // Eight clients, all stuck to m1: m2 takes no new clients (weight 0) while they arrive, then
    // gets its weight back (the weights reach b through the sync too). Without the synced
    // table, b's round robin would send half of them to m2 after the failover.
    let ask = |from: std::net::IpAddr| {
        in_ns(&c, move || {
            http_get_from(from, vip(), Duration::from_millis(500))
        })
    };
    let weight = |w: u32| {
        let path = "/api/v1/pools/shared/members/198.18.0.22:8080/weight";
        let body = format!("{{\"weight\": {w}}}");
        assert_eq!(api_with(&a, "PUT", path, &body).0, 200);
    };
    weight(0);
    let mut chosen = Vec::new();
    for ip in &clients {
        let first = ask(*ip).expect("served by a");
        for _ in 0..3 {
            assert_eq!(ask(*ip).as_deref(), Ok(first.as_str()), "{ip} sticks");
        }
        chosen.push(first);
    }
    assert!(chosen.iter().all(|m| m == "m1"), "{chosen:?}");
    weight(1);
    // The entries reach b.
    assert!(wait_for(Duration::from_secs(5), || {
        fb.ha()["sync"]["frames_received"].as_u64().unwrap_or(0) >= 2
    }));
    std::thread::sleep(Duration::from_millis(300));

    // a dies; on b every client goes on to the member a chose for it.
    lab.kill(fa.index);
    a.ip(&["link", "set", "eth0", "down"]).unwrap();
    expect_role(&fb, "master", Duration::from_secs(5));
    assert!(wait_for(Duration::from_secs(5), || ask(clients[0]).is_ok()));
    for (ip, member) in clients.iter().zip(&chosen) {
        assert_eq!(
            ask(*ip).as_deref(),
            Ok(member.as_str()),
            "{ip} after the failover"
        );
    }
    let hb = fb.ha();
    assert_eq!(hb["sync"]["entries_dropped"], 0, "{hb}");
}

#[test]
fn a_reload_changes_priority_at_once_and_reports_what_needs_a_restart() {
    let p = pair("har");
    let mut lab = p.lab;
    let sync = |me: &str, peers: &str| {
        format!("sync = {{ listen = \"{me}:7500\", peers = [{peers}], key = \"a-sync-key-for-the-test-0123\" }}")
    };
    let fa = NsFulcrum::start(
        &mut lab,
        &p.a,
        BIN,
        &node_config("a", 150, &sync("198.18.0.1", "")),
    );
    let fb = NsFulcrum::start(
        &mut lab,
        &p.b,
        BIN,
        &node_config("b", 100, &sync("198.18.0.2", "")),
    );
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));

    // b gets a higher priority and a new advert interval (both apply at once: b preempts a),
    // a sync peer (dialled at once), and another VRID (needs a restart: b keeps running VRID
    // 51, and says so).
    let edited = node_config("b", 200, &sync("198.18.0.2", "\"198.18.0.1:7500\""))
        .replace("vrid = 51", "vrid = 52")
        .replace("advert_interval = \"100ms\"", "advert_interval = \"200ms\"");
    // The same change with a listener on a port already taken on b: the reload is refused at
    // the bind, after the checks, and the VRRP node keeps its priority — b does not preempt.
    let taken = in_ns(&p.b, || {
        std::net::TcpListener::bind("0.0.0.0:8099").unwrap()
    });
    let refused = format!(
        "{edited}\n[[virtual_service]]\nname = \"taken\"\nlisten = [\"0.0.0.0:8099\"]\nprotocol = \"tcp\"\npool = \"local\"\n"
    );
    std::fs::write(fb.dir.path().join("fulcrum.toml"), refused).unwrap();
    let (status, body) = api_with(&p.b, "POST", "/api/v1/reload", "");
    assert_eq!(status, 400, "{body}");
    let hb = fb.ha();
    assert_eq!(
        hb["configured_priority"], 100,
        "a refused reload changed the priority: {hb}"
    );
    assert_eq!(hb["advert_interval_ms"], 100.0, "{hb}");
    assert!(
        fb.ha()["sync"]["peers"]
            .as_array()
            .is_none_or(|p| p.is_empty()),
        "{}",
        fb.ha()
    );
    std::thread::sleep(Duration::from_millis(500)); // five advert intervals: no preemption
    assert_eq!(fa.role(), "master");
    assert_eq!(fb.role(), "backup");
    drop(taken);
    std::fs::write(fb.dir.path().join("fulcrum.toml"), edited).unwrap();
    let (status, body) = api_with(&p.b, "POST", "/api/v1/reload", "");
    assert_eq!(status, 200, "{body}");
    expect_role(&fb, "master", Duration::from_secs(5));
    expect_role(&fa, "backup", Duration::from_secs(5));
    assert!(wait_for(Duration::from_secs(5), || holds(&p.b, VIP)
        && !holds(&p.a, VIP)));
    let hb = fb.ha();
    assert_eq!(hb["configured_priority"], 200, "{hb}");
    assert_eq!(hb["advert_interval_ms"], 200.0, "{hb}");
    assert_eq!(hb["vrid"], 51, "{hb}");
    assert!(wait_for(Duration::from_secs(5), || fa.ha()["peer"]
        ["priority"]
        == 200));
    assert!(wait_for(Duration::from_secs(5), || {
        fa.ha()["sync"]["frames_received"].as_u64().unwrap_or(0) >= 1
    }));
    assert_eq!(fb.ha()["sync"]["peers"][0]["connected"], true);
    let logs = fb.logs();
    assert!(
        logs.contains("[ha] changes applied by the reload")
            && logs.contains("priority, advert_interval, sync.peers"),
        "{logs}"
    );
    assert!(
        logs.contains("ha.vrid changed: it takes effect at the next restart")
            && logs.contains("key=ha.vrid running=51 configured=52"),
        "{logs}"
    );
    drop((fa, fb, p.backend_a, p.backend_b));
}

/// A proxied connection cannot move to the new master (its state lived in the dead process):
/// the client must learn at once rather than hang. Its next request on the old connection
/// reaches the new master, whose kernel knows no such connection and resets it; the client's
/// reconnect is served by the new master.
#[test]
fn a_proxied_connection_of_a_dead_master_is_reset_at_the_clients_next_request() {
    use std::io::{Read, Write};
    let mut p = pair("hrst");
    let fa = NsFulcrum::start(&mut p.lab, &p.a, BIN, &node_config("a", 150, ""));
    let fb = NsFulcrum::start(&mut p.lab, &p.b, BIN, &node_config("b", 100, ""));
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    expect_served_by(&p.c, "a", Duration::from_secs(5));
    // One request on the connection; the whole response (head and its content-length body).
    let ask = |s: &mut std::net::TcpStream| -> std::io::Result<String> {
        s.write_all(b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n")?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let want = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if body.len() >= want {
                    return Ok(text);
                }
            }
        }
    };
    // One keep-alive connection, answered by a.
    let mut held = in_ns(&p.c, || {
        let s = std::net::TcpStream::connect_timeout(&vip(), Duration::from_secs(1)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    });
    let first = ask(&mut held).unwrap();
    assert!(
        first.ends_with('a') || first.contains("\r\n\r\na"),
        "{first:?}"
    );
    // a's machine dies: its link first, so no FIN or RST of its kernel reaches the client
    // (a power cut sends none), then the process.
    p.a.ip(&["link", "set", "eth0", "down"]).unwrap();
    p.lab.kill(fa.index);
    expect_role(&fb, "master", Duration::from_secs(5));
    expect_served_by(&p.c, "b", Duration::from_secs(5));
    // The held connection's next request: reset by b's kernel at once, not a 10 s wait.
    let t = std::time::Instant::now();
    let r = ask(&mut held);
    let took = t.elapsed();
    eprintln!("held connection after the failover: {r:?} after {took:?}");
    assert!(
        r.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the old connection answered or timed out: {r:?}"
    );
    assert!(took < Duration::from_secs(3), "the client waited {took:?}");
    // Reconnecting reaches the new master.
    expect_served_by(&p.c, "b", Duration::from_secs(2));
    drop((fb, p.backend_a, p.backend_b));
}
