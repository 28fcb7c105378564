//! Client-address transparency (`source = "client"` on a service): member connections leave
//! from the client's own address, as HAProxy's `source 0.0.0.0 usesrc clientip` or nginx's
//! `proxy_bind $remote_addr transparent`. The socket gets `IP_TRANSPARENT` (`IPV6_TRANSPARENT`),
//! which lets it bind an address this host does not have, is bound to the client's address and
//! port, then connects. When that 4-tuple is taken towards the member (`EADDRINUSE` /
//! `EADDRNOTAVAIL`: the client reached two services with one port, or an earlier connection
//! from that port is in TIME_WAIT), the connection is made from the client's address with a
//! port the kernel picks, and counted (`port_fallbacks`).
//!
//! The members' replies are addressed to the client; they reach this host because the members
//! route through it, and are delivered to the transparent socket by the policy routing Fulcrum
//! installs (`fulcrum_link::transparent`).
//!
//! This module is the one place such sockets are made; the tcp and http planes reach it through
//! `snat::connect` with `Source::Client`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::net::{TcpSocket, TcpStream};

use crate::bind::{bind_address_no_port, is_exhausted, member_socket};

/// A service's transparency counters, kept across reloads by service name.
#[derive(Debug)]
pub struct Transparent {
    pub service: Arc<str>,
    /// Member connections established from a client's address.
    pub connections: AtomicU64,
    /// Connections whose client port was taken towards the member: made from the client's
    /// address with another port.
    pub port_fallbacks: AtomicU64,
    /// Member connections that could not be made from the client's address at all (the
    /// client's and the member's address families differ, the socket option was refused, or
    /// no port was left); not counted against the member.
    pub failures: AtomicU64,
}

