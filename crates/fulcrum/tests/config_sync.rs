//! `[ha] config_sync` between two nodes on a shared segment (namespaces this test creates,
//! 198.18.0.0/24): a change applied on the backup serves on the master, each node keeps its own
//! `[admin]` and `[ha]`, a node that was stopped catches up, and changes on both sides of a
//! partition are reported and take nothing until an operator adopts one side.

#[path = "common/lab.rs"]
mod lab;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

fn node(name: &str, prio: u8, me: &str, peer: &str) -> String {
    ha_node_config(
        name,
        prio,
        &format!(
            "config_sync = true\nsync = {{ listen = \"{me}:7500\", peers = [\"{peer}:7500\"], key = \"a-sync-key-for-the-test-0123\" }}"
        ),
    )
}

/// A virtual service on `port` with one member, as an operator appends it to the file.
fn service(name: &str, port: u16, member_port: u16) -> String {
    format!(
        "\n# added by the operator: {name}\n[[virtual_service]]\nname = \"{name}\"\nlisten = [\"0.0.0.0:{port}\"]\nprotocol = \"http\"\npool = \"{name}\"\n\n[[pool]]\nname = \"{name}\"\n[[pool.member]]\naddress = \"127.0.0.1:{member_port}\"\n"
    )
}

fn file(f: &NsFulcrum) -> String {
    std::fs::read_to_string(f.dir.path().join("fulcrum.toml")).unwrap()
}

fn edit(f: &NsFulcrum, change: impl FnOnce(String) -> String) {
    let path = f.dir.path().join("fulcrum.toml");
    std::fs::write(&path, change(file(f))).unwrap();
    let (status, body) = api(&f.ns, "POST", "/api/v1/reload");
    assert_eq!(status, 200, "{body}\n{}", f.logs());
}

fn sync_state(f: &NsFulcrum) -> serde_json::Value {
    f.ha()["config_sync"].clone()
}

fn served(ns: &Ns, port: u16, who: &str) -> bool {
    let (who, at) = (who.to_string(), SocketAddr::from(([127, 0, 0, 1], port)));
    in_ns(ns, move || {
        http_get(at, Duration::from_millis(300)).is_ok_and(|b| b == who)
    })
}

#[test]
fn changes_travel_both_ways_a_restart_catches_up_and_a_partition_waits_for_the_operator() {
    let mut lab = Lab::new("csync");
    let a = lab.ns("a").unwrap();
    let b = lab.ns("b").unwrap();
    segment(&mut lab, &[(&a, "198.18.0.1/24"), (&b, "198.18.0.2/24")]);
    let local = SocketAddr::from(([127, 0, 0, 1], 8080));
    let _ba = Backend::start(&a, local, "a");
    let _bb = Backend::start(&b, local, "b");
    let added = SocketAddr::from(([127, 0, 0, 1], 8081));
    let _added_a = Backend::start(&a, added, "added-on-a");
    let _added_b = Backend::start(&b, added, "added-on-b");

    let fa = NsFulcrum::start(
        &mut lab,
        &a,
        BIN,
        &node("a", 200, "198.18.0.1", "198.18.0.2"),
    );
    let fb = NsFulcrum::start(
        &mut lab,
        &b,
        BIN,
        &node("b", 100, "198.18.0.2", "198.18.0.1"),
    );
    // Started from the same shared text: in sync without a word.
    assert!(
        wait_for(Duration::from_secs(10), || sync_state(&fa)["state"]
            == "in_sync"
            && sync_state(&fb)["state"] == "in_sync"),
        "{}\n{}\n{}",
        sync_state(&fa),
        sync_state(&fb),
        fa.logs()
    );

    // A service added on the backup through the configuration API serves on the master.
    let (status, body) = api_with(
        &b,
        "PUT",
        "/api/v1/config/pools/added",
        r#"{"member": [{"address": "127.0.0.1:8081"}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let t = Instant::now();
    let (status, body) = api_with(
        &b,
        "PUT",
        "/api/v1/config/virtual_services/added",
        r#"{"listen": ["0.0.0.0:81"], "protocol": "http", "pool": "added"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        wait_for(Duration::from_secs(5), || served(&a, 81, "added-on-a")),
        "the change made on b does not serve on a: {}\n{}",
        sync_state(&fa),
        fa.logs()
    );
    eprintln!(
        "config_sync: a change on b served on a after {:?}",
        t.elapsed()
    );
    let on_a = file(&fa);
    assert!(on_a.contains("name = \"added\""), "{on_a}");
    assert!(
        on_a.contains("node = \"a\"") && on_a.contains("priority = 200"),
        "a's own [ha] was overwritten:\n{on_a}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || sync_state(&fa)["state"]
            == "in_sync"
            && sync_state(&fb)["state"] == "in_sync"),
        "{}",
        sync_state(&fb)
    );
    assert_eq!(sync_state(&fa)["local"]["origin"], "b");
    // a's history names where its new version came from.
    let (_, history) = api(&a, "GET", "/api/v1/config/history");
    assert_eq!(history["versions"][0]["who"], "peer", "{history}");
    let check = std::process::Command::new(BIN)
        .args(["check", "-c"])
        .arg(fa.dir.path().join("fulcrum.toml"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    // b stops; a changes meanwhile; b catches up when it comes back.
    lab.kill(fb.index);
    edit(&fa, |text| text + &service("while-b-was-away", 82, 8081));
    let b_text = file(&fb);
    let fb = NsFulcrum::start_in(&mut lab, &b, BIN, &b_text, fb.dir);
    assert!(
        wait_for(Duration::from_secs(10), || served(&b, 82, "added-on-b")),
        "b did not catch up: {}\n{}",
        sync_state(&fb),
        fb.logs()
    );
    assert!(file(&fb).contains("node = \"b\""));

    // A partition with changes on both sides: reported on both, nothing taken.
    b.ip(&["link", "set", "eth0", "down"]).unwrap();
    edit(&fa, |text| text + &service("on-a", 83, 8081));
    edit(&fb, |text| text + &service("on-b", 84, 8081));
    b.ip(&["link", "set", "eth0", "up"]).unwrap();
    assert!(
        wait_for(Duration::from_secs(15), || sync_state(&fa)["state"]
            == "diverged"
            && sync_state(&fb)["state"] == "diverged"),
        "{}\n{}",
        sync_state(&fa),
        sync_state(&fb)
    );
    assert!(!file(&fa).contains("on-b") && !file(&fb).contains("\"on-a\""));
    assert!(!served(&a, 84, "added-on-a") && !served(&b, 83, "added-on-b"));

    // The operator keeps a's: b takes it (and loses its own change).
    let (status, body) = api_with(
        &fa.ns,
        "PUT",
        "/api/v1/ha/config_sync",
        r#"{"adopt":"local"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        wait_for(Duration::from_secs(5), || served(&b, 83, "added-on-b")
            && sync_state(&fb)["state"] == "in_sync"),
        "{}\n{}",
        sync_state(&fb),
        fb.logs()
    );
    assert!(!file(&fb).contains("\"on-b\""));
}
