//! The Debian package's pieces: the systemd unit and its drop-ins pass `systemd-analyze verify`
//! without a warning, grant exactly the capabilities documented (and never CAP_SYS_ADMIN), every
//! cargo-deb asset exists, and the shipped configuration passes `fulcrum check`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::BIN;

const PACKAGING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging");

fn key_values<'a>(unit: &'a str, key: &str) -> BTreeSet<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .flat_map(str::split_whitespace)
        .collect()
}

/// `systemd-analyze verify` on the unit (its binary paths pointing at the built binary) with
/// `dropins`; returns what it printed about files under the test's directory.
fn verify(dropins: &[&str]) -> String {
    // Not a dot directory (tempfile's default): systemd skips hidden paths when it looks for
    // drop-in directories.
    let dir = tempfile::Builder::new()
        .prefix("fulcrum-unit-")
        .tempdir()
        .unwrap();
    let unit = std::fs::read_to_string(Path::new(PACKAGING).join("fulcrum.service")).unwrap();
    std::fs::write(
        dir.path().join("fulcrum.service"),
        unit.replace("/usr/bin/fulcrum", BIN),
    )
    .unwrap();
    let d = dir.path().join("fulcrum.service.d");
    std::fs::create_dir(&d).unwrap();
    for name in dropins {
        std::fs::copy(
            Path::new(PACKAGING).join("systemd").join(name),
            d.join(name),
        )
        .unwrap();
    }
    let run = |debug: bool| {
        let mut cmd = Command::new("systemd-analyze");
        if debug {
            cmd.env("SYSTEMD_LOG_LEVEL", "debug");
        }
        let out = cmd
            .arg("verify")
            .arg(dir.path().join("fulcrum.service"))
            .output()
            .expect("systemd-analyze (package systemd, in scripts/test-packages)");
        // Warnings go to stderr; the debug unit dump (with its drop-ins) to stdout.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(out.status.success(), "{text}");
        text
    };
    // Debug output names the drop-ins it loaded (and chatter that is not a warning).
    let debug = run(true);
    for name in dropins {
        assert!(
            debug.contains(&format!("DropIn Path: {}", d.join(name).display())),
            "drop-in {name} not loaded:\n{debug}"
        );
    }
    let text = run(false);
    // Other units on the machine may draw warnings; ours must not. A warning names the file
    // and line: "/tmp/…/fulcrum.service:12: Unknown key …".
    let here = format!("{}/", dir.path().display());
    text.lines()
        .filter(|l| {
            l.split_once(&here).is_some_and(|(_, rest)| {
                rest.split(':')
                    .nth(1)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn unit_and_dropins_verify_and_grant_only_what_they_document() {
    let warnings = verify(&[]);
    assert!(warnings.is_empty(), "{warnings}");
    let warnings = verify(&["network.conf", "xdp.conf"]);
    assert!(warnings.is_empty(), "{warnings}");
    let warnings = verify(&["network.conf", "bird.conf"]);
    assert!(warnings.is_empty(), "{warnings}");

    let unit = std::fs::read_to_string(Path::new(PACKAGING).join("fulcrum.service")).unwrap();
    let base: BTreeSet<&str> = ["CAP_NET_BIND_SERVICE", "CAP_NET_RAW"].into();
    assert_eq!(key_values(&unit, "AmbientCapabilities"), base);
    assert_eq!(key_values(&unit, "CapabilityBoundingSet"), base);
    assert!(unit.contains("User=fulcrum") && unit.contains("NoNewPrivileges=yes"));
    let network =
        std::fs::read_to_string(Path::new(PACKAGING).join("systemd/network.conf")).unwrap();
    let with_admin: BTreeSet<&str> =
        ["CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_NET_ADMIN"].into();
    assert_eq!(key_values(&network, "AmbientCapabilities"), with_admin);
    assert_eq!(key_values(&network, "CapabilityBoundingSet"), with_admin);
    assert!(key_values(&network, "RestrictAddressFamilies").contains("AF_PACKET"));
    let xdp = std::fs::read_to_string(Path::new(PACKAGING).join("systemd/xdp.conf")).unwrap();
    let with_bpf: BTreeSet<&str> = [
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_RAW",
        "CAP_NET_ADMIN",
        "CAP_BPF",
        "CAP_PERFMON",
    ]
    .into();
    assert_eq!(key_values(&xdp, "AmbientCapabilities"), with_bpf);
    assert_eq!(key_values(&xdp, "CapabilityBoundingSet"), with_bpf);
    // BIRD mode's liveness interface is a TUN device: the private /dev keeps its other
    // protections and gains /dev/net/tun alone, granting no capability of its own.
    let bird = std::fs::read_to_string(Path::new(PACKAGING).join("systemd/bird.conf")).unwrap();
    assert!(key_values(&unit, "PrivateDevices").contains("yes"));
    assert_eq!(
        key_values(&bird, "BindPaths"),
        BTreeSet::from(["/dev/net/tun"])
    );
    assert_eq!(
        key_values(&bird, "DeviceAllow"),
        BTreeSet::from(["/dev/net/tun", "rw"])
    );
    assert!(key_values(&bird, "AmbientCapabilities").is_empty());
    assert!(key_values(&bird, "PrivateDevices").is_empty());
    for (name, text) in [("unit", &unit), ("network", &network), ("xdp", &xdp)] {
        let granted = key_values(text, "AmbientCapabilities");
        assert!(
            !granted.contains("CAP_SYS_ADMIN"),
            "{name} grants CAP_SYS_ADMIN"
        );
    }
}

#[test]
fn every_deb_asset_exists_and_the_shipped_config_passes_check() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let deb = manifest
        .split("[package.metadata.deb]")
        .nth(1)
        .expect("cargo-deb metadata");
    let mut sources = 0;
    for line in deb.lines().filter(|l| l.trim_start().starts_with("[\"")) {
        let src = line.trim_start().trim_start_matches("[\"");
        let src = &src[..src.find('"').unwrap()];
        if src.starts_with("target/") {
            continue; // the release binary cargo-deb builds
        }
        sources += 1;
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
        match src.rsplit_once("*.") {
            Some((dir, ext)) => {
                let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
                let n = std::fs::read_dir(&dir)
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                    .filter(|e| {
                        e.as_ref()
                            .is_ok_and(|e| e.path().extension().is_some_and(|x| x == ext))
                    })
                    .count();
                assert!(n > 0, "no {src}");
            }
            None => assert!(path.exists(), "asset {} is missing", path.display()),
        }
    }
    assert!(sources >= 6, "{sources} assets read");
    for script in ["postinst", "postrm"] {
        assert!(Path::new(PACKAGING).join("debian").join(script).exists());
    }
    // The shipped configuration, with the token postinst writes into it.
    let shipped = std::fs::read_to_string(Path::new(PACKAGING).join("fulcrum.toml")).unwrap();
    let (ok, text) = common::check(&shipped.replace("@TOKEN@", "0123456789abcdef0123456789abcdef"));
    assert!(ok, "{text}");
}
