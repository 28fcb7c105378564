//! In-memory members, for the fuzz targets and the unit tests of the exchange core (compiled
//! only with the `memory-members` feature, which fuzz/Cargo.toml turns on, and in `cfg(test)`).
//!
//! A member "listens" on an address with [`listen`]; a connection the proxy opens to that
//! address is then a `tokio::io::DuplexStream` pair instead of a TCP socket: the proxy gets one
//! end (`MemberIo::Memory`), the listener's [`Listener::accept`] the other. Addresses nobody
//! registered are connected over TCP as usual, so a test can mix both. No socket, no reactor
//! and no system call per connection: a fuzz input costs what the proxy's code costs.
//!
//! What a duplex stream cannot do, the member side does without: there is no TLS over it
//! (a pool with `tls` refuses the connection), no TCP_NODELAY, no receive window to watch.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// Bytes either direction of a member connection buffers before the writer waits: a socket
/// buffer's worth, so a request body the member does not read stalls as it would over TCP.
const PIPE: usize = 64 * 1024;

/// The registered addresses and where their connections go. A short list: tests and fuzz
/// targets register a handful of members.
static MEMBERS: Mutex<Vec<(SocketAddr, mpsc::UnboundedSender<DuplexStream>)>> =
    Mutex::new(Vec::new());

fn members(
) -> std::sync::MutexGuard<'static, Vec<(SocketAddr, mpsc::UnboundedSender<DuplexStream>)>> {
    // A panic while the list was held leaves it consistent (every change is one push/retain).
    MEMBERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A member listening in memory; once it is dropped, its address is connected over TCP again.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<DuplexStream>,
    /// Our entry in the registry (to remove it, and only it, on drop).
    tx: mpsc::UnboundedSender<DuplexStream>,
}

/// Makes `addr` an in-memory member (replacing a listener already there).
pub fn listen(addr: SocketAddr) -> Listener {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut m = members();
    m.retain(|(a, _)| *a != addr);
    m.push((addr, tx.clone()));
    Listener { addr, rx, tx }
}

impl Listener {
    /// The member's end of the next connection the proxy opens (never `None`: the listener
    /// holds a sender itself).
    pub async fn accept(&mut self) -> Option<DuplexStream> {
        self.rx.recv().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only our own registration: another listener may have taken the address since.
        members().retain(|(_, tx)| !tx.same_channel(&self.tx));
    }
}

