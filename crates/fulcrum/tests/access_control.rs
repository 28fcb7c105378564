//! `allow` / `deny` per virtual service (issue #11) for every protocol
//! through the real binary: sources on 127.0.0.0/8, deny wins, refusals counted in the API and
//! in `/metrics`, and a reload that adds a `deny` stops a udp flow already open.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use fulcrum_testkit::message::id;
use fulcrum_testkit::{
    HttpBackend, MessageClient, MessageSwitch, SwitchOptions, UdpEchoServer, WireFraming,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;

/// 127.0.0.0–127.0.0.7 only, and never 127.0.0.3 (deny wins over allow).
const LISTS: &str = "allow = [\"127.0.0.0/29\"]\ndeny = [\"127.0.0.3/32\"]\n";

/// A stream connection from `source` that the service refuses: closed (or reset) before a byte
/// comes back, even after the client has sent a request.
async fn refused_from(vs: SocketAddr, source: [u8; 4], request: &[u8]) -> bool {
    let Ok(mut s) = connect_from(vs, Some(source)).await else {
        return true;
    };
    let _ = s.write_all(request).await;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => panic!("{vs}: a connection from {source:?} was neither served nor closed"),
    }
}

/// `curl` from `source` (http or https); the body on success.
fn curl_from(source: &str, url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "5", "--interface", source, url])
        .output()
        .expect("curl is installed by scripts/test.sh");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn udp_ask(source: &str, vs: SocketAddr, payload: &[u8]) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind(format!("{source}:0")).await.unwrap();
    udp_ask_on(&sock, vs, payload).await
}

async fn udp_ask_on(sock: &UdpSocket, vs: SocketAddr, payload: &[u8]) -> Option<Vec<u8>> {
    sock.send_to(payload, vs).await.ok()?;
    let mut buf = [0u8; 2048];
    let (n, _) = tokio::time::timeout(Duration::from_millis(800), sock.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(buf[..n].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_and_deny_on_every_protocol_are_checked_first_and_counted() {
    let pki = tempfile::tempdir().unwrap();
    fulcrum_testkit::pki::self_signed(pki.path(), "vs", "vs.test", 2, Some("IP:127.0.0.1"));
    let tcp_member = TcpIdServer::start(free_addr(), "m0").await.unwrap();
    let http_member = HttpBackend::start(free_addr(), "web").await.unwrap();
    let udp_member = UdpEchoServer::start("127.0.0.1:0".parse().unwrap(), "u0")
        .await
        .unwrap();
    let framing = WireFraming::two_byte();
    let switch = MessageSwitch::start(free_addr(), "s0", framing.clone(), SwitchOptions::default())
        .await
        .unwrap();
    let (tcp_vs, http_vs, https_vs, msg_vs) = (free_addr(), free_addr(), free_addr(), free_addr());
    let udp_vs = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let services = |udp_lists: &str| {
        format!(
            r#"
[[virtual_service]]
name = "tcp"
listen = "{tcp_vs}"
protocol = "tcp"
pool = "tcp"
{LISTS}
[[virtual_service]]
name = "http"
listen = "{http_vs}"
protocol = "http"
pool = "http"
{LISTS}
[[virtual_service]]
name = "https"
listen = "{https_vs}"
protocol = "https"
pool = "http"
tls = [{{ cert = "{crt}", key = "{key}" }}]
{LISTS}
[[virtual_service]]
name = "msg"
listen = "{msg_vs}"
protocol = "message"
pool = "msg"
framing = {{ length_bytes = 2 }}
message_mode = "async"
sequence = {{ offset = 0, length = 12 }}
{LISTS}
[[virtual_service]]
name = "udp"
listen = "{udp_vs}"
protocol = "udp"
pool = "udp"
{udp_lists}
[[pool]]
name = "tcp"
[[pool.member]]
address = "{}"
[[pool]]
name = "http"
[[pool.member]]
address = "{}"
[[pool]]
name = "msg"
[[pool.member]]
address = "{}"
[[pool]]
name = "udp"
[[pool.member]]
address = "{}"
"#,
            tcp_member.addr,
            http_member.addr,
            switch.addr,
            udp_member.addr,
            crt = pki.path().join("vs.crt").display(),
            key = pki.path().join("vs.key").display(),
        )
    };
    let f = start(&services(LISTS)).await;

    // tcp: served from inside `allow`, refused from the denied address and from outside.
    assert_eq!(
        exchange_from(tcp_vs, Some([127, 0, 0, 2])).await.unwrap(),
        "m0"
    );
    assert!(refused_from(tcp_vs, [127, 0, 0, 3], b"ping\n").await);
    assert!(refused_from(tcp_vs, [127, 0, 0, 9], b"ping\n").await);

    // http and https: the same, with real clients; refused before any request or handshake.
    let get = b"GET / HTTP/1.1\r\nHost: vs\r\n\r\n";
    assert!(curl_from("127.0.0.2", &format!("http://{http_vs}/")).is_some());
    assert!(refused_from(http_vs, [127, 0, 0, 3], get).await);
    assert!(refused_from(http_vs, [127, 0, 0, 9], get).await);
    assert!(curl_from("127.0.0.2", &format!("https://{https_vs}/")).is_some());
    assert!(curl_from("127.0.0.3", &format!("https://{https_vs}/")).is_none());
    assert!(curl_from("127.0.0.9", &format!("https://{https_vs}/")).is_none());

    // message: an allowed client gets its answer; refused ones get nothing.
    let mut client = MessageClient::connect(msg_vs, framing.clone())
        .await
        .unwrap();
    client.send(&id(1), b"hello").await.unwrap();
    assert!(client
        .recv_body(Duration::from_secs(5))
        .await
        .unwrap()
        .is_some());
    let mut framed = vec![0u8, 17];
    framed.extend_from_slice(&id(2));
    framed.extend_from_slice(b"hello");
    assert!(refused_from(msg_vs, [127, 0, 0, 3], &framed).await);
    assert!(refused_from(msg_vs, [127, 0, 0, 9], &framed).await);

    // udp: datagrams from refused sources make no flow and get no answer.
    assert!(udp_ask("127.0.0.2", udp_vs, b"a").await.is_some());
    assert!(udp_ask("127.0.0.3", udp_vs, b"b").await.is_none());
    assert!(udp_ask("127.0.0.9", udp_vs, b"c").await.is_none());

    // Counted per service, in the API and in /metrics.
    let status = f.get_json("/api/v1/status").await;
    for vs in status["virtual_services"].as_array().unwrap() {
        assert_eq!(vs["denied"], 2, "{vs}");
    }
    let metrics = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        metrics.contains("fulcrum_vs_denied_total{vs=\"https\",protocol=\"https\"} 2"),
        "{metrics}"
    );
    assert_eq!(
        udp_member.datagrams(),
        1,
        "a refused datagram reached the member"
    );

    // A reload that denies a source with an open udp flow stops that flow too.
    let sock = UdpSocket::bind("127.0.0.5:0").await.unwrap();
    assert!(udp_ask_on(&sock, udp_vs, b"d").await.is_some());
    f.write_config(&services("deny = [\"127.0.0.5/32\"]\n"));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(udp_ask_on(&sock, udp_vs, b"e").await.is_none());
    assert!(
        udp_ask("127.0.0.9", udp_vs, b"f").await.is_some(),
        "the allow list went with the reload"
    );
}
