//! `protocol = "rtsp"` end to end: real RTSP servers (GStreamer's gst-rtsp-server, driven by
//! tests/rtsp/server.py) as members, ffprobe and ffmpeg as clients over interleaved TCP and
//! over UDP (RTP / RTCP relayed by Fulcrum), rules on the URL, and a raw client whose session
//! goes back to its member on new connections (`rtsp_session` persistence).

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rtsp/server.py");

/// A gst-rtsp-server child, killed when dropped (also when the test fails).
struct RtspServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server on 127.0.0.1 mounting `paths` ("/a,/b"); another port is tried when the
/// chosen one was taken meanwhile.
async fn rtsp_server(paths: &str) -> RtspServer {
    rtsp_server_with(paths, &[]).await
}

/// `rtsp_server` with server.py's options after the paths ("keep").
async fn rtsp_server_with(paths: &str, options: &[&str]) -> RtspServer {
    for _ in 0..5 {
        let addr = free_addr();
        let child = Command::new("/usr/bin/python3")
            .args([SERVER, "127.0.0.1", &addr.port().to_string(), paths])
            .args(options)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the RTSP server");
        let mut server = RtspServer { child, addr };
        let up = wait_until(Duration::from_secs(10), || async move {
            TcpStream::connect(addr).await.is_ok()
        })
        .await;
        if up {
            return server;
        }
        if server.child.try_wait().ok().flatten().is_none() {
            panic!("the RTSP server on {addr} did not start within 10s");
        }
    }
    panic!("no port for the RTSP server");
}

