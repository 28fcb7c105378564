//! `type = "snmp"` monitors against net-snmp's snmpd on loopback: health from an SNMP v2c GET,
//! and `dynamic_feedback` weights from the value (an `extend` script's output, so the test sets
//! the "load").

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use fulcrum_testkit::HttpBackend;

/// nsExtendOutput1Line."load" (NET-SNMP-EXTEND-MIB): the first line `extend load` printed.
const LOAD_OID: &str = "1.3.6.1.4.1.8072.1.3.2.3.1.1.4.108.111.97.100";
/// nsExtendOutput1Line."mem".
const MEM_OID: &str = "1.3.6.1.4.1.8072.1.3.2.3.1.1.3.109.101.109";

struct Snmpd(Child);

impl Drop for Snmpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// snmpd on `addr` (UDP) answering community "fulcrum", with `extend load` reading `load_file`.
fn snmpd(dir: &Path, addr: SocketAddr, load_file: &Path) -> Snmpd {
    snmpd_with(
        dir,
        addr,
        &format!(
            "rocommunity fulcrum 127.0.0.0/8\nextend load /bin/cat {}\n",
            load_file.display()
        ),
    )
}

/// snmpd on `addr` (UDP) with the configuration `text`.
fn snmpd_with(dir: &Path, addr: SocketAddr, text: &str) -> Snmpd {
    let conf = dir.join(format!("snmpd-{}.conf", addr.ip()));
    std::fs::write(&conf, text).unwrap();
    let child = Command::new("snmpd")
        .args(["-f", "-Ln", "-C", "-c"])
        .arg(&conf)
        .arg("-p")
        .arg(dir.join(format!("snmpd-{}.pid", addr.ip())))
        .arg(format!("udp:{addr}"))
        .env(
            "SNMP_PERSISTENT_DIR",
            dir.join(format!("state-{}", addr.ip())),
        )
        .env("MIBS", "")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("snmpd is installed by scripts/test.sh");
    Snmpd(child)
}

