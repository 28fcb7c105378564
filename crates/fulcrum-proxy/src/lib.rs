//! L4 data planes on the shared sockets of `fulcrum-net`: the TCP full proxy, the UDP proxy
//! (session and per-packet, with RADIUS persistence), message-based load balancing, and the
//! protocol helpers that read a tcp service's control connection (FTP, RTSP).

pub mod ftp;
pub mod message;
pub mod radius;
pub mod rtsp;
pub mod rules;
pub mod tcp;
pub mod udp;

pub use ftp::FtpService;
pub use message::MessageService;
pub use rtsp::RtspService;
pub use rules::{Choice, L4Rules};
pub use tcp::{SourcePersistence, TcpService};
pub use udp::{RadiusPersistence, UdpService, UdpStats};
