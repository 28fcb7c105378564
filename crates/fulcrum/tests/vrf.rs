//! `vrf` (H3C's VPN instance as part of a virtual service's identity), through the binary in
//! network namespaces the test creates.
//!
//! This kernel has no VRF devices (`ip link add blue type vrf table 10` answers "Unknown device
//! type": CONFIG_NET_VRF is off), so a plain interface stands in for each VRF. Fulcrum enters a
//! VRF by binding its sockets to the VRF's device (SO_BINDTODEVICE, what `ip vrf exec` does), and
//! a socket bound to any device is held to it the same way: it accepts only what arrives there
//! and its connections route only out of it. Two client namespaces reach Fulcrum through the
//! interfaces `blue` and `red`, which carry the same address on the same subnet, with a member
//! at the same address behind each:
//!
//!   ns blue: client 10.77.0.2, member 10.77.0.3:8080 ("blue") — blue ┐
//!                                                                   [fl] 10.77.0.1 on both
//!   ns red:  client 10.77.0.2, member 10.77.0.3:8080 ("red")  — red  ┘
//!
//! Without the VRF binding the two services could not both listen on 10.77.0.1:80, each pool
//! would reach whichever member the first route leads to, and so would its health checks.

#[path = "common/lab.rs"]
mod lab;

use std::net::SocketAddr;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::{api, in_ns, wait_for, Backend, NsFulcrum, ADMIN_TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

fn config() -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "{ADMIN_TOKEN}"

[[virtual_service]]
name = "blue-web"
listen = "10.77.0.1:80"
protocol = "http"
pool = "blue"
vrf = "blue"

[[virtual_service]]
name = "red-web"
listen = "10.77.0.1:80"
protocol = "http"
pool = "red"
vrf = "red"

[[virtual_service]]
name = "red-tcp"
listen = "10.77.0.1:81"
protocol = "tcp"
pool = "red"
vrf = "red"

[[pool]]
name = "blue"
vrf = "blue"
monitors = ["up"]
[[pool.member]]
address = "10.77.0.3:8080"

[[pool]]
name = "red"
vrf = "red"
monitors = ["up"]
[[pool.member]]
address = "10.77.0.3:8080"

[[monitor]]
name = "up"
type = "tcp"
interval = "200ms"
timeout = "200ms"
fall = 2
rise = 1
"#
    )
}

/// One GET from inside `ns` to `vs`: the answering member's name, or why it failed.
fn get(ns: &Ns, vs: &str) -> Result<String, String> {
    let vs: SocketAddr = vs.parse().unwrap();
    in_ns(ns, move || lab::http_get(vs, Duration::from_secs(3)))
}

/// The `health` of pool `pool`'s only member.
fn health(fl: &Ns, pool: &str) -> String {
    let (_, body) = api(fl, "GET", &format!("/api/v1/pools/{pool}"));
    body["members"][0]["health"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

#[test]
fn same_address_in_two_vrfs_is_two_services_with_their_own_members_and_checks() {
    let mut lab = Lab::new("vrf");
    let fl = lab.ns("fl").expect("fulcrum namespace");
    let blue = lab.ns("blue").expect("blue namespace");
    let red = lab.ns("red").expect("red namespace");
    for (side, name) in [(&blue, "blue"), (&red, "red")] {
        lab.veth(&fl, name, side, "eth0").expect("veth");
        fl.addr(name, "10.77.0.1/24").expect("fulcrum address");
        side.addr("eth0", "10.77.0.2/24").expect("client address");
        side.addr("eth0", "10.77.0.3/24").expect("member address");
    }
    let _blue_member = Backend::start(&blue, "10.77.0.3:8080".parse().unwrap(), "blue");
    let mut red_member = Backend::start(&red, "10.77.0.3:8080".parse().unwrap(), "red");
    let f = NsFulcrum::start(&mut lab, &fl, BIN, &config());

    assert!(
        wait_for(Duration::from_secs(10), || health(&fl, "blue") == "up"
            && health(&fl, "red") == "up"),
        "both members up through their own VRF: blue {}, red {}\n{}",
        health(&fl, "blue"),
        health(&fl, "red"),
        f.logs()
    );
    for _ in 0..3 {
        assert_eq!(get(&blue, "10.77.0.1:80"), Ok("blue".to_string()));
        assert_eq!(get(&red, "10.77.0.1:80"), Ok("red".to_string()));
        assert_eq!(get(&red, "10.77.0.1:81"), Ok("red".to_string()));
    }
    // Nothing listens on :81 in blue: the red service's listener is not reachable from there.
    assert!(get(&blue, "10.77.0.1:81").is_err());

    // The red member stops: only the red pool's checks, made from the red VRF, see it. (A check
    // made by the main routing table would reach the blue member for both pools.)
    red_member.stop();
    assert!(
        wait_for(Duration::from_secs(10), || health(&fl, "red") == "down"),
        "red member down: {}\n{}",
        health(&fl, "red"),
        f.logs()
    );
    assert_eq!(health(&fl, "blue"), "up");
    assert_eq!(get(&blue, "10.77.0.1:80"), Ok("blue".to_string()));
    assert!(get(&red, "10.77.0.1:80").is_err_and(|e| e.contains("503")));

    // A reload that moves a service into a VRF device this host does not have is refused with
    // the address, the VRF and the reason, and changes nothing: blue goes on being served.
    let path = f.dir.path().join("fulcrum.toml");
    let moved = config().replacen("vrf = \"blue\"", "vrf = \"green\"", 1);
    std::fs::write(&path, moved).expect("config");
    let (code, body) = lab::api_with(&fl, "POST", "/api/v1/reload", "{}");
    let errors = body["errors"].to_string();
    assert_eq!(code, 400, "{body}");
    assert!(
        errors.contains("10.77.0.1:80 in vrf green") && errors.contains("No such device"),
        "{errors}"
    );
    assert_eq!(get(&blue, "10.77.0.1:80"), Ok("blue".to_string()));
}