/// A UDP port free on both 127.0.0.1 and 127.0.0.2.
fn udp_port_on_both() -> u16 {
    loop {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if std::net::UdpSocket::bind(("127.0.0.2", port)).is_ok() {
            return port;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snmp_values_drive_dynamic_feedback_weights_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let port = udp_port_on_both();
    let (load1, load2) = (dir.path().join("load1"), dir.path().join("load2"));
    std::fs::write(&load1, "100\n").unwrap();
    std::fs::write(&load2, "300\n").unwrap();
    let _a1 = snmpd(dir.path(), SocketAddr::from(([127, 0, 0, 1], port)), &load1);
    let _a2 = snmpd(dir.path(), SocketAddr::from(([127, 0, 0, 2], port)), &load2);
    let m1 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 1]), "m1")
        .await
        .unwrap();
    let m2 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 2]), "m2")
        .await
        .unwrap();
    let bad = HttpBackend::start(free_addr(), "bad").await.unwrap();
    let vs = free_addr();
    let f = start(&format!(
        r#"[[virtual_service]]
name = "web"
listen = ["{vs}"]
protocol = "http"
pool = "app"

[[pool]]
name = "app"
algorithm = "dynamic_feedback"
monitors = ["load"]
[[pool.member]]
address = "{}"
weight = 10
[[pool.member]]
address = "{}"
weight = 10

[[pool]]
name = "other"
monitors = ["missing", "wrong-community"]
[[pool.member]]
address = "{}"

[[monitor]]
name = "load"
type = "snmp"
port = {port}
community = "fulcrum"
oid = "{LOAD_OID}"
max = 400
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 1

[[monitor]]
name = "missing"
type = "snmp"
port = {port}
community = "fulcrum"
oid = "1.3.6.1.4.1.99999.1.0"
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 1

[[monitor]]
name = "wrong-community"
type = "snmp"
port = {port}
community = "guess"
oid = "1.3.6.1.2.1.1.3.0"
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 1
"#,
        m1.addr, m2.addr, bad.addr
    ))
    .await;
    let (a1, a2) = (m1.addr.to_string(), m2.addr.to_string());
    // load 100 of 400 → 75 %, load 300 of 400 → 25 %.
    let ok = wait_until(Duration::from_secs(10), || async {
        f.member("app", &a1).await["agent"]["weight_percent"] == 75
            && f.member("app", &a2).await["agent"]["weight_percent"] == 25
    })
    .await;
    assert!(
        ok,
        "{}\n{}",
        f.get_json("/api/v1/pools/app").await,
        f.logs()
    );
    let m = f.member("app", &a1).await;
    assert_eq!(m["health"], "up");
    let last = m["checks"][0]["last"].as_str().unwrap();
    assert!(last.contains("100 of 400 -> weight 75%"), "{last}");
    // The scheduler follows: 3 requests to m1 for each to m2.
    for _ in 0..200 {
        let r = fulcrum_testkit::http_get(vs, "/").await.unwrap();
        assert_eq!(r.status, 200);
    }
    let (n1, n2) = (m1.requests(), m2.requests());
    assert!(
        (148..=152).contains(&n1) && (48..=52).contains(&n2),
        "{n1}:{n2}"
    );
    // The load changes; so does the weight.
    std::fs::write(&load2, "0\n").unwrap();
    let ok = wait_until(Duration::from_secs(10), || async {
        f.member("app", &a2).await["agent"]["weight_percent"] == 100
    })
    .await;
    assert!(ok, "{}", f.member("app", &a2).await);
    // An OID the agent does not have, and a community it does not know, fail the check.
    let b = bad.addr.to_string();
    let ok = wait_until(Duration::from_secs(10), || async {
        let m = f.member("other", &b).await;
        m["health"] == "down"
            && m["checks"]
                .as_array()
                .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["up"] == false))
    })
    .await;
    let m = f.member("other", &b).await;
    assert!(ok, "{m}");
    let text = m["checks"].to_string();
    assert!(text.contains("noSuchObject"), "{text}");
    assert!(
        text.contains("timeout") && text.contains("community?"),
        "{text}"
    );
}

