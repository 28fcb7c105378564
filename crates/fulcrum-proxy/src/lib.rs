//! L4 data planes: listening sockets that survive reloads, the TCP full proxy with zero-copy
//! forwarding, PROXY protocol towards members, and message-based load balancing.

pub mod forward;
pub mod listener;
pub mod message;
pub mod proxy_protocol;
mod splice;
pub mod stats;
pub mod tcp;
pub mod tracker;

pub use listener::{BindError, Listener, Listeners, Prepared, StreamHandler};
pub use message::MessageService;
pub use stats::{ServiceConnection, ServiceStats};
pub use tcp::{SourcePersistence, TcpService};
pub use tracker::Tracker;
