//! Accepting a client connection: TLS when the service terminates it, then HTTP/1.x or HTTP/2
//! by ALPN or by the connection preface.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_net::StreamHandler;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::client::{Alpn, ConnInfo};
use crate::service::HttpService;

impl StreamHandler for HttpService {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        if self.max_connections > 0
            && self.stats.connections_active.load(Ordering::Relaxed)
                >= u64::from(self.max_connections)
        {
            self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let tracked = self.tracker.track();
        let conn = self.stats.open();
        // TCP_NODELAY comes from the listener (inherited; `tcp.nodelay` may turn it off).
        tokio::spawn(async move {
            let mut info = ConnInfo {
                peer,
                local,
                alpn: Alpn::Unknown,
                sni: None,
            };
            match self.tls.clone() {
                None => serve_connection(self, stream, info).await,
                // Boxed: the handshake and the TLS stream would otherwise enlarge the task of
                // every plain connection too.
                Some(tls) => {
                    Box::pin(async move {
                        if let Some((stream, alpn)) = tls.accept(stream, &self.name, peer).await {
                            info.alpn = match alpn.as_deref() {
                                Some(b"h2") => Alpn::H2,
                                _ => Alpn::Http1,
                            };
                            info.sni = stream.get_ref().1.server_name().map(Into::into);
                            serve_connection(self, stream, info).await;
                        }
                    })
                    .await
                }
            }
            drop(conn);
            drop(tracked);
        });
    }
}

/// Serves one client connection: HTTP/1.1, or HTTP/2 when ALPN chose it or the client opens with
/// the HTTP/2 preface. Generic over the byte stream so a TLS acceptor can sit in front.
pub async fn serve_connection<S>(svc: Arc<HttpService>, mut io: S, info: ConnInfo)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // HTTP/2 is boxed: its connection future (about 2.4 KiB) would otherwise size the task of
    // every HTTP/1 connection too.
    match info.alpn {
        Alpn::H2 => Box::pin(crate::h2::serve(svc, io, info, Vec::new())).await,
        Alpn::Http1 => crate::h1::serve(svc, io, info, Vec::with_capacity(1024)).await,
        Alpn::Unknown => {
            // Read until the bytes either differ from the preface or complete it; an HTTP/1
            // request differs at its first byte, so this costs nothing for HTTP/1 clients.
            // The buffer starts small (most request heads fit) and grows as needed.
            let mut buf = Vec::with_capacity(1024);
            let deadline = tokio::time::Instant::now() + svc.header_timeout;
            loop {
                let n = buf.len().min(crate::h2::PREFACE.len());
                if buf[..n] != crate::h2::PREFACE[..n] {
                    break;
                }
                if n == crate::h2::PREFACE.len() {
                    return Box::pin(crate::h2::serve(svc, io, info, buf)).await;
                }
                match tokio::time::timeout_at(
                    deadline,
                    tokio::io::AsyncReadExt::read_buf(&mut io, &mut buf),
                )
                .await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => return,
                    Ok(Ok(_)) => {}
                    Err(_) => {
                        if !buf.is_empty() {
                            svc.http_stats
                                .header_timeouts
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        return;
                    }
                }
            }
            crate::h1::serve(svc, io, info, buf).await
        }
    }
}

#[cfg(test)]
mod size_tests {
    /// The future of a client connection is its task's size, paid by every idle keep-alive
    /// connection and copied at every accept: the per-request states (exchange, cache,
    /// HTTP/2) are boxed so it stays small. 6 KiB before they were; HAProxy holds about
    /// 5 KiB per idle connection in all.
    #[test]
    fn connection_future_stays_small() {
        fn size<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let svc: std::sync::Arc<crate::HttpService> = unimplemented_service();
            let info = super::ConnInfo {
                peer: "127.0.0.1:1".parse().unwrap(),
                local: "127.0.0.1:2".parse().unwrap(),
                alpn: super::Alpn::Unknown,
                sni: None,
            };
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let s = tokio::net::TcpStream::connect(l.local_addr().unwrap())
                .await
                .unwrap();
            let f = super::serve_connection(svc.clone(), s, info);
            let bytes = size(&f);
            assert!(
                bytes <= 1536,
                "a plain HTTP connection's future is {bytes} bytes: box the state that grew it"
            );
        });
    }

    fn unimplemented_service() -> std::sync::Arc<crate::HttpService> {
        crate::testing::service(0, "", "")
    }
}