fn registry() -> &'static Mutex<HashMap<String, Arc<Transparent>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Transparent>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Transparent {
    /// The counters of service `service` (the same object across reloads).
    pub fn for_service(service: &str) -> Arc<Transparent> {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.entry(service.to_string())
            .or_insert_with(|| {
                Arc::new(Transparent {
                    service: Arc::from(service),
                    connections: AtomicU64::new(0),
                    port_fallbacks: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// The counters of `service` if it has (had) `source = "client"`.
    pub fn get(service: &str) -> Option<Arc<Transparent>> {
        let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.get(service).cloned()
    }

    /// Forgets services that no longer have `source = "client"` (after a reload).
    pub fn retain(keep: &dyn Fn(&str) -> bool) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|name, _| keep(name));
    }

    /// Every service with `source = "client"`, by name, for metrics.
    pub fn all() -> Vec<Arc<Transparent>> {
        let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = reg.values().cloned().collect();
        v.sort_by(|a, b| a.service.cmp(&b.service));
        v
    }

    /// Connects to `member` from `client`'s address: its port first, then (that 4-tuple being
    /// taken) a port the kernel picks. Fails with `AddrNotAvailable` — not the member's fault —
    /// when the connection cannot come from the client's address at all.
    pub(crate) async fn connect(
        &self,
        client: SocketAddr,
        member: SocketAddr,
        vrf: Option<&str>,
    ) -> io::Result<TcpStream> {
        let ip = client.ip().to_canonical();
        if ip.is_ipv4() != member.is_ipv4() {
            return Err(self.failed(format!(
                "source = \"client\": the client {ip} and the member {member} are of different address families"
            )));
        }
        let first = match open(ip, client.port(), member, vrf) {
            Ok(socket) => socket.connect(member).await,
            Err(e) => Err(e),
        };
        match first {
            Ok(s) => {
                self.connections.fetch_add(1, Ordering::Relaxed);
                return Ok(s);
            }
            Err(e) if is_exhausted(&e) => {
                let before = self.port_fallbacks.fetch_add(1, Ordering::Relaxed);
                if before == 0 || (before + 1).is_power_of_two() {
                    tracing::info!(service = %self.service, %client, %member, fallbacks = before + 1, error = %e, "the client's port is taken towards the member; connecting from the client's address with another port");
                }
            }
            Err(e) if e.raw_os_error().is_some_and(is_socket_setup_error) => {
                return Err(self.failed(format!(
                    "source = \"client\": cannot use the client's address {ip}: {e}"
                )));
            }
            Err(e) => return Err(e),
        }
        let second = match open(ip, 0, member, vrf) {
            Ok(socket) => socket.connect(member).await,
            Err(e) => Err(e),
        };
        match second {
            Ok(s) => {
                self.connections.fetch_add(1, Ordering::Relaxed);
                Ok(s)
            }
            Err(e) if is_exhausted(&e) || e.raw_os_error().is_some_and(is_socket_setup_error) => {
                Err(self.failed(format!(
                    "source = \"client\": no port of the client's address {ip} is free towards {member}: {e}"
                )))
            }
            Err(e) => Err(e),
        }
    }

    fn failed(&self, why: String) -> io::Error {
        self.failures.fetch_add(1, Ordering::Relaxed);
        io::Error::new(io::ErrorKind::AddrNotAvailable, why)
    }
}

/// Errors of making the transparent socket (rather than of reaching the member): no
/// `CAP_NET_ADMIN` for the option, an address the kernel refuses to bind.
fn is_socket_setup_error(errno: i32) -> bool {
    matches!(errno, libc::EPERM | libc::EACCES | libc::EINVAL)
}

/// A transparent TCP socket bound to `ip:port` (`port` 0: the kernel picks it at connect time,
/// per 4-tuple).
fn open(ip: IpAddr, port: u16, member: SocketAddr, vrf: Option<&str>) -> io::Result<TcpSocket> {
    let socket = member_socket(member, vrf)?;
    let sock = socket2::SockRef::from(&socket);
    if ip.is_ipv4() {
        sock.set_ip_transparent_v4(true)?;
    } else {
        sock.set_ip_transparent_v6(true)?;
    }
    if port == 0 {
        // As for `snat`: without it the bind would take a port for every member at once.
        let _ = bind_address_no_port(&socket);
    } else {
        // The client's port may be bound by another transparent socket towards another member
        // (the client reached two services from one port): only the same 4-tuple conflicts,
        // which `connect` reports.
        socket.set_reuseaddr(true)?;
    }
    socket.bind(SocketAddr::new(ip, port))?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// On loopback (127.0.0.0/8 is all this host's, so no return path is needed): the member
    /// sees the client's address and port; the same client port towards the same member again
    /// falls back to another port, counted; a client of the other family is refused without
    /// blaming the member. Needs CAP_NET_ADMIN (the test command runs as root).
    #[tokio::test]
    async fn client_address_then_port_fallback_then_family_refusal() {
        let member = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = member.local_addr().unwrap();
        let t = Transparent::for_service("unit-transparent");
        let client: SocketAddr = "127.0.0.3:41234".parse().unwrap();

        let first = t
            .connect(client, to, None)
            .await
            .expect("transparent connect");
        let (_a, seen) = member.accept().await.unwrap();
        assert_eq!(seen, client);
        assert_eq!(first.local_addr().unwrap(), client);

        let second = t.connect(client, to, None).await.expect("fallback connect");
        let (_b, seen) = member.accept().await.unwrap();
        assert_eq!(seen.ip(), client.ip());
        assert_ne!(seen.port(), client.port());
        assert_eq!(second.local_addr().unwrap(), seen);
        assert_eq!(t.port_fallbacks.load(Ordering::Relaxed), 1);
        assert_eq!(t.connections.load(Ordering::Relaxed), 2);

        let v6: SocketAddr = "[::1]:41234".parse().unwrap();
        let e = t.connect(v6, to, None).await.expect_err("families differ");
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable, "{e}");
        assert!(e.to_string().contains("different address families"), "{e}");
        assert_eq!(t.failures.load(Ordering::Relaxed), 1);
        assert!(Transparent::all()
            .iter()
            .any(|s| &*s.service == "unit-transparent"));
    }
}
