//! The protocol monitors against real servers where Debian has them cheaply (dnsmasq,
//! freeradius) and testkit servers elsewhere.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fulcrum_config::{Monitor, MonitorKind};
use fulcrum_testkit::udp::RadiusServer;
use fulcrum_testkit::DialogueServer;

use super::*;
use crate::testutil::{monitor, refused_addr};

async fn run(m: &Monitor, addr: SocketAddr) -> Verdict {
    Check::new(m)
        .run(&Probe::new(addr, m.port, m.timeout))
        .await
}

#[track_caller]
fn passed(v: &Verdict, detail: &str) {
    match v {
        Verdict::Health {
            ok: true,
            detail: d,
        } if d.contains(detail) => {}
        other => panic!("expected a pass with {detail:?}, got {other:?}"),
    }
}

#[track_caller]
fn failed(v: &Verdict, detail: &str) {
    match v {
        Verdict::Health {
            ok: false,
            detail: d,
        } if d.contains(detail) => {}
        other => panic!("expected a failure with {detail:?}, got {other:?}"),
    }
}

fn slow(mut m: Monitor) -> Monitor {
    m.timeout = Duration::from_millis(1500);
    m.interval = Duration::from_secs(2);
    m
}

/// A child process killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the daemon `command(port)` makes on a free loopback port; a daemon that exits at once
/// (its port was taken meanwhile: it needs the TCP side too) is tried again on another port.
fn start_daemon(what: &str, command: impl Fn(u16) -> Command) -> (Daemon, SocketAddr) {
    let mut last = String::new();
    for _ in 0..5 {
        let addr = free_udp();
        let mut child = command(addr.port())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what} (installed by scripts/test.sh): {e}"));
        std::thread::sleep(Duration::from_millis(300));
        match child.try_wait() {
            Ok(None) => return (Daemon(child), addr),
            _ => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                last = err;
            }
        }
    }
    panic!("{what} did not start: {last}");
}

fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Waits until a UDP `probe` passes (the daemon is up), for at most 10 s.
async fn until_passes(m: &Monitor, addr: SocketAddr) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Verdict::Health { ok: true, .. } = run(m, addr).await {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "{addr} never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn dns(query: &str, qtype: &str) -> Monitor {
    let mut m = slow(monitor("dns", MonitorKind::Dns));
    m.query = Some(query.into());
    m.query_type = qtype.into();
    m
}

#[tokio::test]
async fn dns_against_dnsmasq() {
    // A TXT answer of ~800 bytes: truncated over UDP (no EDNS in the query), whole over TCP.
    let big = format!(
        "--txt-record=big.health.test,{},{},{}",
        "a".repeat(250),
        "b".repeat(250),
        "c".repeat(250)
    );
    let (_dnsmasq, addr) = start_daemon("dnsmasq", |port| {
        let mut c = Command::new("dnsmasq");
        c.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            "--user=root",
            "--pid-file=",
            "--local=/health.test/",
            "--address=/www.health.test/127.0.0.9",
            "--address=/www.health.test/::9",
            &big,
        ])
        .arg(format!("--port={port}"));
        c
    });
    let a = dns("www.health.test.", "A");
    until_passes(&a, addr).await;
    let mut want = dns("www.health.test", "A");
    want.expect_answer = Some("127.0.0.9".into());
    passed(&run(&want, addr).await, "DNS NOERROR, answer 127.0.0.9");
    let mut v6 = dns("www.health.test.", "AAAA");
    v6.expect_answer = Some("::9".into());
    passed(&run(&v6, addr).await, "answer ::9");
    want.expect_answer = Some("127.0.0.10".into());
    failed(
        &run(&want, addr).await,
        "answers 127.0.0.9; expected 127.0.0.10",
    );
    let missing = dns("nobody.health.test.", "A");
    failed(&run(&missing, addr).await, "DNS NXDOMAIN, expected NOERROR");
    let mut nx = missing.clone();
    nx.expect_rcode = "NXDOMAIN".into();
    passed(&run(&nx, addr).await, "DNS NXDOMAIN");
    let mut txt = dns("big.health.test.", "TXT");
    txt.expect_answer = Some("cccc".into());
    passed(&run(&txt, addr).await, "DNS NOERROR, answer cccc");
    // Nothing listens: the ICMP error is seen at once.
    let closed = free_udp();
    failed(&run(&a, closed).await, "connection refused");
}

