//! Sockets shared by every data plane: listening sockets that outlive reloads, batched datagram
//! I/O (`recvmmsg`/`sendmmsg`, ICMP error queues), PROXY protocol headers, the forwarding engine
//! (buffer copy and `splice(2)`) and the byte relay for TLS streams and upgraded HTTP tunnels,
//! source-address (SNAT) pools and client-address transparency for member connections, client-side TCP tuning, the connection
//! tracker used at shutdown, and per-service counters. Nothing here knows a protocol above the
//! transport or a pool.

mod bind;
pub mod datagram;
pub mod forward;
pub mod listener;
pub mod proxy_protocol;
pub mod relay;
pub mod snat;
mod splice;
pub mod stats;
pub mod tracker;
pub mod transparent;
pub mod tuning;

pub use listener::{
    BindError, DatagramListeners, DatagramService, ListenAddr, Listener, Listeners, Prepared,
    PreparedDatagram, StreamHandler,
};
pub use snat::{Snat, Source};
pub use stats::{RuleHits, ServiceConnection, ServiceStats};
pub use tracker::Tracker;
pub use transparent::Transparent;
