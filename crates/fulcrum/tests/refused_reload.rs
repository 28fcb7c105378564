//! A reload that is refused changes nothing: each plane that touches the kernel or a peer is
//! given a configuration that passes its own checks but fails a later step (a stream listener
//! on a port another socket holds), and must run on exactly as before. Everything runs inside
//! namespaces the tests create (198.18.0.0/24).

#[path = "common/lab.rs"]
mod lab;

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use fulcrum_testkit::netns::Lab;
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

/// A tcp service on an address the test already holds: everything before the listeners are
/// bound accepts it, binding refuses it.
fn service_on_held_port(held: SocketAddr) -> String {
    format!(
        r#"
[[virtual_service]]
name = "blocked"
listen = ["{held}"]
protocol = "tcp"
pool = "local"
"#
    )
}

#[test]
fn a_refused_reload_leaves_ha_priority_peers_vips_and_the_state_file_as_they_were() {
    let mut lab = Lab::new("rrha");
    let a = lab.ns("a").expect("ns a");
    let c = lab.ns("c").expect("ns c");
    segment(&mut lab, &[(&a, "198.18.0.1/24"), (&c, "198.18.0.10/24")]);
    let _backend = Backend::start(&a, SocketAddr::from(([127, 0, 0, 1], 8080)), "a");
    let state = tempfile::tempdir().expect("tempdir");
    let state_file = state.path().join("fulcrum.state");
    let config = |priority: u8, peers: &str, tail: &str| {
        let sync = format!(
            "sync = {{ listen = \"198.18.0.1:7500\", peers = [{peers}], key = \"a-sync-key-for-the-test-0123\" }}"
        );
        ha_node_config("a", priority, &sync).replace(
            "token = \"lab-admin-token-0123456789\"",
            &format!(
                "token = \"lab-admin-token-0123456789\"\nstate_file = \"{}\"",
                state_file.display()
            ),
        ) + tail
    };
    let fa = NsFulcrum::start(&mut lab, &a, BIN, &config(150, "", ""));
    assert!(
        wait_for(Duration::from_secs(5), || fa.role() == "master"),
        "{}",
        fa.logs()
    );
    assert!(wait_for(Duration::from_secs(5), || holds(&a, HA_VIP)));
    // An operator's change, so the state file has something to lose.
    let weight = "/api/v1/pools/local/members/127.0.0.1:8080/weight";
    assert_eq!(api_with(&a, "PUT", weight, "{\"weight\": 3}").0, 200);
    assert!(wait_for(Duration::from_secs(5), || state_file.exists()));
    let state_before = std::fs::read(&state_file).expect("state file");
    let ha_before = fa.ha();

    let held: SocketAddr = "127.0.0.1:9443".parse().expect("addr");
    let _holder = in_ns(&a, move || TcpListener::bind(held)).expect("hold the port");
    let refused = config(200, "\"198.18.0.10:7500\"", &service_on_held_port(held));
    std::fs::write(fa.dir.path().join("fulcrum.toml"), refused).expect("write config");
    let (status, body) = api_with(&a, "POST", "/api/v1/reload", "");
    assert_ne!(status, 200, "the reload must be refused: {body}");

    let ha_after = fa.ha();
    for key in ["configured_priority", "role", "vrid", "advert_interval_ms"] {
        assert_eq!(ha_after[key], ha_before[key], "{key}: {ha_after}");
    }
    assert_eq!(ha_after["configured_priority"], 150, "{ha_after}");
    assert_eq!(
        ha_after["sync"]["peers"], ha_before["sync"]["peers"],
        "no new sync peer is dialled: {ha_after}"
    );
    assert!(holds(&a, HA_VIP), "the VIP stays");
    assert_eq!(
        std::fs::read(&state_file).expect("state file"),
        state_before,
        "the state file is untouched"
    );
    let logs = fa.logs();
    assert!(
        !logs.contains("[ha] changes applied by the reload"),
        "{logs}"
    );
    drop(fa);
}