#[tokio::test]
async fn dns_timeout_and_garbage() {
    // A UDP socket that never answers, and one that answers garbage.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut m = dns("x.test.", "A");
    m.timeout = Duration::from_millis(300);
    failed(
        &run(&m, silent.local_addr().unwrap()).await,
        "timeout after 300ms: no DNS answer",
    );
    let junk = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let junk_addr = junk.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = junk.recv_from(&mut buf).await {
            let _ = junk.send_to(b"\x01", from).await;
        }
    });
    failed(&run(&m, junk_addr).await, "not a DNS message");
}

fn radius(secret: &str) -> Monitor {
    let mut m = slow(monitor("radius", MonitorKind::Radius));
    m.secret = Some(secret.into());
    m
}

#[tokio::test]
async fn radius_status_server_and_access_request_against_testkit() {
    let server = RadiusServer::start("127.0.0.1:0".parse().unwrap(), "r1", "s3cret")
        .await
        .unwrap();
    server.reject_users(&["mallory"]);
    passed(
        &run(&radius("s3cret"), server.addr).await,
        "RADIUS Access-Accept",
    );
    let mut login = radius("s3cret");
    login.username = Some("probe".into());
    login.password = Some("pw".into());
    passed(&run(&login, server.addr).await, "RADIUS Access-Accept");
    login.username = Some("mallory".into());
    passed(&run(&login, server.addr).await, "RADIUS Access-Reject");
    let seen = server.seen();
    assert_eq!(seen[0].code, 12, "Status-Server");
    assert_eq!(seen[1].user.as_deref(), Some("probe"));
    // A wrong secret: the server drops the request (its Message-Authenticator is wrong).
    let mut wrong = radius("other");
    wrong.timeout = Duration::from_millis(300);
    failed(&run(&wrong, server.addr).await, "no RADIUS answer");
    failed(
        &run(&radius("s3cret"), free_udp()).await,
        "connection refused",
    );
}

