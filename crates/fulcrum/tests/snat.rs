//! Source address pools for member connections (`snat`), through the binary: member
//! connections come from the pool's addresses in turn, and an exhausted pool is counted and
//! refused at once instead of hanging.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// A member that counts connections by source address. It answers an HTTP request with a
/// small response and closes (so every request needs a new member connection); anything else
/// gets "ok\n", then it holds the connection until the other side closes.
struct SourceMember {
    addr: SocketAddr,
    sources: Arc<Mutex<BTreeMap<IpAddr, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SourceMember {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SourceMember {
    async fn start(addr: SocketAddr) -> SourceMember {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sources = Arc::new(Mutex::new(BTreeMap::new()));
        let seen = sources.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, peer)) = listener.accept().await {
                *seen.lock().unwrap().entry(peer.ip()).or_insert(0) += 1;
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if buf[..n].starts_with(b"GET ") {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
                            .await;
                        return;
                    }
                    if s.write_all(b"ok\n").await.is_err() {
                        return;
                    }
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        SourceMember {
            addr,
            sources,
            task,
        }
    }

    fn sources(&self) -> BTreeMap<IpAddr, usize> {
        self.sources.lock().unwrap().clone()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Opens a connection through a tcp service, from `source` when given, and waits for the
/// member's "ok\n"; Err when the connection is closed without it.
async fn tcp_hello(vs: SocketAddr, source: Option<SocketAddr>) -> Result<TcpStream, String> {
    let sock = TcpSocket::new_v4().unwrap();
    if let Some(src) = source {
        sock.set_reuseaddr(true).unwrap();
        sock.bind(src).unwrap();
    }
    let mut s = sock
        .connect(vs)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"hi\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut back = [0u8; 3];
    match s.read_exact(&mut back).await {
        Ok(_) if &back == b"ok\n" => Ok(s),
        Ok(_) => Err(format!("unexpected {back:?}")),
        Err(e) => Err(format!("closed: {e}")),
    }
}

async fn http_get(vs: SocketAddr) -> String {
    let mut s = TcpStream::connect(vs).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn services(
    tcp: SocketAddr,
    http: SocketAddr,
    member: SocketAddr,
    (msg, msg_member): (SocketAddr, SocketAddr),
    tcp_snat: &str,
) -> String {
    format!(
        "[[virtual_service]]\nname = \"tcp\"\nlisten = \"{tcp}\"\nprotocol = \"tcp\"\npool = \"p\"\n\
         snat = {tcp_snat}\n\
         [[virtual_service]]\nname = \"web\"\nlisten = \"{http}\"\nprotocol = \"http\"\npool = \"p\"\n\
         snat = [\"127.0.0.4\", \"127.0.0.5\"]\n\
         [[virtual_service]]\nname = \"msg\"\nlisten = \"{msg}\"\nprotocol = \"message\"\npool = \"m\"\n\
         snat = [\"127.0.0.6\", \"127.0.0.7\"]\nmember_connections = 2\n\
         [[pool]]\nname = \"p\"\nmonitors = []\n[[pool.member]]\naddress = \"{member}\"\n\
         [[pool]]\nname = \"m\"\nmonitors = []\n[[pool.member]]\naddress = \"{msg_member}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_connections_come_from_the_snat_addresses_in_turn() {
    let member = SourceMember::start("127.0.0.1:0".parse().unwrap()).await;
    let msg_member = SourceMember::start("127.0.0.1:0".parse().unwrap()).await;
    let (tcp, http) = (free_addr(), free_addr());
    let msg = (free_addr(), msg_member.addr);
    let f = start(&services(
        tcp,
        http,
        member.addr,
        msg,
        "[\"127.0.0.2\", \"127.0.0.3\"]",
    ))
    .await;
    // The message service opens its two member connections at once, one from each address.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            msg_member.sources().values().sum::<usize>() == 2
        })
        .await
    );
    assert_eq!(
        msg_member.sources(),
        [(ip("127.0.0.6"), 1), (ip("127.0.0.7"), 1)].into()
    );
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(tcp_hello(tcp, None).await.unwrap());
    }
    for _ in 0..6 {
        let r = http_get(http).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    let seen = member.sources();
    let expected: BTreeMap<IpAddr, usize> = [
        (ip("127.0.0.2"), 3),
        (ip("127.0.0.3"), 3),
        (ip("127.0.0.4"), 3),
        (ip("127.0.0.5"), 3),
    ]
    .into();
    assert_eq!(seen, expected);
    let metrics = f
        .api("GET", "/metrics", None)
        .await
        .unwrap()
        .text()
        .to_string();
    assert!(
        metrics.contains("fulcrum_snat_connections_total{vs=\"tcp\",address=\"127.0.0.3\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fulcrum_snat_exhausted_total{vs=\"web\",address=\"127.0.0.4\"} 0"),
        "{metrics}"
    );

    // An address this host does not have is refused at reload, naming it; the old pool runs on.
    f.write_config(&services(tcp, http, member.addr, msg, "[\"192.0.2.77\"]"));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("192.0.2.77"), "{}", r.text());
    held.push(tcp_hello(tcp, None).await.unwrap());

    // Only stream services take `snat`.
    let (ok, out) = check(
        "[[virtual_service]]\nname = \"u\"\nlisten = \"127.0.0.1:5353\"\nprotocol = \"udp\"\npool = \"p\"\n\
         snat = [\"127.0.0.2\", \"127.0.0.2\"]\n[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"127.0.0.1:53\"\n",
    );
    assert!(!ok, "{out}");
    assert!(out.contains("virtual_service[0].snat"), "{out}");
    assert!(out.contains("listed twice"), "{out}");
}

/// With the ephemeral port range of a namespace cut to a few ports, each snat address can hold
/// only that many connections to the member: the next attempts move to the other address, and
/// when both are full the client is closed at once and the exhaustion is counted.
#[test]
fn exhausted_snat_pool_is_counted_and_refused_at_once() {
    let mut lab = fulcrum_testkit::netns::Lab::new("snat");
    let inside = lab.ns("fw").unwrap();
    let outcome = std::thread::spawn(move || {
        inside.enter_current_thread().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            // Fixed ports: the namespace is this test's own.
            let member = SourceMember::start("127.0.0.1:7000".parse().unwrap()).await;
            let vs: SocketAddr = "127.0.0.1:8000".parse().unwrap();
            let f = Fulcrum::start(
                BIN,
                "127.0.0.1:9000".parse().unwrap(),
                &format!(
                    "[[virtual_service]]\nname = \"tcp\"\nlisten = \"{vs}\"\nprotocol = \"tcp\"\npool = \"p\"\n\
                     snat = [\"127.0.0.2\", \"127.0.0.3\"]\n\
                     [[pool]]\nname = \"p\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n",
                    member.addr
                ),
            )
            .await
            .unwrap();
            inside
                .sysctl("net.ipv4.ip_local_port_range", "40000 40003")
                .unwrap();
            // Clients bind their own ports, outside the range.
            let mut held = Vec::new();
            let mut refused = 0;
            for i in 0..16u16 {
                let src = SocketAddr::from(([127, 0, 0, 9], 50000 + i));
                let started = std::time::Instant::now();
                match tokio::time::timeout(Duration::from_secs(5), tcp_hello(vs, Some(src))).await
                {
                    Ok(Ok(s)) => held.push(s),
                    Ok(Err(_)) => refused += 1,
                    Err(_) => panic!("connection {i} hung instead of being refused"),
                }
                assert!(started.elapsed() < Duration::from_secs(3));
            }
            inside
                .sysctl("net.ipv4.ip_local_port_range", "32768 60999")
                .unwrap();
            let metrics = f
                .api("GET", "/metrics", None)
                .await
                .unwrap()
                .text()
                .to_string();
            (held.len(), refused, member.sources(), metrics)
        })
    })
    .join()
    .unwrap();
    drop(lab);
    let (held, refused, sources, metrics) = outcome;
    assert!(held >= 2, "held {held}, refused {refused}");
    assert!(refused >= 1, "held {held}, refused {refused}");
    assert_eq!(held + refused, 16);
    // Both addresses filled up before anything was refused.
    assert_eq!(sources.len(), 2, "{sources:?}");
    assert_eq!(sources.values().sum::<usize>(), held, "{sources:?}");
    let value = |line: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in {metrics}"))
    };
    assert!(value("fulcrum_snat_exhausted_total{vs=\"tcp\",address=\"127.0.0.2\"}") >= 1.0);
    assert!(value("fulcrum_snat_exhausted_total{vs=\"tcp\",address=\"127.0.0.3\"}") >= 1.0);
    assert_eq!(
        value("fulcrum_snat_failures_total{vs=\"tcp\"}"),
        refused as f64
    );
}
