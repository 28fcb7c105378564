//! Fulcrum's L7 data plane: `protocol = "http"` virtual services.
//!
//! An HTTP/1.1 and HTTP/2 reverse proxy and load balancer built on the shared libraries: members,
//! pools, schedulers, persistence tables and the one health state machine come from
//! `fulcrum-balance`, listeners and counters from `fulcrum-net`, passive status observation
//! from `fulcrum-health`. What lives here is the HTTP part:
//!
//! - `head`: request/response heads parsed in place (`httparse`) and checked against RFC 9112's
//!   framing rules (smuggling: 400 and close), with the 414/431 limits;
//! - `chunked`: a strict chunked decoder and encoder;
//! - `rules`: content switching compiled to indexes (hosts, paths, methods) and regexes;
//! - `sticky`: persistence cookies (signed insert, rewrite, passive), header and source tables;
//! - `upstream`: member connections (HTTP/1.1 idle stores shared by all threads, one shared
//!   HTTP/2 connection per member), the sweeper;
//! - the exchange core, the same for every client and member protocol: `exchange` (the route
//!   of a request, its attempts at the pool's members on `fulcrum_balance::Attempts`: select,
//!   acquire or connect, classify failures, retry, passive health, persistence), `plan` (one
//!   response plan: client framing, compression, persistence cookie, response fields),
//!   `fields` (the forwarded heads: hop-by-hop fields, forwarding headers, rule edits);
//! - the client adapters `h1` (HTTP/1.x on its own byte path: keep-alive, pipelining, bodies
//!   moved between sockets) and `h2` (HTTP/2 on the `h2` crate, its streams driven by the connection's task: `h2_streams`), `conn` (TLS, then ALPN or the preface
//!   picks one); `forward` (a response streamed as a body, for HTTP/2 clients and cache fills)
//!   and `h2_upstream` (the HTTP/2 member session);
//! - body filters written once for both client protocols: `cache` (RFC 9111 store and stored
//!   bodies; `cached` is a request's way through it) and `compress`;
//! - `tls`: the `fulcrum-tls` crate (shared with tcp services): TLS termination (certificates
//!   by SNI, resumption, client certificates) and TLS to members (`tls::client`);
//! - `access_log`, `date`; the Upgrade/WebSocket tunnel is `fulcrum_net::relay`.
//!
//! Layers: the feature modules (`cache`, `compress`, `body`, `upstream`, `sticky`, `rules`,
//! `access_log`, `head`, `fields`: the service hands it `fields::Settings`) never import
//! `service`; the service imports them; the exchange core
//! and the adapters import both. No module imports one that imports it back.
//!
//! Connections are served by [`serve_connection`], generic over the byte stream: a TLS acceptor
//! (https) wraps the socket and passes the negotiated ALPN in [`ConnInfo`].

pub mod access_log;
mod body;
mod body_limit;
pub mod cache;
mod cached;
pub mod chunked;
pub mod client;
pub mod compress;
mod conn;
pub mod cookie;
mod date;
mod exchange;
pub mod fields;
mod forward;
mod h1;
mod h1_out;
mod h2;
mod h2_streams;
mod h2_upstream;
pub mod head;
pub mod local;
mod plan;
mod request_loop;
pub mod rules;
pub mod service;
mod sink;
pub mod sticky;
#[cfg(test)]
mod testing;
mod timer;
mod transform;
/// TLS lives in its own crate, shared with the tcp and message services.
pub use fulcrum_tls as tls;
pub mod upstream;
pub mod wasm_filters;

/// The error of a body that crosses hyper.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What `Body::poll_frame` returns for the bodies of this crate.
pub type FramePoll = std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>>;

pub use cache::HttpCache;
pub use client::{Alpn, ConnInfo};
pub use conn::serve_connection;
pub use service::{HttpService, HttpStats, NoMemberHook, Parts, RequestInfo};
pub use upstream::Upstreams;
