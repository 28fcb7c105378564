//! Message-based load balancing (`protocol = "message"`): long-lived client connections carrying
//! framed messages (length prefix, ISO 8583 style, or a delimiter), each message scheduled on its
//! own over long-lived connections that Fulcrum keeps to the members.
//!
//! - `framing`: cuts byte streams into messages (pure, bounded; fuzzed).
//! - `client`: one task per client connection: frames in, answers out.
//! - `hub`: the dispatcher of a service: per-message scheduling with the pool, the member queues,
//!   re-sending after a member connection died, reload re-targeting.
//! - `link`: one task per member connection: sync (one message at a time) or async (pipelined,
//!   answers paired by sequence id or by order).
//! - `stats`: counters for the API and metrics.

mod client;
pub mod framing;
mod hub;
mod link;
pub mod stats;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

pub use framing::{Frame, FrameError, Framer};
pub use hub::{Dispatch, Hub, MemberLinks, Settings};
pub use stats::{FailReason, LatencyHistogram, MemberMessageStats, MessageStats, LATENCY_BUCKETS};

use fulcrum_net::listener::StreamHandler;
use fulcrum_net::tracker::Tracker;

impl Hub {
    /// A dispatcher over `pool`; no member connection is opened before `start`.
    pub fn new(
        name: Arc<str>,
        settings: Settings,
        stats: Arc<fulcrum_net::stats::ServiceStats>,
        messages: Arc<MessageStats>,
        pool: Arc<fulcrum_balance::Pool>,
        persistence: Option<crate::tcp::SourcePersistence>,
    ) -> Arc<Hub> {
        Hub::with_link_task(
            name,
            settings,
            stats,
            messages,
            pool,
            persistence,
            link::spawn,
        )
    }
}

/// A `protocol = "message"` virtual service as the listeners see it: the dispatchers its client
/// connections use, one per pool they can go to, and the client-side limits of the current
/// configuration.
#[derive(Debug)]
pub struct MessageService {
    /// The dispatcher of the service's own pool (`hubs[0]`).
    pub hub: Arc<Hub>,
    /// The rules choosing a client connection's pool: an index into `hubs`, which holds one
    /// dispatcher per pool of `rules.pools()`, in the same order. A connection keeps its
    /// dispatcher (and so its pool) for its whole life.
    pub rules: crate::rules::L4Rules,
    pub hubs: Vec<Arc<Hub>>,
    /// Closes a client connection after this long without a byte either way.
    pub idle_timeout: Duration,
    /// Concurrent client connections; 0 = unlimited.
    pub max_connections: u32,
    pub tracker: Arc<Tracker>,
    /// TLS termination for the clients (`tls` on the service).
    pub tls: Option<Arc<fulcrum_tls::ServerTls>>,
}

impl StreamHandler for MessageService {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        // Persistence (`source_ip`: the member the client's messages went to), then the rules:
        // the pool of this client connection, or a `drop` rule (reset at once, as `deny` does).
        let remembered = if self.rules.is_empty() {
            None
        } else {
            let d = self.hub.dispatch_state();
            d.persistence
                .as_ref()
                .and_then(|p| p.table.get(&p.key(peer)))
        };
        let hub = match self.rules.choose(peer.ip(), local.port(), remembered) {
            crate::rules::Choice::Pool(i) => self.hubs.get(i).unwrap_or(&self.hub).clone(),
            crate::rules::Choice::Drop => {
                tracing::debug!(service = %self.hub.name, client = %peer, "dropped by a rule");
                let _ = stream.set_zero_linger();
                return;
            }
        };
        let tracked = self.tracker.track();
        tokio::spawn(async move {
            client::serve(self.clone(), hub, stream, peer).await;
            drop(tracked);
        });
    }
}
