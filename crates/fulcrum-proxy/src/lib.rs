//! L4 data planes on the shared sockets of `fulcrum-net`: the TCP full proxy, the UDP proxy
//! (session and per-packet, with RADIUS persistence), and message-based load balancing.

pub mod ftp;
pub mod message;
pub mod radius;
pub mod rules;
pub mod tcp;
pub mod udp;

pub use ftp::FtpService;
pub use message::MessageService;
pub use rules::{Choice, L4Rules};
pub use tcp::{SourcePersistence, TcpService};
pub use udp::{RadiusPersistence, UdpService, UdpStats};