/// snmpd on `addr` with two SNMPv3 users (created by `createUser` in its own config and
/// persistent directory): `fulcrumpriv` (SHA-256 + AES-128, authPriv required) and
/// `fulcrumauth` (SHA-1, authNoPriv), and `extend load` reading `load_file`.
fn snmpd_v3(dir: &Path, addr: SocketAddr, load_file: &Path) -> Snmpd {
    let conf = dir.join("snmpd-v3.conf");
    std::fs::write(
        &conf,
        format!(
            "createUser fulcrumpriv SHA-256 \"authpass-256\" AES \"privpass-aes\"\n\
             createUser fulcrumauth SHA \"authpass-sha1\"\n\
             rouser fulcrumpriv priv\n\
             rouser fulcrumauth auth\n\
             extend load /bin/cat {}\n",
            load_file.display()
        ),
    )
    .unwrap();
    let child = Command::new("snmpd")
        .args(["-f", "-Ln", "-C", "-c"])
        .arg(&conf)
        .arg("-p")
        .arg(dir.join("snmpd-v3.pid"))
        .arg(format!("udp:{addr}"))
        .env("SNMP_PERSISTENT_DIR", dir.join("state-v3"))
        .env("MIBS", "")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("snmpd is installed by scripts/test.sh");
    Snmpd(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snmp_v3_auth_priv_drives_weights_and_auth_no_priv_checks_health() {
    let dir = tempfile::tempdir().unwrap();
    let port = udp_port_on_both();
    let load = dir.path().join("load");
    std::fs::write(&load, "100\n").unwrap();
    let _agent = snmpd_v3(dir.path(), SocketAddr::from(([127, 0, 0, 1], port)), &load);
    let m1 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 1]), "m1")
        .await
        .unwrap();
    let m2 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 1]), "m2")
        .await
        .unwrap();
    let vs = free_addr();
    let f = start(&format!(
        r#"[[virtual_service]]
name = "web"
listen = ["{vs}"]
protocol = "http"
pool = "app"

[[pool]]
name = "app"
algorithm = "dynamic_feedback"
monitors = ["load-v3", "auth-only"]
[[pool.member]]
address = "{}"
weight = 10

[[pool]]
name = "wrong"
monitors = ["bad-auth", "bad-priv", "no-such-user"]
[[pool.member]]
address = "{}"

[[monitor]]
name = "load-v3"
type = "snmp"
version = "3"
port = {port}
user = "fulcrumpriv"
auth_protocol = "sha256"
auth_password = "authpass-256"
priv_protocol = "aes128"
priv_password = "privpass-aes"
oid = "{LOAD_OID}"
max = 400
interval = "500ms"
timeout = "400ms"
rise = 1
fall = 1

[[monitor]]
name = "auth-only"
type = "snmp"
version = "3"
port = {port}
user = "fulcrumauth"
auth_protocol = "sha1"
auth_password = "authpass-sha1"
oid = "1.3.6.1.2.1.1.3.0"
interval = "500ms"
timeout = "400ms"
rise = 1
fall = 1

[[monitor]]
name = "bad-auth"
type = "snmp"
version = "3"
port = {port}
user = "fulcrumauth"
auth_protocol = "sha1"
auth_password = "not-the-password"
oid = "1.3.6.1.2.1.1.3.0"
interval = "500ms"
timeout = "400ms"
rise = 1
fall = 1

[[monitor]]
name = "bad-priv"
type = "snmp"
version = "3"
port = {port}
user = "fulcrumpriv"
auth_protocol = "sha256"
auth_password = "authpass-256"
priv_password = "not-the-priv-password"
oid = "1.3.6.1.2.1.1.3.0"
interval = "500ms"
timeout = "400ms"
rise = 1
fall = 1

[[monitor]]
name = "no-such-user"
type = "snmp"
version = "3"
port = {port}
user = "nobody-here"
auth_password = "whatever-password"
oid = "1.3.6.1.2.1.1.3.0"
interval = "500ms"
timeout = "400ms"
rise = 1
fall = 1
"#,
        m1.addr, m2.addr
    ))
    .await;
    let a1 = m1.addr.to_string();
    // authPriv with SHA-256 + AES-128: load 100 of 400 → weight 75 %; authNoPriv SHA-1 passes.
    let ok = wait_until(Duration::from_secs(15), || async {
        let m = f.member("app", &a1).await;
        // Both monitors have run (the authNoPriv one may come a moment after the other).
        m["agent"]["weight_percent"] == 75
            && m["health"] == "up"
            && m["checks"].to_string().contains("snmp 1.3.6.1.2.1.1.3.0: ")
    })
    .await;
    let m = f.member("app", &a1).await;
    assert!(ok, "{m}\n{}", f.logs());
    let checks = m["checks"].to_string();
    assert!(checks.contains("100 of 400 -> weight 75%"), "{checks}");
    assert!(checks.contains("snmp 1.3.6.1.2.1.1.3.0: "), "{checks}");
    // The value moves; so does the weight (every check discovers the engine afresh).
    std::fs::write(&load, "300\n").unwrap();
    let ok = wait_until(Duration::from_secs(10), || async {
        f.member("app", &a1).await["agent"]["weight_percent"] == 25
    })
    .await;
    assert!(ok, "{}", f.member("app", &a1).await);
    // A wrong auth password, a wrong priv password and an unknown user fail, each with the
    // agent's reason.
    let b = m2.addr.to_string();
    let ok = wait_until(Duration::from_secs(15), || async {
        let m = f.member("wrong", &b).await;
        m["health"] == "down"
            && m["checks"]
                .as_array()
                .is_some_and(|c| c.len() == 3 && c.iter().all(|c| c["up"] == false))
    })
    .await;
    let m = f.member("wrong", &b).await;
    assert!(ok, "{m}");
    let text = m["checks"].to_string();
    println!("v3 failures: {text}");
    assert!(text.contains("unknown user name"), "{text}");
    assert!(
        text.contains("wrong digest") || text.contains("authentication failed"),
        "{text}"
    );
    assert!(
        text.contains("decryption") || text.contains("timed out") || text.contains("user, keys"),
        "{text}"
    );
}

