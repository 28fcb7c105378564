//! Admission for the stream protocols (tcp, http, https, message): `allow` / `deny` and the
//! global connection cap, in a handler in front of the service's own, so they are the first
//! thing an accepted connection meets — before a TLS handshake, a request read or a member
//! pick. udp checks its lists in its receive loop.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_config::AccessList;
use fulcrum_net::{ServiceStats, StreamHandler};
use tokio::net::TcpStream;

use crate::limits::GlobalCap;

struct Guarded {
    /// `None` when the service has no lists.
    access: Option<AccessList>,
    cap: Arc<GlobalCap>,
    stats: Arc<ServiceStats>,
    inner: Arc<dyn StreamHandler>,
}

/// Resets at once, nothing read or sent, and no TIME_WAIT left on this side (a refused source
/// may be flooding).
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

impl StreamHandler for Guarded {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        if let Some(access) = &self.access {
            if !access.permits(peer.ip()) {
                self.stats.denied.fetch_add(1, Ordering::Relaxed);
                return reset(stream);
            }
        }
        if !self.cap.admits() {
            self.cap.refused.fetch_add(1, Ordering::Relaxed);
            self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
            return reset(stream);
        }
        self.inner.clone().handle(stream, peer, local);
    }
}

/// `inner` behind the service's lists and the global cap.
pub fn guard(
    access: &AccessList,
    cap: &Arc<GlobalCap>,
    stats: &Arc<ServiceStats>,
    inner: Arc<dyn StreamHandler>,
) -> Arc<dyn StreamHandler> {
    Arc::new(Guarded {
        access: (!access.is_empty()).then(|| access.clone()),
        cap: cap.clone(),
        stats: stats.clone(),
        inner,
    })
}
