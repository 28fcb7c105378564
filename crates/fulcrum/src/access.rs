//! `allow` / `deny` for the stream protocols (tcp, http, https, message): a handler in front of
//! the service's own, so the check is the first thing an accepted connection meets — before a
//! TLS handshake, a request read or a member pick. udp checks in its receive loop.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_config::AccessList;
use fulcrum_proxy::{ServiceStats, StreamHandler};
use tokio::net::TcpStream;

struct Guarded {
    access: AccessList,
    stats: Arc<ServiceStats>,
    inner: Arc<dyn StreamHandler>,
}

impl StreamHandler for Guarded {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        if !self.access.permits(peer.ip()) {
            self.stats.denied.fetch_add(1, Ordering::Relaxed);
            // Reset at once, nothing read or sent, and no TIME_WAIT left on this side (a
            // refused source may be flooding).
            let _ = stream.set_zero_linger();
            drop(stream);
            return;
        }
        self.inner.clone().handle(stream, peer);
    }
}

/// `inner` behind `access`, or `inner` itself when the service has no lists.
pub fn guard(
    access: &AccessList,
    stats: &Arc<ServiceStats>,
    inner: Arc<dyn StreamHandler>,
) -> Arc<dyn StreamHandler> {
    if access.is_empty() {
        return inner;
    }
    Arc::new(Guarded {
        access: access.clone(),
        stats: stats.clone(),
        inner,
    })
}
