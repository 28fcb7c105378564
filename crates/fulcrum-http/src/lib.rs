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
//! - `upstream`: member connections, shared idle stores for reuse, the sweeper;
//! - `h1` / `h2`: client connections (HTTP/1.x with keep-alive and pipelining; HTTP/2 via hyper),
//!   `h2_upstream` for pools that speak HTTP/2 to their members;
//! - `fields`: the forwarded heads (hop-by-hop fields, forwarding headers, rule edits);
//! - `tls`: the `fulcrum-tls` crate (shared with tcp services): TLS termination (certificates
//!   by SNI, resumption, client certificates) and TLS to members (`tls::client`);
//! - `cache`: the shared HTTP cache (RFC 9111) of `virtual_service.cache`;
//! - `access_log`, `date`; the Upgrade/WebSocket tunnel is `fulcrum_net::relay`.
//!
//! Connections are served by [`serve_connection`], generic over the byte stream: a TLS acceptor
//! (https) wraps the socket and passes the negotiated ALPN in [`ConnInfo`].

pub mod access_log;
mod body;
pub mod cache;
pub mod chunked;
pub mod compress;
pub mod cookie;
mod date;
pub mod fields;
mod h1;
mod h2;
mod h2_upstream;
mod h2guard;
pub mod head;
pub mod rules;
pub mod service;
pub mod sticky;
mod timer;
/// TLS lives in its own crate, shared with the tcp and message services.
pub use fulcrum_tls as tls;
pub mod upstream;

pub use cache::HttpCache;
pub use service::{
    serve_connection, Alpn, ConnInfo, HttpService, HttpStats, NoMemberHook, Parts, RequestInfo,
};
pub use upstream::Upstreams;