/// FreeRADIUS itself, on a loopback port, with its stock configuration (client localhost with
/// secret testing123; Status-Server enabled).
#[tokio::test]
async fn radius_against_freeradius() {
    let (_daemon, addr) = start_daemon("freeradius", |port| {
        let mut c = Command::new("freeradius");
        c.args(["-f", "-l", "stdout", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string());
        c
    });
    let m = radius("testing123");
    until_passes(&m, addr).await;
    passed(&run(&m, addr).await, "RADIUS Access-Accept");
    // Unknown test user: Access-Reject, which still proves the server alive.
    let mut login = radius("testing123");
    login.username = Some("fulcrum-probe".into());
    login.password = Some("nope".into());
    passed(&run(&login, addr).await, "RADIUS Access-Reject");
}

#[tokio::test]
async fn smtp_pop3_imap_ftp_dialogues() {
    let smtp = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "220-mail.test ESMTP\n220 ready",
        vec![
            ("EHLO", Some("250-mail.test\n250-SIZE 1000\n250 OK")),
            ("QUIT", None),
        ],
        "500 what?",
    )
    .await
    .unwrap();
    passed(
        &run(&monitor("m", MonitorKind::Smtp), smtp.addr).await,
        "SMTP 250",
    );
    assert_eq!(smtp.commands()[0], "EHLO fulcrum-health");
    let old_smtp = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "220 old",
        vec![
            ("EHLO", Some("502 no")),
            ("HELO", Some("250 hi")),
            ("QUIT", None),
        ],
        "500 what?",
    )
    .await
    .unwrap();
    passed(
        &run(&monitor("m", MonitorKind::Smtp), old_smtp.addr).await,
        "SMTP 250",
    );
    let busy = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "554 no service",
        vec![],
        "554 no",
    )
    .await
    .unwrap();
    failed(
        &run(&monitor("m", MonitorKind::Smtp), busy.addr).await,
        "SMTP greeting: \"554 no service\"",
    );

    let pop3 = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "+OK POP3 ready",
        vec![
            ("USER probe", Some("+OK")),
            ("PASS right", Some("+OK logged in")),
            ("PASS", Some("-ERR bad password")),
            ("NOOP", Some("-ERR not yet")),
            ("QUIT", None),
        ],
        "-ERR",
    )
    .await
    .unwrap();
    passed(
        &run(&monitor("m", MonitorKind::Pop3), pop3.addr).await,
        "POP3 +OK",
    );
    let mut login = monitor("m", MonitorKind::Pop3);
    login.username = Some("probe".into());
    login.password = Some("right".into());
    passed(&run(&login, pop3.addr).await, "POP3 +OK, logged in");
    login.password = Some("wrong".into());
    failed(
        &run(&login, pop3.addr).await,
        "POP3 PASS: \"-ERR bad password\"",
    );

    let imap = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "* OK IMAP4rev1 ready",
        vec![
            ("f1 CAPABILITY", Some("* CAPABILITY IMAP4rev1\nf1 OK done")),
            ("f2 LOGIN \"probe\" \"right\"", Some("f2 OK welcome")),
            ("f2 LOGIN", Some("f2 NO bad")),
            ("f3 LOGOUT", None),
        ],
        "* BAD",
    )
    .await
    .unwrap();
    passed(
        &run(&monitor("m", MonitorKind::Imap), imap.addr).await,
        "IMAP OK",
    );
    let mut login = monitor("m", MonitorKind::Imap);
    login.username = Some("probe".into());
    login.password = Some("right".into());
    passed(&run(&login, imap.addr).await, "IMAP OK, logged in");
    login.password = Some("wrong".into());
    failed(&run(&login, imap.addr).await, "IMAP LOGIN: \"f2 NO bad\"");

    let ftp = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "220-welcome\n220 FTP ready",
        vec![
            ("NOOP", Some("200 NOOP ok")),
            ("USER anonymous", Some("230 in")),
            ("USER probe", Some("331 password?")),
            ("PASS right", Some("230 logged in")),
            ("PASS", Some("530 no")),
            ("QUIT", Some("221 bye")),
        ],
        "500 ?",
    )
    .await
    .unwrap();
    passed(
        &run(&monitor("m", MonitorKind::Ftp), ftp.addr).await,
        "FTP 200",
    );
    let mut anon = monitor("m", MonitorKind::Ftp);
    anon.username = Some("anonymous".into());
    passed(&run(&anon, ftp.addr).await, "FTP 230, logged in");
    let mut login = monitor("m", MonitorKind::Ftp);
    login.username = Some("probe".into());
    login.password = Some("right".into());
    passed(&run(&login, ftp.addr).await, "FTP 230, logged in");
    login.password = Some("wrong".into());
    failed(&run(&login, ftp.addr).await, "FTP PASS: \"530 no\"");
    failed(
        &run(&monitor("m", MonitorKind::Ftp), refused_addr()).await,
        "connect: connection refused",
    );
    // A server that never greets: the timeout says what was awaited.
    let mute = crate::testutil::Server::start(|s| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(s);
    })
    .await;
    failed(
        &run(&monitor("m", MonitorKind::Imap), mute.addr).await,
        "IMAP greeting",
    );
}

