//! L4 data planes: listening sockets that survive reloads, the TCP full proxy with zero-copy
//! forwarding, PROXY protocol towards members, the UDP proxy (session and per-packet, with
//! RADIUS persistence), and message-based load balancing.

pub mod forward;
pub mod listener;
pub mod message;
pub mod proxy_protocol;
pub mod radius;
pub mod relay;
pub mod snat;
mod splice;
pub mod stats;
pub mod tcp;
pub mod tracker;
pub mod tuning;
pub mod udp;

pub use listener::{
    BindError, DatagramListeners, DatagramService, Listener, Listeners, Prepared, PreparedDatagram,
    StreamHandler,
};
pub use message::MessageService;
pub use snat::Snat;
pub use stats::{ServiceConnection, ServiceStats};
pub use tcp::{SourcePersistence, TcpService};
pub use tracker::Tracker;
pub use udp::{RadiusPersistence, UdpService, UdpStats};