/// One BER element of `b`: its tag, its content and what follows (short and long lengths).
fn ber(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

fn ber_encode(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
        n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}

fn ber_int(v: i64) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let skip = (0..7)
        .take_while(|&i| {
            (bytes[i] == 0 && bytes[i + 1] < 0x80) || (bytes[i] == 0xff && bytes[i + 1] >= 0x80)
        })
        .count();
    ber_encode(0x02, &bytes[skip..])
}

fn ber_int_value(v: &[u8]) -> i64 {
    v.iter().fold(
        if v.first().is_some_and(|b| b & 0x80 != 0) {
            -1
        } else {
            0
        },
        |acc, &b| (acc << 8) | i64::from(b),
    )
}

/// msgID, the clear scoped PDU's request-id, and whether the request is discovery (no user
/// name) of an SNMPv3 request.
fn v3_ids(req: &[u8]) -> Option<(i64, i64, bool)> {
    let (_, msg, _) = ber(req)?;
    let (_, _version, rest) = ber(msg)?;
    let (_, global, rest) = ber(rest)?;
    let (_, msg_id, _) = ber(global)?;
    let (_, params, rest) = ber(rest)?;
    let (_, usm, _) = ber(params)?;
    let (_, _engine, p) = ber(usm)?;
    let (_, _boots, p) = ber(p)?;
    let (_, _time, p) = ber(p)?;
    let (_, user, _) = ber(p)?;
    let (_, scoped, _) = ber(rest)?;
    let (_, _engine, s) = ber(scoped)?;
    let (_, _context, s) = ber(s)?;
    let (_, pdu, _) = ber(s)?;
    let (_, request_id, _) = ber(pdu)?;
    Some((
        ber_int_value(msg_id),
        ber_int_value(request_id),
        user.is_empty(),
    ))
}

/// A reply with msgFlags 0 (no authentication, no privacy) carrying `pdu`.
fn unauthenticated_reply(msg_id: i64, engine_id: &[u8], pdu: Vec<u8>) -> Vec<u8> {
    let global = [
        ber_int(msg_id),
        ber_int(65507),
        ber_encode(0x04, &[0]),
        ber_int(3),
    ]
    .concat();
    let params = ber_encode(
        0x30,
        &[
            ber_encode(0x04, engine_id),
            ber_int(1),
            ber_int(100),
            ber_encode(0x04, b"fulcrumauth"),
            ber_encode(0x04, &[]),
            ber_encode(0x04, &[]),
        ]
        .concat(),
    );
    let scoped = ber_encode(
        0x30,
        &[ber_encode(0x04, engine_id), ber_encode(0x04, &[]), pdu].concat(),
    );
    ber_encode(
        0x30,
        &[
            ber_int(3),
            ber_encode(0x30, &global),
            ber_encode(0x04, &params),
            scoped,
        ]
        .concat(),
    )
}