/// The proxy's end of a new connection to `addr` if an in-memory member listens there; `None`
/// sends the caller to TCP.
pub(crate) fn connect(addr: SocketAddr) -> Option<io::Result<DuplexStream>> {
    let m = members();
    let (_, tx) = m.iter().find(|(a, _)| *a == addr)?;
    let (proxy, member) = tokio::io::duplex(PIPE);
    Some(match tx.send(member) {
        Ok(()) => Ok(proxy),
        Err(_) => Err(io::ErrorKind::ConnectionRefused.into()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::client::{Alpn, ConnInfo};
    use crate::service::HttpService;

    /// A service whose one member is at `member`, with `pool_extra` lines in its pool (no
    /// monitor, no retry).
    fn service(member: SocketAddr, pool_extra: &str) -> Arc<HttpService> {
        let pool = format!("monitors = []\nretries = 0\n{pool_extra}");
        crate::testing::service_to(&[member], "", "", &pool)
    }

    fn info() -> ConnInfo {
        ConnInfo {
            peer: "127.0.0.9:5000".parse().expect("address"),
            local: "127.0.0.1:80".parse().expect("address"),
            alpn: Alpn::Http1,
            sni: None,
        }
    }

    /// Reads one HTTP/1 request (head and Content-Length body) from `s`; `None` at its end.
    async fn read_request(s: &mut DuplexStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().expect("a length"));
                if buf.len() >= end + 4 + len {
                    return Some(buf.drain(..end + 4 + len).collect());
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Serves `requests` from a client over the proxy; the member answers each request it
    /// reads with "HTTP/1.1 200 OK" and the request's length as body. Returns what the client
    /// read, the requests the member saw and how many connections it accepted.
    async fn exchange(
        addr: SocketAddr,
        pool_extra: &str,
        requests: &[u8],
    ) -> (String, Vec<Vec<u8>>, usize) {
        let mut l = listen(addr);
        let member = tokio::spawn(async move {
            let (mut seen, mut conns) = (Vec::new(), 0);
            while let Ok(Some(mut s)) =
                tokio::time::timeout(std::time::Duration::from_secs(2), l.accept()).await
            {
                conns += 1;
                let mut buf = Vec::new();
                while let Some(req) = read_request(&mut s, &mut buf).await {
                    let body = req.len().to_string();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    seen.push(req);
                    s.write_all(answer.as_bytes()).await.expect("member write");
                }
            }
            (seen, conns)
        });
        let svc = service(addr, pool_extra);
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let proxy = tokio::spawn(crate::serve_connection(svc, server, info()));
        client.write_all(requests).await.expect("client write");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("client read");
        proxy.await.expect("the handler ends");
        let (seen, conns) = member.await.expect("member");
        (String::from_utf8_lossy(&got).into_owned(), seen, conns)
    }

    #[tokio::test(start_paused = true)]
    async fn requests_reach_an_in_memory_member_and_reuse_its_connection() {
        let addr: SocketAddr = "127.0.0.61:80".parse().expect("address");
        let (got, seen, conns) = exchange(
            addr,
            "",
            b"GET /a HTTP/1.1\r\nHost: m\r\n\r\nGET /b HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(got.matches("HTTP/1.1 200 OK").count(), 2, "{got}");
        assert_eq!(seen.len(), 2);
        assert!(seen[0].starts_with(b"GET /a HTTP/1.1\r\n"));
        assert!(seen[1].starts_with(b"GET /b HTTP/1.1\r\n"));
        assert_eq!(conns, 1, "the second request reuses the member connection");
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_upload_goes_whole_to_an_in_memory_member() {
        // Larger than the pipe and the proxy's buffers: the body is pumped (h1::pump_body, the
        // in-memory arm) while the member reads it.
        let addr: SocketAddr = "127.0.0.62:80".parse().expect("address");
        let mut req =
            b"POST /u HTTP/1.1\r\nHost: m\r\nConnection: close\r\nContent-Length: 200000\r\n\r\n"
                .to_vec();
        req.extend(std::iter::repeat_n(b'x', 200_000));
        let (got, seen, conns) = exchange(addr, "", &req).await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert_eq!(conns, 1);
        assert_eq!(seen.len(), 1);
        assert!(seen[0].ends_with(&[b'x'; 1000]));
        assert!(got.ends_with(&seen[0].len().to_string()), "{got}");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_reach_an_in_memory_http2_member_over_one_connection() {
        let addr: SocketAddr = "127.0.0.64:80".parse().expect("address");
        let mut l = listen(addr);
        // The member: hyper's HTTP/2 server on its end of each connection, answering with the
        // request's path.
        let member = tokio::spawn(async move {
            let mut conns = 0;
            while let Ok(Some(s)) =
                tokio::time::timeout(std::time::Duration::from_secs(2), l.accept()).await
            {
                conns += 1;
                let answer = hyper::service::service_fn(|req: http::Request<_>| async move {
                    let body =
                        http_body_util::Full::new(bytes::Bytes::from(req.uri().path().to_string()));
                    Ok::<_, std::convert::Infallible>(http::Response::new(body))
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), answer),
                );
            }
            conns
        });
        let svc = service(addr, "http2 = true");
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let proxy = tokio::spawn(crate::serve_connection(svc, server, info()));
        client
            .write_all(b"GET /one HTTP/1.1\r\nHost: m\r\n\r\nGET /two HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .await
            .expect("client write");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("client read");
        let got = String::from_utf8_lossy(&got);
        proxy.await.expect("the handler ends");
        assert_eq!(got.matches("HTTP/1.1 200 OK").count(), 2, "{got}");
        assert!(got.contains("/one") && got.contains("/two"), "{got}");
        assert_eq!(
            member.await.expect("member"),
            1,
            "both requests on one connection"
        );
    }

    #[tokio::test]
    async fn addresses_without_a_listener_go_to_tcp_and_tls_is_refused() {
        let addr: SocketAddr = "127.0.0.63:80".parse().expect("address");
        assert!(connect(addr).is_none());
        let l = listen(addr);
        assert_eq!(l.addr(), addr);
        let tls = crate::upstream::memory_member(addr, true).expect("registered");
        assert_eq!(
            tls.expect_err("no TLS in memory").kind(),
            io::ErrorKind::Unsupported
        );
        assert!(crate::upstream::memory_member(addr, false).is_some_and(|r| r.is_ok()));
        drop(l);
        assert!(connect(addr).is_none(), "dropped: back to TCP");
    }
}