#[tokio::test]
async fn nntp_dialogue() {
    let news = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "200 news.test InterNetNews NNRP server ready (posting ok)",
        vec![
            ("GROUP misc.test", Some("211 3 1 3 misc.test")),
            ("GROUP", Some("411 No such group")),
            ("AUTHINFO USER probe", Some("381 Enter password")),
            ("AUTHINFO PASS right", Some("281 Authentication accepted")),
            ("AUTHINFO PASS", Some("481 Authentication failed")),
            ("QUIT", Some("205 bye")),
        ],
        "500 What?",
    )
    .await
    .unwrap();
    let plain = monitor("m", MonitorKind::Nntp);
    passed(&run(&plain, news.addr).await, "NNTP 200");
    let mut group = monitor("m", MonitorKind::Nntp);
    group.newsgroup = Some("misc.test".into());
    passed(
        &run(&group, news.addr).await,
        "NNTP 200, misc.test: 3 articles",
    );
    group.newsgroup = Some("misc.gone".into());
    failed(
        &run(&group, news.addr).await,
        "NNTP GROUP misc.gone: \"411 No such group\"",
    );
    let mut login = monitor("m", MonitorKind::Nntp);
    login.username = Some("probe".into());
    login.password = Some("right".into());
    login.newsgroup = Some("misc.test".into());
    passed(
        &run(&login, news.addr).await,
        "NNTP 200, logged in, misc.test: 3 articles",
    );
    login.password = Some("wrong".into());
    failed(
        &run(&login, news.addr).await,
        "NNTP AUTHINFO PASS: \"481 Authentication failed\"",
    );
    assert!(news.commands().iter().any(|c| c == "QUIT"));

    // A reader that is not serving (400), and a server that is not NNTP at all.
    let busy = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "400 news.test: service temporarily unavailable",
        vec![],
        "400",
    )
    .await
    .unwrap();
    failed(
        &run(&plain, busy.addr).await,
        "NNTP greeting: \"400 news.test",
    );
    let smtp = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "220 mail.test ESMTP",
        vec![],
        "500",
    )
    .await
    .unwrap();
    failed(
        &run(&plain, smtp.addr).await,
        "NNTP greeting: \"220 mail.test ESMTP\"",
    );
    let ftp_like = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "200-multi\n200 line",
        vec![],
        "500",
    )
    .await
    .unwrap();
    failed(
        &run(&plain, ftp_like.addr).await,
        "NNTP greeting: not a status line: \"200-multi\"",
    );
    // Silence after the greeting: the timeout says what was awaited.
    let mute = DialogueServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "201 read only",
        vec![("GROUP", Some(""))],
        "",
    )
    .await
    .unwrap();
    let mut slow_group = monitor("m", MonitorKind::Nntp);
    slow_group.timeout = Duration::from_millis(300);
    slow_group.newsgroup = Some("misc.test".into());
    failed(&run(&slow_group, mute.addr).await, "NNTP GROUP misc.test");
    failed(
        &run(&plain, refused_addr()).await,
        "connect: connection refused",
    );
}

#[tokio::test]
async fn icmp_echo_on_loopback_v4_and_v6() {
    let m = slow(monitor("ping", MonitorKind::Icmp));
    passed(
        &run(&m, "127.0.0.1:0".parse().unwrap()).await,
        "echo reply in",
    );
    passed(&run(&m, "[::1]:0".parse().unwrap()).await, "echo reply in");
}