/// An OID's BER content (arcs after the first two, base 128).
fn oid_content(arcs: &[u32]) -> Vec<u8> {
    let mut out = vec![(arcs[0] * 40 + arcs[1]) as u8];
    for &a in &arcs[2..] {
        let mut groups = vec![(a & 0x7f) as u8];
        let mut rest = a >> 7;
        while rest > 0 {
            groups.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        out.extend(groups.iter().rev());
    }
    out
}

/// A fake agent that answers every request without authentication: a Report naming its
/// engine (discovery), and a GetResponse with a low load to the authenticated GET. The value
/// must not reach the member's weight, and the check must fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snmp_v3_unauthenticated_replies_neither_pass_the_check_nor_set_the_weight() {
    let agent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = agent.local_addr().unwrap().port();
    let forger = tokio::spawn(async move {
        let engine_id = b"\x80\x00\x1f\x88\x80forger".to_vec();
        let mut buf = vec![0u8; 4096];
        // A check is two requests (discovery, GET); the test ends well before this bound.
        for _ in 0..10_000 {
            let Ok((n, from)) = agent.recv_from(&mut buf).await else {
                return;
            };
            let Some((msg_id, request_id, discovery)) = v3_ids(&buf[..n]) else {
                continue;
            };
            let (tag, oid, value) = if discovery {
                // Discovery's empty GET: usmStatsUnknownEngineIDs.0 = 1.
                (
                    0xa8,
                    vec![1, 3, 6, 1, 6, 3, 15, 1, 1, 4, 0],
                    ber_encode(0x41, &[1]),
                )
            } else {
                (0xa2, vec![1, 3, 6, 1, 2, 1, 1, 3, 0], ber_int(100))
            };
            let varbind = ber_encode(
                0x30,
                &ber_encode(
                    0x30,
                    &[ber_encode(0x06, &oid_content(&oid)), value].concat(),
                ),
            );
            let pdu = ber_encode(
                tag,
                &[ber_int(request_id), ber_int(0), ber_int(0), varbind].concat(),
            );
            let reply = unauthenticated_reply(msg_id, &engine_id, pdu);
            let _ = agent.send_to(&reply, from).await;
        }
    });
    let member = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 1]), "m1")
        .await
        .unwrap();
    let f = start(&format!(
        r#"[[virtual_service]]
name = "web"
listen = ["{}"]
protocol = "http"
pool = "app"

[[pool]]
name = "app"
algorithm = "dynamic_feedback"
monitors = ["load-v3"]
[[pool.member]]
address = "{}"
weight = 10

[[monitor]]
name = "load-v3"
type = "snmp"
version = "3"
port = {port}
user = "fulcrumauth"
auth_protocol = "sha256"
auth_password = "authpass-256"
oid = "1.3.6.1.2.1.1.3.0"
max = 400
interval = "300ms"
timeout = "250ms"
rise = 1
fall = 1
"#,
        free_addr(),
        member.addr
    ))
    .await;
    let a = member.addr.to_string();
    let refused = wait_until(Duration::from_secs(10), || async {
        let m = f.member("app", &a).await;
        m["checks"][0]["last"]
            .as_str()
            .is_some_and(|l| l.contains("below the request's security level"))
    })
    .await;
    let m = f.member("app", &a).await;
    assert!(refused, "{m}");
    assert_eq!(m["health"], "down", "{m}");
    assert_ne!(m["agent"]["weight_percent"], 75, "{m}");
    assert!(
        f.logs().contains("noAuthNoPriv in reply to authNoPriv"),
        "{}",
        f.logs()
    );
    forger.abort();
}

