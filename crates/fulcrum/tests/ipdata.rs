//! `[[ip_table]]` `asns` and `countries` without `geoip`: clients placed by the address table
//! Fulcrum ships, through the binary, asked by dig with EDNS Client Subnet. The subnets are
//! chosen from the shipped table itself (what it says AS4134 and China hold), not from
//! beliefs about the Internet, so the test holds for whatever data the binary carries.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use common::*;
use ipnet::IpNet;

fn dig(server: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args([
            "-p",
            &server.port().to_string(),
            "+norec",
            "+time=2",
            "+tries=2",
        ])
        .args(args)
        .output()
        .expect("dig (dnsutils) is installed by scripts/test.sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The answer's addresses and the scope dig printed for the client subnet `subnet`.
fn ask(server: SocketAddr, subnet: &IpNet) -> (Vec<String>, Option<u8>) {
    let out = dig(
        server,
        &["app.example.com", "A", &format!("+subnet={subnet}")],
    );
    let answers = out
        .lines()
        .skip_while(|l| *l != ";; ANSWER SECTION:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().last().map(String::from))
        .collect();
    let scope = out
        .split(&format!("CLIENT-SUBNET: {subnet}/"))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok());
    (answers, scope)
}

/// A client subnet of `len` bits inside `net` (its first), or `net` itself when narrower.
fn subnet_in(net: &IpNet, len: u8) -> IpNet {
    IpNet::new(net.network(), net.prefix_len().max(len))
        .unwrap()
        .trunc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gslb_regions_by_asn_and_country_from_the_shipped_table() {
    let data = fulcrum_ipdata::shipped().unwrap();
    let telecom = data.asn_prefixes(&[4134, 4812]);
    let telecom_v4: Vec<&IpNet> = telecom.iter().filter(|n| n.addr().is_ipv4()).collect();
    let telecom_v6 = telecom.iter().find(|n| n.addr().is_ipv6()).unwrap();
    // The operator lists one of AS4134's /24s as their office: that placement wins.
    let office = subnet_in(telecom_v4[0], 24);
    let in_telecom = subnet_in(telecom_v4[telecom_v4.len() / 2], 24);
    let not_telecom = |ip: IpAddr| {
        data.asn(ip)
            .is_none_or(|h| ![4134, 4812].contains(&h.value))
    };
    let china = data
        .country_prefixes(&["CN".into()])
        .into_iter()
        .filter(|n| n.addr().is_ipv4() && not_telecom(n.network()))
        .map(|n| subnet_in(&n, 24))
        .next()
        .unwrap();
    // Somewhere in the table, in no listed AS and not in China (nor the office).
    let elsewhere = data
        .asn_prefixes(&[13335, 15169, 3320, 2914])
        .into_iter()
        .filter(|n| {
            n.addr().is_ipv4() && data.country(n.network()).is_some_and(|c| c.value != "CN")
        })
        .map(|n| subnet_in(&n, 24))
        .next()
        .unwrap();
    assert_eq!(data.country(in_telecom.network()).unwrap().value, "CN");

    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let config = format!(
        r#"
[dns]
listen = ["{dns}"]

[[dns.zone]]
origin = "example.com."
records = ["@ 300 IN SOA ns1 hostmaster 1 3600 600 86400 60", "@ 300 IN NS ns1", "ns1 300 IN A 192.0.2.1"]

[[ip_table]]
name = "china"
countries = ["CN"]

[[ip_table]]
name = "cn-telecom"
asns = [4134, 4812]

[[ip_table]]
name = "office"
cidrs = ["{office}"]

[[gslb.site]]
name = "default"
addresses = ["192.0.2.1"]

[[gslb.site]]
name = "telecom"
addresses = ["192.0.2.10"]
regions = ["cn-telecom"]

[[gslb.site]]
name = "mainland"
addresses = ["192.0.2.20"]
regions = ["china"]

[[gslb.site]]
name = "hq"
addresses = ["192.0.2.30"]
regions = ["office"]

[[gslb.name]]
fqdn = "app.example.com."
sites = ["default", "telecom", "mainland", "hq"]
algorithm = "topology"
fallback = "first_available"
"#
    );
    let path = dir.path().join("fulcrum.toml");
    std::fs::write(&path, &config).unwrap();
    let check = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    let said = String::from_utf8_lossy(&check.stdout);
    let about = fulcrum_ipdata::about();
    assert!(
        said.contains(
            "ip_table \"china\", \"cn-telecom\" placed by the address table Fulcrum ships"
        ) && said.contains(about.date),
        "{said}"
    );
    let f = start(&config).await;

    // By AS (before the country, though "china" is listed first), with the range as scope.
    let (answers, scope) = ask(dns, &in_telecom);
    assert_eq!(answers, ["192.0.2.10"], "{in_telecom} (AS4134/4812)");
    let hit = data.asn(in_telecom.network()).unwrap();
    assert_eq!(
        scope,
        Some(hit.prefix_len),
        "{in_telecom}: the table's range decides"
    );
    let v6 = subnet_in(telecom_v6, 48);
    assert_eq!(ask(dns, &v6).0, ["192.0.2.10"], "{v6} (AS4134/4812, IPv6)");
    // By country: China outside those ASes.
    assert_eq!(ask(dns, &china).0, ["192.0.2.20"], "{china} (CN)");
    // The operator's prefix beats the shipped table.
    assert_eq!(
        ask(dns, &office).0,
        ["192.0.2.30"],
        "{office} (office cidr)"
    );
    // In no table: the fallback, the first site.
    assert_eq!(ask(dns, &elsewhere).0, ["192.0.2.1"], "{elsewhere}");

    // The status says which table placed them, beside the version.
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["ip_data"]["date"], about.date, "{status}");
    assert_eq!(status["ip_data"]["source"], about.source, "{status}");
    let version = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains(about.date) && version.contains("CC BY 4.0"),
        "{version}"
    );
}

#[test]
fn check_refuses_bad_asns_and_countries_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fulcrum.toml");
    std::fs::write(
        &path,
        "[[ip_table]]\nname = \"t\"\nasns = [64512, 4134]\ncountries = [\"ZZ\"]\n\n[[ip_table]]\nname = \"c\"\ncontinents = [\"AS\"]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "ip_table[0].asns[0]: 64512 is a private-use AS number",
        "ip_table[0].countries[0]: \"ZZ\" is not an ISO 3166-1 country code",
        "ip_table[1].continents: `continents` need `geoip`",
    ] {
        assert!(err.contains(needle), "no {needle:?} in:\n{err}");
    }
}