/// Runs an ffmpeg tool (at most 20 s) and returns (success, stdout, stderr).
async fn ffmpeg_tool(tool: &str, args: Vec<String>) -> (bool, String, String) {
    let tool = tool.to_string();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("timeout")
            .args(["-k", "2", "20", &tool, "-v", "error"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("ffmpeg runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("ffmpeg task")
}

/// The codec ffprobe reads from the stream's description, through `url` with `transport`.
async fn described_codec(url: &str, transport: &str) -> String {
    let args = [
        "-rtsp_transport",
        transport,
        "-show_entries",
        "stream=codec_name",
        "-of",
        "csv=p=0",
        url,
    ];
    let (ok, out, err) = ffmpeg_tool("ffprobe", args.iter().map(|s| s.to_string()).collect()).await;
    assert!(ok, "ffprobe {transport} {url}: {err}");
    out.trim().to_string()
}

/// Audio frames ffmpeg decodes from `url` with `transport` (it stops after 20).
async fn frames(url: &str, transport: &str) -> usize {
    let args = [
        "-rtsp_transport",
        transport,
        "-i",
        url,
        "-frames:a",
        "20",
        "-f",
        "framecrc",
        "-",
    ];
    let (ok, out, err) = ffmpeg_tool("ffmpeg", args.iter().map(|s| s.to_string()).collect()).await;
    assert!(ok, "ffmpeg {transport} {url}: {err}");
    out.lines().filter(|l| !l.starts_with('#')).count()
}

fn rtsp_status(status: &serde_json::Value) -> &serde_json::Value {
    &status["virtual_services"][0]["rtsp"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_carry_frames_and_a_rule_on_the_url_chooses_the_member() {
    // Each member mounts one path: a request reaching the other one would be answered 404.
    let a = rtsp_server("/a").await;
    let b = rtsp_server("/b").await;
    let vs = free_addr();
    let f = start(&format!(
        "[[virtual_service]]\nname = \"cam\"\nlisten = \"{vs}\"\nprotocol = \"rtsp\"\npool = \"a\"\n\
         [[virtual_service.rule]]\nname = \"b-streams\"\npath_prefix = \"/b\"\npool = \"b\"\n\
         [[pool]]\nname = \"a\"\n[[pool.member]]\naddress = \"{}\"\n\
         [[pool]]\nname = \"b\"\n[[pool.member]]\naddress = \"{}\"\n",
        a.addr, b.addr
    ))
    .await;
    for transport in ["tcp", "udp"] {
        for path in ["a", "b"] {
            let url = format!("rtsp://{vs}/{path}");
            assert_eq!(
                described_codec(&url, transport).await,
                "pcm_s16be",
                "{transport} {url}"
            );
            let n = frames(&url, transport).await;
            assert!(n >= 20, "{transport} {url}: {n} frames");
        }
        let status = f.get_json("/api/v1/status").await;
        if transport == "tcp" {
            // Interleaved: the media came in `$` frames on the connection, nothing over UDP.
            assert_eq!(rtsp_status(&status)["datagrams"], 0, "{status}");
        }
    }
    let status = f.get_json("/api/v1/status").await;
    let rtsp = rtsp_status(&status);
    // 2 transports × 2 paths × (ffprobe + ffmpeg), each opening one session.
    assert_eq!(rtsp["sessions"], 8, "{status}");
    // The UDP runs' RTP came through Fulcrum's relays (≥ 20 frames each for ffmpeg).
    assert!(rtsp["datagrams"].as_u64().unwrap_or(0) >= 40, "{status}");
    assert_eq!(rtsp["malformed"], 0, "{status}");
    assert_eq!(rtsp["datagrams_dropped"], 0, "{status}");
    assert_eq!(
        status["virtual_services"][0]["connections_active"], 0,
        "{status}"
    );
    let metrics = f
        .api("GET", "/metrics", None)
        .await
        .expect("metrics")
        .text();
    assert!(
        metrics.contains("fulcrum_vs_rtsp_datagrams_total{vs=\"cam\",protocol=\"rtsp\"}"),
        "{metrics}"
    );
}

/// A raw RTSP client connection: requests out, responses in (interleaved frames skipped).
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    cseq: u32,
}

/// A response's status, header block and body.
struct Response {
    status: u16,
    head: String,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

impl Client {
    async fn connect(vs: SocketAddr) -> Client {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(vs))
            .await
            .expect("connect in time")
            .expect("connect");
        Client {
            stream,
            buf: Vec::new(),
            cseq: 0,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    async fn request(&mut self, method: &str, url: &str, headers: &str) -> Response {
        self.cseq += 1;
        let text = format!(
            "{method} {url} RTSP/1.0\r\nCSeq: {}\r\n{headers}\r\n",
            self.cseq
        );
        self.send(text.as_bytes()).await;
        let r = self.response().await;
        assert_eq!(
            r.header("CSeq"),
            Some(self.cseq.to_string().as_str()),
            "{}",
            r.head
        );
        r
    }

    /// Reads until `buf` holds `n` bytes (bounded: 5 s).
    async fn fill(&mut self, n: usize) {
        while self.buf.len() < n {
            let mut chunk = [0u8; 8192];
            let got = tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk))
                .await
                .expect("data in time")
                .expect("read");
            assert!(
                got > 0,
                "closed; had {:?}",
                String::from_utf8_lossy(&self.buf)
            );
            self.buf.extend_from_slice(&chunk[..got]);
        }
    }

    /// The next interleaved frame's channel and payload length.
    async fn frame(&mut self) -> (u8, usize) {
        self.fill(4).await;
        assert_eq!(
            self.buf[0],
            b'$',
            "{:?}",
            String::from_utf8_lossy(&self.buf)
        );
        let len = usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]]));
        let channel = self.buf[1];
        self.fill(4 + len).await;
        self.buf.drain(..4 + len);
        (channel, len)
    }

    async fn response(&mut self) -> Response {
        // Bounded: each round takes a frame or a message, or fails at the read timeout.
        for _ in 0..10_000 {
            self.fill(1).await;
            if self.buf[0] == b'$' {
                self.frame().await;
                continue;
            }
            let end = loop {
                if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let n = self.buf.len() + 1;
                self.fill(n).await;
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
            let mut r = Response {
                status: head[9..12].parse().expect("status"),
                head,
                body: String::new(),
            };
            let len: usize = r
                .header("Content-Length")
                .map_or(0, |v| v.parse().expect("length"));
            self.fill(end + len).await;
            r.body = String::from_utf8_lossy(&self.buf[end..end + len]).into_owned();
            self.buf.drain(..end + len);
            return r;
        }
        panic!("no response among 10000 frames");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_goes_back_to_its_member_on_new_connections() {
    // Two members serving the same path, taken in turn: only the one that opened a session
    // knows it (the other answers 454 Session Not Found).
    let m1 = rtsp_server("/a").await;
    let m2 = rtsp_server("/a").await;
    let vs = free_addr();
    let f = start(&format!(
        "[[virtual_service]]\nname = \"cam\"\nlisten = \"{vs}\"\nprotocol = \"rtsp\"\npool = \"p\"\npersistence = \"sessions\"\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n\
         [[pool.member]]\naddress = \"{}\"\n[[pool.member]]\naddress = \"{}\"\n\
         [[persistence]]\nname = \"sessions\"\ntype = \"rtsp_session\"\ntimeout = \"1m\"\n",
        m1.addr, m2.addr
    ))
    .await;
    let url = format!("rtsp://{vs}/a");
    let mut first = Client::connect(vs).await;
    let described = first
        .request("DESCRIBE", &url, "Accept: application/sdp\r\n")
        .await;
    assert_eq!(described.status, 200, "{}", described.head);
    let control = described
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("a=control:"))
        .find(|c| *c != "*")
        .expect("a track")
        .trim()
        .to_string();
    let setup = first
        .request(
            "SETUP",
            &format!("{url}/{control}"),
            "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
        )
        .await;
    assert_eq!(setup.status, 200, "{}", setup.head);
    let session = setup
        .header("Session")
        .expect("a session")
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let play = first
        .request("PLAY", &url, &format!("Session: {session}\r\n"))
        .await;
    assert_eq!(play.status, 200, "{}", play.head);
    // The media comes interleaved on the control connection, through Fulcrum untouched.
    for _ in 0..5 {
        let (channel, len) = first.frame().await;
        assert!(channel == 0 || channel == 1, "channel {channel}");
        assert!(len > 0);
    }

    // New connections carrying the session reach its member, whatever round robin says.
    for _ in 0..4 {
        let mut other = Client::connect(vs).await;
        let r = other
            .request("GET_PARAMETER", &url, &format!("Session: {session}\r\n"))
            .await;
        assert_eq!(r.status, 200, "{}", r.head);
    }
    // Bytes that are not RTSP are answered 400 and counted.
    let mut bad = Client::connect(vs).await;
    bad.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let r = bad.response().await;
    assert_eq!(r.status, 400, "{}", r.head);
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(rtsp_status(&status)["malformed"], 1, "{status}");
    assert_eq!(rtsp_status(&status)["sessions"], 1, "{status}");
}

/// `n` UDP ports on 127.0.0.1 nobody holds now, starting at an even one (bind-checked).
fn free_udp_range(n: u16) -> (u16, u16) {
    for _ in 0..50 {
        let start = fulcrum_testkit::free_port() & !1;
        let Some(end) = start.checked_add(n - 1) else {
            continue;
        };
        let free = start > 1024
            && (start..=end).all(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok());
        if free {
            return (start, end);
        }
    }
    panic!("no free range of {n} UDP ports");
}

/// The `key=a-b` pair of a Transport header.
fn port_pair(transport: &str, key: &str) -> (u16, u16) {
    let value = transport
        .split(';')
        .find_map(|p| p.trim().strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {transport}"));
    let (a, b) = value.split_once('-').expect("a-b");
    (a.parse().expect("port"), b.parse().expect("port"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_media_flows_through_fulcrums_ports_for_the_sessions_hosts_only() {
    // A member that keeps a session's media going after its control connection closes.
    let member = rtsp_server_with("/a", &["keep"]).await;
    let vs = free_addr();
    let (low, high) = free_udp_range(20);
    let f = start(&format!(
        "[[virtual_service]]\nname = \"cam\"\nlisten = \"{vs}\"\nprotocol = \"rtsp\"\npool = \"p\"\n\
         rtsp_rtp_ports = \"{low}-{high}\"\n\
         [[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{}\"\n",
        member.addr
    ))
    .await;
    let rtp = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("rtp socket");
    let rtcp = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("rtcp socket");
    let (a, b) = (
        rtp.local_addr().expect("addr").port(),
        rtcp.local_addr().expect("addr").port(),
    );
    let url = format!("rtsp://{vs}/a");
    let mut client = Client::connect(vs).await;
    let described = client.request("DESCRIBE", &url, "").await;
    assert_eq!(described.status, 200, "{}", described.head);
    let transport = format!("Transport: RTP/AVP;unicast;client_port={a}-{b}\r\n");
    let setup = client
        .request("SETUP", &format!("{url}/stream=0"), &transport)
        .await;
    assert_eq!(setup.status, 200, "{}", setup.head);
    let reply = setup.header("Transport").expect("Transport").to_string();
    // The client gets its own ports back, and Fulcrum's pair from the configured range.
    assert_eq!(port_pair(&reply, "client_port"), (a, b), "{reply}");
    let (q, q1) = port_pair(&reply, "server_port");
    assert!(
        q % 2 == 0 && q1 == q + 1 && low <= q && q1 <= high,
        "{reply}"
    );
    let session = setup
        .header("Session")
        .expect("a session")
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let play = client
        .request("PLAY", &url, &format!("Session: {session}\r\n"))
        .await;
    assert_eq!(play.status, 200, "{}", play.head);
    // RTP arrives from Fulcrum's server port, not from the member.
    let mut buf = [0u8; 2048];
    for _ in 0..5 {
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), rtp.recv_from(&mut buf))
            .await
            .expect("RTP in time")
            .expect("recv");
        assert!(n > 12 && buf[0] >> 6 == 2, "an RTP version 2 packet");
        assert_eq!(from, SocketAddr::from(([127, 0, 0, 1], q)));
    }
    // A host other than the session's client cannot send into the relay.
    let stranger = tokio::net::UdpSocket::bind("127.0.0.2:0")
        .await
        .expect("bind");
    stranger
        .send_to(b"not from the client", ("127.0.0.1", q))
        .await
        .expect("send");
    let dropped = wait_until(Duration::from_secs(5), || async {
        let status = f.get_json("/api/v1/status").await;
        rtsp_status(&status)["datagrams_dropped"].as_u64() == Some(1)
    })
    .await;
    let status = f.get_json("/api/v1/status").await;
    assert!(dropped, "{status}");
    assert!(
        rtsp_status(&status)["datagrams"].as_u64().unwrap_or(0) >= 5,
        "{status}"
    );
    // The session outlives its control connection (RFC 2326 §3): the member goes on sending
    // and the relay goes on carrying it.
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    while rtp.try_recv_from(&mut buf).is_ok() {}
    for _ in 0..3 {
        let (_, from) = tokio::time::timeout(Duration::from_secs(5), rtp.recv_from(&mut buf))
            .await
            .expect("RTP after the control connection closed")
            .expect("recv");
        assert_eq!(from, SocketAddr::from(([127, 0, 0, 1], q)));
    }
    // A TEARDOWN on another connection ends the session, and its relay with it.
    let mut other = Client::connect(vs).await;
    let teardown = other
        .request("TEARDOWN", &url, &format!("Session: {session}\r\n"))
        .await;
    assert_eq!(teardown.status, 200, "{}", teardown.head);
    tokio::time::sleep(Duration::from_millis(300)).await;
    while rtp.try_recv_from(&mut buf).is_ok() {}
    let late = tokio::time::timeout(Duration::from_secs(1), rtp.recv_from(&mut buf)).await;
    assert!(late.is_err(), "RTP after the session's TEARDOWN");
}