/// Two SNMP monitors (CPU and memory) per member, on two members whose readings pull in
/// opposite directions: m1 is idle on CPU (100 of 400 -> 75 %) and short of memory (300 -> 25 %),
/// m2 the reverse. With memory counted three times (`weight_share`), m1 is at
/// (75 + 3 x 25) / 4 = 37 % and m2 at (25 + 3 x 75) / 4 = 62 %, so traffic leans to m2 where
/// CPU alone would lean to m1; readings stay steady (no monitor overwrites the other's), follow a
/// change, and a reload that drops the CPU monitor drops its reading too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_snmp_monitors_combine_into_one_weight_by_their_shares() {
    let dir = tempfile::tempdir().unwrap();
    let port = udp_port_on_both();
    let file = |name: &str, value: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, value).unwrap();
        path
    };
    let (cpu1, mem1) = (file("cpu1", "100\n"), file("mem1", "300\n"));
    let (cpu2, mem2) = (file("cpu2", "300\n"), file("mem2", "100\n"));
    let agent = |ip: [u8; 4], cpu: &Path, mem: &Path| {
        snmpd_with(
            dir.path(),
            SocketAddr::from((ip, port)),
            &format!(
                "rocommunity fulcrum 127.0.0.0/8\nextend load /bin/cat {}\nextend mem /bin/cat {}\n",
                cpu.display(),
                mem.display()
            ),
        )
    };
    let _a1 = agent([127, 0, 0, 1], &cpu1, &mem1);
    let _a2 = agent([127, 0, 0, 2], &cpu2, &mem2);
    let m1 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 1]), "m1")
        .await
        .unwrap();
    let m2 = HttpBackend::start(fulcrum_testkit::free_addr_on([127, 0, 0, 2]), "m2")
        .await
        .unwrap();
    let vs = free_addr();
    let monitor = |name: &str, oid: &str, share: u32| {
        format!(
            "[[monitor]]\nname = \"{name}\"\ntype = \"snmp\"\nport = {port}\ncommunity = \"fulcrum\"\noid = \"{oid}\"\nmax = 400\nweight_share = {share}\ninterval = \"150ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n"
        )
    };
    let config = |algorithm: &str, monitors: &str| {
        format!(
            "[[virtual_service]]\nname = \"web\"\nlisten = [\"{vs}\"]\nprotocol = \"http\"\npool = \"app\"\n\n\
             [[pool]]\nname = \"app\"\nalgorithm = \"{algorithm}\"\nmonitors = [{monitors}]\n\
             [[pool.member]]\naddress = \"{}\"\nweight = 10\n[[pool.member]]\naddress = \"{}\"\nweight = 10\n\n{}\n{}",
            m1.addr,
            m2.addr,
            monitor("cpu", LOAD_OID, 1),
            monitor("mem", MEM_OID, 3)
        )
    };
    // An algorithm that counts every member as weight 1 cannot use the combined figure.
    let (ok, out) = check(&config("least_connections", "\"cpu\", \"mem\""));
    assert!(!ok, "{out}");
    assert!(
        out.contains("bad.toml:9:1: pool[0].algorithm: least_connections counts every member as weight 1, so the weight readings of monitors \"cpu\" and \"mem\""),
        "{out}"
    );
    let f = start(&config("dynamic_feedback", "\"cpu\", \"mem\"")).await;
    let (a1, a2) = (m1.addr.to_string(), m2.addr.to_string());
    let weights = || async {
        (
            f.member("app", &a1).await["agent"]["weight_percent"].clone(),
            f.member("app", &a2).await["agent"]["weight_percent"].clone(),
        )
    };
    let ok = wait_until(Duration::from_secs(10), || async {
        weights().await == (37.into(), 62.into())
    })
    .await;
    assert!(ok, "{:?}\n{}", weights().await, f.logs());
    // Steady over a dozen check rounds: no monitor overwrites the other's reading.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(weights().await, (37.into(), 62.into()));
    }
    // The scheduler follows the combined figure: 37 to m1 for 62 to m2 (smooth weighted round
    // robin is exact; the tolerance covers a request racing a refresh).
    for _ in 0..198 {
        let r = fulcrum_testkit::http_get(vs, "/").await.unwrap();
        assert_eq!(r.status, 200);
    }
    let (n1, n2) = (m1.requests(), m2.requests());
    assert!(
        (68..=80).contains(&n1) && (118..=130).contains(&n2),
        "{n1}:{n2}"
    );
    // m1's memory frees up: (75 + 3 x 100) / 4 = 93.
    std::fs::write(&mem1, "0\n").unwrap();
    let ok = wait_until(Duration::from_secs(10), || async {
        weights().await == (93.into(), 62.into())
    })
    .await;
    assert!(ok, "{:?}", weights().await);
    // A reload leaves memory alone: m1 100 %, m2 75 %, not the CPU reading's last word mixed in.
    f.write_config(&config("dynamic_feedback", "\"mem\""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let ok = wait_until(Duration::from_secs(10), || async {
        weights().await == (100.into(), 75.into())
    })
    .await;
    assert!(ok, "{:?}\n{}", weights().await, f.logs());
}