/// A network namespace with a veth pair, removed on drop (also when the test fails).
struct Netns {
    name: String,
    host_if: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// `198.18.N.1/30` on the host side, `198.18.N.2` in the namespace (benchmarking range,
    /// RFC 2544: never routed).
    fn new(n: u8) -> Netns {
        let pid = std::process::id();
        let ns = Netns {
            name: format!("fulcrum-icmp-{pid}-{n}"),
            host_if: format!("fic{}h{n}", pid % 100_000),
        };
        let peer = format!("fic{}n{n}", pid % 100_000);
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &ns.name]);
        ip(&[
            "addr",
            "add",
            &format!("198.18.{n}.1/30"),
            "dev",
            &ns.host_if,
        ]);
        ip(&["link", "set", &ns.host_if, "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("198.18.{n}.2/30"),
            "dev",
            &peer,
        ]);
        ip(&["-n", &ns.name, "link", "set", &peer, "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn sysctl(&self, key: &str, value: &str) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "sysctl",
                "-qw",
                &format!("{key}={value}"),
            ])
            .output()
            .expect("sysctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[tokio::test]
async fn icmp_against_a_namespace_that_stops_answering() {
    // The host side of the veth lives in the root namespace, where another test run on the same
    // machine may be doing the same: a subnet picked from the pid keeps two runs apart.
    let n = (std::process::id() % 250) as u8 + 1;
    let ns = Netns::new(n);
    let target: SocketAddr = format!("198.18.{n}.2:0").parse().unwrap();
    let mut m = slow(monitor("ping", MonitorKind::Icmp));
    m.timeout = Duration::from_millis(700);
    passed(&run(&m, target).await, "echo reply in");
    ns.sysctl("net.ipv4.icmp_echo_ignore_all", "1");
    failed(&run(&m, target).await, "timeout after 700ms: no echo reply");
}

/// msgID and, when the scoped PDU is in clear, the request-id of an SNMPv3 request.
fn v3_request_ids(req: &[u8]) -> Option<(i32, Option<i32>)> {
    use snmp_ber::{expect, int_value, INTEGER, OCTET_STRING, SEQUENCE};
    let (msg, _) = expect(req, SEQUENCE, "message").ok()?;
    let (_version, rest) = expect(msg, INTEGER, "version").ok()?;
    let (global, rest) = expect(rest, SEQUENCE, "global").ok()?;
    let (id, _) = expect(global, INTEGER, "msgID").ok()?;
    let msg_id = i32::try_from(int_value(id).ok()?).ok()?;
    let (_params, rest) = expect(rest, OCTET_STRING, "params").ok()?;
    let request_id = expect(rest, SEQUENCE, "scopedPDU")
        .ok()
        .and_then(|(scoped, _)| {
            let (_engine, s) = expect(scoped, OCTET_STRING, "engine").ok()?;
            let (_name, s) = expect(s, OCTET_STRING, "context").ok()?;
            let (pdu, _) = expect(s, 0xa0, "get").ok()?;
            let (id, _) = expect(pdu, INTEGER, "request-id").ok()?;
            i32::try_from(int_value(id).ok()?).ok()
        });
    Some((msg_id, request_id))
}

/// A fake agent that answers discovery honestly and the authenticated GET with a value in a
/// reply without authentication (the ids copied from the request, which authNoPriv sends in
/// clear): the check must fail instead of taking the value.
#[tokio::test]
async fn snmp_v3_refuses_an_unauthenticated_reply_to_an_authenticated_get() {
    use snmp_ber::{integer, oid_bytes, tlv, SEQUENCE};
    let agent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = agent.local_addr().unwrap();
    let engine = snmp_v3::Engine {
        id: b"\x80\x00\x1f\x88\x80forger".to_vec(),
        boots: 1,
        time: 100,
    };
    let responder = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        // Discovery, then the GET; bounded by the datagrams a check sends.
        for round in 0..2 {
            let Ok((n, from)) = agent.recv_from(&mut buf).await else {
                return;
            };
            let Some((msg_id, request_id)) = v3_request_ids(&buf[..n]) else {
                continue;
            };
            let varbind = |value: Vec<u8>, oid: &[u32]| {
                tlv(SEQUENCE, &tlv(SEQUENCE, &[oid_bytes(oid), value].concat()))
            };
            let pdu = match request_id {
                // The discovery's GET is empty: answer it with usmStatsUnknownEngineIDs.
                Some(id) if round == 0 => tlv(
                    0xa8,
                    &[
                        integer(i64::from(id)),
                        integer(0),
                        integer(0),
                        varbind(tlv(0x41, &[1]), &[1, 3, 6, 1, 6, 3, 15, 1, 1, 4, 0]),
                    ]
                    .concat(),
                ),
                Some(id) => tlv(
                    0xa2,
                    &[
                        integer(i64::from(id)),
                        integer(0),
                        integer(0),
                        varbind(integer(42), &[1, 3, 6, 1, 2, 1, 1, 3, 0]),
                    ]
                    .concat(),
                ),
                None => continue,
            };
            let reply = snmp_v3::unauthenticated_reply(msg_id, &engine, pdu);
            let _ = agent.send_to(&reply, from).await;
        }
    });
    let mut m = slow(monitor("snmp-v3", MonitorKind::Snmp));
    m.port = Some(addr.port());
    m.snmp.oid = Some(vec![1, 3, 6, 1, 2, 1, 1, 3, 0]);
    m.snmp.v3 = Some(fulcrum_config::SnmpV3 {
        user: "fulcrum".into(),
        auth: fulcrum_config::SnmpAuth::Sha256,
        auth_password: "maplesyrup-maplesyrup".into(),
        privacy: None,
    });
    let v = run(&m, addr).await;
    failed(&v, "noAuthNoPriv in reply to authNoPriv");
    responder.abort();
}
