//! Source address pools for member connections (`snat` on a service): the full proxy's answer
//! to the ~28k–64k concurrent connections one source address allows towards one member. Each
//! member connection takes the next address of the pool (round robin); the socket is bound to
//! the address with `IP_BIND_ADDRESS_NO_PORT` before `connect`, so the kernel picks the port per
//! 4-tuple at connect time and the same port can serve several members. An address whose ports
//! towards that member are all taken (`EADDRNOTAVAIL`) is counted and the next one tried; when
//! every address is exhausted the connection fails at once with `AddrNotAvailable`, which the
//! data planes count and do not blame on the member.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::bind::{bind_address_no_port, is_exhausted, member_socket};

/// One source address of a pool and its counters.
#[derive(Debug)]
pub struct SnatAddress {
    pub ip: IpAddr,
    /// Member connections established from this address.
    pub connections: AtomicU64,
    /// Attempts that found no free port on this address towards the member (`EADDRNOTAVAIL`).
    pub exhausted: AtomicU64,
}

/// A service's source address pool.
#[derive(Debug)]
pub struct Snat {
    pub service: Arc<str>,
    pub addresses: Vec<SnatAddress>,
    /// Member connections that failed because every address of the member's family was
    /// exhausted.
    pub failures: AtomicU64,
    next: AtomicUsize,
}

/// Two pools are the same when they serve the same service from the same addresses (a message
/// service keeps its member connections across a reload that keeps its pool).
impl PartialEq for Snat {
    fn eq(&self, other: &Snat) -> bool {
        self.service == other.service
            && self
                .addresses
                .iter()
                .map(|a| a.ip)
                .eq(other.addresses.iter().map(|a| a.ip))
    }
}

impl Eq for Snat {}

/// Pools by service name, so counters survive a reload that keeps a service's addresses.
fn registry() -> &'static Mutex<HashMap<String, Arc<Snat>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Snat>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Snat {
    /// The pool of service `service` over `ips` (None when `ips` is empty). Each address must
    /// be local: it is bound once (port 0) here, so a reload with an address this host does
    /// not have is refused with a clear error rather than failing every connection later.
    /// The same service with the same addresses keeps its counters across reloads.
    pub fn for_service(service: &str, ips: &[IpAddr]) -> Result<Option<Arc<Snat>>, String> {
        if ips.is_empty() {
            return Ok(None);
        }
        for ip in ips {
            let probe = if ip.is_ipv4() {
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            } else {
                socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)
            }
            .and_then(|s| s.bind(&SocketAddr::new(*ip, 0).into()));
            if let Err(e) = probe {
                return Err(format!(
                    "snat address {ip} cannot be used as a source: {e} (it must be an address of this host)"
                ));
            }
        }
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = reg.get(service) {
            if s.addresses.iter().map(|a| a.ip).eq(ips.iter().copied()) {
                return Ok(Some(s.clone()));
            }
        }
        let s = Arc::new(Snat {
            service: Arc::from(service),
            addresses: ips
                .iter()
                .map(|&ip| SnatAddress {
                    ip,
                    connections: AtomicU64::new(0),
                    exhausted: AtomicU64::new(0),
                })
                .collect(),
            failures: AtomicU64::new(0),
            next: AtomicUsize::new(0),
        });
        reg.insert(service.to_string(), s.clone());
        Ok(Some(s))
    }

    /// Forgets the pools of services that no longer have one (after a reload), so their
    /// counters leave the metrics.
    pub fn retain(keep: &dyn Fn(&str) -> bool) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|name, _| keep(name));
    }

    /// Every pool in use, for metrics.
    pub fn all() -> Vec<Arc<Snat>> {
        let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = reg.values().cloned().collect();
        v.sort_by(|a, b| a.service.cmp(&b.service));
        v
    }

    /// Connects to `member` from the next address of the pool of the member's family, moving on
    /// to the following one while an address is exhausted. Fails with `AddrNotAvailable` when
    /// every address is (or none has the member's family), after counting it.
    async fn connect(&self, member: SocketAddr, vrf: Option<&str>) -> io::Result<TcpStream> {
        let n = self.addresses.len();
        // One shared counter per connection: the only cost on the connect path besides the
        // bind and setsockopt syscalls.
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            let a = &self.addresses[(start + k) % n];
            if a.ip.is_ipv4() != member.is_ipv4() {
                continue;
            }
            let socket = member_socket(member, vrf)?;
            // Without the option (an old kernel) the pool still works, with a port per socket.
            let _ = bind_address_no_port(&socket);
            let bound = socket.bind(SocketAddr::new(a.ip, 0));
            let result = match bound {
                Ok(()) => socket.connect(member).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(s) => {
                    a.connections.fetch_add(1, Ordering::Relaxed);
                    return Ok(s);
                }
                Err(e) if is_exhausted(&e) => {
                    let before = a.exhausted.fetch_add(1, Ordering::Relaxed);
                    if before.is_power_of_two() || before == 0 {
                        tracing::warn!(service = %self.service, source = %a.ip, %member, exhausted = before + 1, "snat address has no free port towards the member; trying the next");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("snat pool exhausted: no source address of the service has a free port towards {member}"),
        ))
    }
}

/// Where a member connection comes from: the host's choice, the service's source pool
/// (`snat`), or the client's own address (`source = "client"`).
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Host,
    Snat(&'a Snat),
    /// The service's transparency counters and the client whose address the connection takes.
    Client(&'a crate::transparent::Transparent, SocketAddr),
}

impl<'a> Source<'a> {
    /// The source of a service's member connection for `client`: its transparency when it has
    /// `source = "client"`, else its `snat` pool, else the host's choice.
    pub fn of(
        snat: Option<&'a Snat>,
        transparent: Option<&'a crate::transparent::Transparent>,
        client: SocketAddr,
    ) -> Source<'a> {
        match (transparent, snat) {
            (Some(t), _) => Source::Client(t, client),
            (None, Some(s)) => Source::Snat(s),
            (None, None) => Source::Host,
        }
    }
}

/// Connects to a member within `timeout`, from the service's source pool when it has one, with
/// TCP_NODELAY. A timeout is `TimedOut`; an exhausted pool `AddrNotAvailable` (not the
/// member's fault).
pub async fn connect(
    snat: Option<&Snat>,
    vrf: Option<&str>,
    member: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    connect_from(
        snat.map_or(Source::Host, Source::Snat),
        vrf,
        member,
        timeout,
    )
    .await
}

/// Connects to a member within `timeout` from `source`, with TCP_NODELAY. A timeout is
/// `TimedOut`; a source that cannot be used (an exhausted pool, a client address that cannot
/// be taken) `AddrNotAvailable`, which is not the member's fault.
/// `vrf`: the pool's VRF device, which the connection is bound into.
pub async fn connect_from(
    source: Source<'_>,
    vrf: Option<&str>,
    member: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let attempt = async {
        match source {
            Source::Host if vrf.is_none() => TcpStream::connect(member).await,
            Source::Host => member_socket(member, vrf)?.connect(member).await,
            Source::Snat(s) => s.connect(member, vrf).await,
            Source::Client(t, client) => t.connect(client, member, vrf).await,
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )),
    }
}

/// Whether a connect error is the source pool's exhaustion rather than the member's failure.
pub fn is_snat_exhaustion(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::AddrNotAvailable
}
