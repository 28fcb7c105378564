//! The upstream half of one exchange, the same for HTTP/1 and HTTP/2 clients and for HTTP/1.1
//! and HTTP/2 members:
//!
//! ```text
//!   Route (service, pool, rule) ─▶ Attempts::next (persistence, then the scheduler)
//!   ─▶ acquire (private or shared idle connection, else connect + PROXY header + TLS)
//!   ─▶ [the client adapter sends the head and body, reads the response head]
//!   ─▶ Attempts::failed (classify: retry the same member fresh, another member, or answer
//!      502/503/504; passive health) | Attempts::answered (response time, passive status,
//!      persistence)
//! ```
//!
//! `request_loop` drives these steps, the same for every client session (`h1`, `forward`)
//! and both member protocols (`h2_upstream` for HTTP/2 members); every decision about which
//! member, whether to try again and what the member is told about its health is made here,
//! once.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::{PickContext, Picked};
use fulcrum_config::Reuse;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::client::{Client, ConnInfo};
use crate::head::{Parse, RequestHead, ResponseHead, Version};
use crate::local::Local;
use crate::rules::CompiledRule;
use crate::service::{request_hash, HttpService, Target};
use crate::sticky::Lookup;
use crate::timer::Timer;
use crate::upstream::{self, UpstreamConn};

/// Where the service's plan sends a request: the service, the pool (target) with its index,
/// and the rule that chose it. Everything per request that is not the request itself.
#[derive(Clone, Copy)]
pub(crate) struct Route<'a> {
    pub svc: &'a Arc<HttpService>,
    pub target: &'a Arc<Target>,
    /// The target's index in the service (persistence ids are per target).
    pub index: usize,
    pub rule: Option<&'a CompiledRule>,
    /// The member a filter chose (`fulcrum.member`): tried first, ahead of persistence; the
    /// scheduler picks when it is not in the pool or not available.
    pub member: Option<std::net::SocketAddr>,
}

impl<'a> Route<'a> {
    pub fn new(
        svc: &'a Arc<HttpService>,
        target: &'a Arc<Target>,
        index: usize,
        rule: Option<&'a CompiledRule>,
    ) -> Route<'a> {
        Route {
            svc,
            target,
            index,
            rule,
            member: None,
        }
    }

    /// Member connections are private to the client connection: the PROXY header describes
    /// one client, a transparent connection (`source = "client"`) comes from one client's
    /// address, and `reuse = "never"` shares nothing.
    pub fn private_conns(&self) -> bool {
        self.svc.proxy_protocol.is_some()
            || self.svc.transparent.is_some()
            || self.target.reuse == Reuse::Never
    }
}

/// Why an attempt at a member failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Connecting failed: TCP, the PROXY header, TLS or the HTTP/2 handshake.
    Connect(io::Error),
    /// No response head within the pool's `response_timeout`.
    Timeout,
    /// The response head is malformed.
    Bad(&'static str),
    /// The connection broke before a response head. `answered`: some response bytes had come
    /// (the request may have been acted on); `reused`: the connection had served before (the
    /// member may have closed it while it sat idle).
    Broken {
        why: String,
        answered: bool,
        reused: bool,
    },
}

impl Failure {
    /// The failure of reading a response head over an HTTP/1.1 member connection.
    pub fn of_response(e: RespError, fresh: bool) -> Failure {
        match e {
            RespError::Timeout => Failure::Timeout,
            RespError::Bad(e) => Failure::Bad(e.reason),
            RespError::Io(e, answered) => Failure::Broken {
                why: format!("reset before any response: {e}"),
                answered,
                reused: !fresh,
            },
            // The client adapter handles its own side before asking.
            RespError::Client => Failure::Broken {
                why: "the client went away".into(),
                answered: true,
                reused: false,
            },
        }
    }
}

/// One request's attempts at the members of its pool (on `fulcrum_balance::Attempts`), with the
/// HTTP decisions: which failures are tried again, what the client is answered when trying
/// stops, and what the member is told about its health.
pub(crate) struct Attempts<'a> {
    svc: &'a HttpService,
    target: &'a Target,
    pool: fulcrum_balance::Attempts<'a>,
    lookup: Lookup,
    /// The request may be sent again (idempotent, and its body can be replayed).
    retryable: bool,
    /// The next attempt must open a new connection (the reused one had been closed).
    fresh: bool,
    /// The member last sent back to over a new connection: once per member.
    again: Option<usize>,
}

impl<'a> Attempts<'a> {
    pub fn new(route: Route<'a>, req: &RequestHead, client: &Client, retryable: bool) -> Self {
        let t = &**route.target;
        let lookup = match &route.svc.sticky {
            Some(s) => s.lookup(req, client.ip, route.index, &t.pool),
            None => Lookup::default(),
        };
        let ctx = PickContext {
            hash: request_hash(&t.pool, req, client),
        };
        Attempts {
            svc: route.svc,
            target: t,
            pool: t.pool.attempts(ctx, route.member.or(lookup.member)),
            lookup,
            retryable,
            fresh: false,
            again: None,
        }
    }

    /// The member for the next attempt, or the answer when there is none: the no-member answer
    /// (GSLB redirect or 503) before any try, 502 after.
    pub fn next(&mut self, req: &RequestHead, client: &Client) -> Result<Picked, Local> {
        match self.pool.next_member() {
            Some(p) => Ok(p),
            None if self.pool.tried() == 0 => Err(self.svc.no_member(self.target, req, client)),
            None => Err(self.give_up(Local::error(502, "no member could be reached"))),
        }
    }

    /// Whether the request may be sent again (idempotent, with a body that can be replayed).
    pub fn retryable(&self) -> bool {
        self.retryable
    }

    /// Whether this attempt must open a new connection; asked once per attempt.
    pub fn fresh_only(&mut self) -> bool {
        std::mem::take(&mut self.fresh)
    }

    /// Records `f` against `picked` and decides: `Ok` to try again (`next` says where), or the
    /// answer for the client.
    pub fn failed(&mut self, picked: &Picked, f: Failure) -> Result<(), Local> {
        let member = &picked.member;
        let http = &self.svc.http_stats;
        match f {
            Failure::Connect(e) if fulcrum_net::snat::is_snat_exhaustion(&e) => {
                // No source port left (`snat`), or the client's address cannot be taken
                // (`source = "client"`): not the member's fault, and no other member would
                // fare better from the same addresses.
                Err(self.give_up(snat_exhausted()))
            }
            Failure::Connect(e) => {
                member.record_connect_failure(&format!("connect: {e}"));
                if self.pool.failed(picked) {
                    http.retries.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(self.give_up(Local::error(502, "no member could be reached")))
            }
            Failure::Timeout => {
                http.response_timeouts.fetch_add(1, Ordering::Relaxed);
                member.record_passive_failure(&format!(
                    "no response within {:?}",
                    self.target.response_timeout
                ));
                Err(Local::error(504, "the member did not answer in time"))
            }
            Failure::Bad(reason) => {
                member.record_passive_failure(reason);
                Err(Local::error(502, reason))
            }
            Failure::Broken {
                why,
                answered,
                reused,
            } => {
                if reused && !answered && self.retryable && self.again != Some(picked.index) {
                    // A reused connection the member had just closed: not the member's fault;
                    // send again over a new connection to the same member.
                    self.again = Some(picked.index);
                    self.fresh = true;
                    self.pool.same_again(picked);
                    return Ok(());
                }
                member.record_passive_failure(&why);
                if self.retryable && !answered && self.pool.may_retry() {
                    self.pool.failed(picked);
                    http.retries.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(self.give_up(Local::error(502, "the member broke the connection")))
            }
        }
    }

    fn give_up(&self, l: Local) -> Local {
        self.svc
            .stats
            .upstream_failures
            .fetch_add(1, Ordering::Relaxed);
        l
    }

    /// `picked` answered with `status` after `took`: its response time, the passive status
    /// check, and persistence (the table learns where the client went).
    pub fn answered(&mut self, picked: &Picked, status: u16, took: Duration) {
        let member = &picked.member;
        member.stats.observe_response_time(took);
        self.target.observer.observe(member, status);
        if let Some(s) = &self.svc.sticky {
            s.remember(&mut self.lookup, member.address);
        }
    }

    /// What persistence found for the request (the response's cookie decisions use it).
    pub fn lookup(&self) -> &Lookup {
        &self.lookup
    }
}

/// An HTTP/1.1 connection to `picked` for one attempt: `private` (the client connection's own,
/// when the route keeps them private) or an idle one from the member's store unless `fresh`
/// is asked; else a new one (connect, PROXY header, TLS). Returns it counted as in use, and
/// whether it is new.
pub(crate) async fn acquire(
    route: Route<'_>,
    picked: &Picked,
    client: &ConnInfo,
    private: Option<UpstreamConn>,
    fresh: bool,
    retryable: bool,
) -> io::Result<(UpstreamConn, bool)> {
    let t = &**route.target;
    let reused = if fresh {
        None
    } else if route.private_conns() {
        private
    } else {
        t.conns
            .get(picked.index)
            .and_then(|s| s.take(t.reuse == Reuse::Safe && !retryable))
    };
    let (mut conn, fresh) = match reused {
        Some(c) => (c, false),
        // Boxed: connecting (TCP, PROXY header, TLS) is the rare case with reused connections,
        // and its state would otherwise size every request's future.
        None => (Box::pin(connect(route, picked, client)).await?, true),
    };
    conn.guard = Some(picked.member.use_connection(fresh));
    conn.used += 1;
    Ok((conn, fresh))
}

/// A new connection to `picked`: TCP from the service's `snat` addresses or the client's own
/// (`source = "client"`), the PROXY header, TLS when the pool has it.
async fn connect(route: Route<'_>, picked: &Picked, client: &ConnInfo) -> io::Result<UpstreamConn> {
    let t = &**route.target;
    let member = &picked.member;
    let started = Instant::now();
    #[cfg(any(test, feature = "memory-members"))]
    if let Some(io) = upstream::memory_member(member.address, t.tls.is_some()) {
        let mut io = io?;
        member.record_connect_success(started.elapsed());
        if let Some(v) = route.svc.proxy_protocol {
            let header = fulcrum_net::proxy_protocol::header(v, client.peer, client.local);
            io.write_all(&header).await?;
        }
        return Ok(UpstreamConn::new(io));
    }
    let source = fulcrum_net::Source::of(
        route.svc.snat.as_deref(),
        route.svc.transparent.as_deref(),
        client.peer,
    );
    let vrf = t.pool.config.vrf.as_deref();
    let mut io =
        fulcrum_net::snat::connect_from(source, vrf, member.address, t.pool.connect_timeout)
            .await?;
    member.record_connect_success(started.elapsed());
    if let Some(v) = route.svc.proxy_protocol {
        let header = fulcrum_net::proxy_protocol::header(v, client.peer, client.local);
        io.write_all(&header).await?;
    }
    let io = upstream::secure(io, t.tls.as_deref(), member.address, t.pool.connect_timeout).await?;
    Ok(UpstreamConn::new(io))
}

/// The answer when the service's `snat` pool has no source port left towards the member.
pub(crate) fn snat_exhausted() -> Local {
    let mut l = Local::error(503, "no source address left for a member connection");
    l.retry_after = true;
    l
}

#[derive(Debug)]
pub(crate) enum RespError {
    /// The client broke the connection while interim responses were passed on.
    Client,
    Timeout,
    Bad(crate::head::HeadError),
    /// An I/O error or end of stream; `true` if any response byte had arrived.
    Io(io::Error, bool),
}

/// Reads the member's response head within the timer's deadline. Interim 1xx responses (other
/// than 101) are passed on to an HTTP/1.1 client as they come.
pub(crate) async fn read_response_head<W: AsyncWrite + Unpin>(
    conn: &mut UpstreamConn,
    timer: &mut Timer,
    client: &mut W,
    client_version: Version,
) -> Result<ResponseHead, RespError> {
    let mut resp = ResponseHead::with_buffer(std::mem::take(&mut conn.buf));
    let mut got_bytes = !resp.buf.is_empty();
    loop {
        if !resp.buf.is_empty() {
            match resp.parse() {
                Ok(Parse::Complete) => {
                    if (100..200).contains(&resp.status) && resp.status != 101 {
                        if client_version == Version::Http11 {
                            client
                                .write_all(&resp.buf[..resp.head_len])
                                .await
                                .map_err(|_| RespError::Client)?;
                        }
                        resp.buf.drain(..resp.head_len);
                        continue;
                    }
                    return Ok(resp);
                }
                Ok(Parse::Partial) => {}
                Err(e) => return Err(RespError::Bad(e)),
            }
        }
        resp.buf.reserve(8192);
        match timer.run(conn.io.read_buf(&mut resp.buf)).await {
            Some(Ok(0)) => {
                return Err(RespError::Io(
                    io::ErrorKind::UnexpectedEof.into(),
                    got_bytes,
                ))
            }
            Some(Ok(_)) => got_bytes = true,
            Some(Err(e)) => return Err(RespError::Io(e, got_bytes)),
            None => return Err(RespError::Timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{client, request, service};

    fn route(svc: &Arc<HttpService>) -> Route<'_> {
        Route {
            svc,
            target: &svc.targets[0],
            index: 0,
            rule: None,
            member: None,
        }
    }

    fn reset(answered: bool, reused: bool) -> Failure {
        Failure::Broken {
            why: "reset".into(),
            answered,
            reused,
        }
    }

    #[test]
    fn connect_failures_move_on_to_other_members_then_answer_502() {
        let svc = service(4, "", "");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let mut seen = Vec::new();
        let answer = loop {
            let p = a.next(&req, &c).expect("a member");
            assert!(!seen.contains(&p.index));
            seen.push(p.index);
            let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
            if let Err(l) = a.failed(&p, Failure::Connect(refused)) {
                break l;
            }
        };
        // The first member and `retries` more.
        assert_eq!(seen.len(), 3);
        assert_eq!(answer.status, 502);
        assert_eq!(svc.http_stats.retries.load(Ordering::Relaxed), 2);
        assert_eq!(svc.stats.upstream_failures.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_reused_connection_closed_by_the_member_is_retried_fresh_on_the_same_member_once() {
        let svc = service(3, "", "");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let p = a.next(&req, &c).unwrap();
        assert!(!a.fresh_only());
        assert!(a.failed(&p, reset(false, true)).is_ok());
        let q = a.next(&req, &c).unwrap();
        assert_eq!(p.index, q.index, "the same member again");
        assert!(a.fresh_only(), "over a new connection");
        assert!(!a.fresh_only(), "asked once");
        assert_eq!(svc.http_stats.retries.load(Ordering::Relaxed), 0);
        assert_eq!(p.member.health.report().consecutive_failures, 0);
        // The same failure again on that member counts against it and moves on.
        assert!(a.failed(&q, reset(false, true)).is_ok());
        let r = a.next(&req, &c).unwrap();
        assert_ne!(r.index, q.index);
        assert_eq!(svc.http_stats.retries.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_request_that_cannot_be_replayed_is_never_sent_twice() {
        let svc = service(3, "", "");
        let (req, c) = (request("POST / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, false);
        let p = a.next(&req, &c).unwrap();
        let l = a.failed(&p, reset(false, true)).unwrap_err();
        assert_eq!(l.status, 502);
        assert_eq!(svc.http_stats.retries.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_member_that_began_to_answer_is_not_asked_again() {
        let svc = service(3, "", "");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let p = a.next(&req, &c).unwrap();
        assert_eq!(a.failed(&p, reset(true, true)).unwrap_err().status, 502);
    }

    #[test]
    fn timeouts_and_bad_heads_answer_at_once() {
        let svc = service(3, "", "");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let p = a.next(&req, &c).unwrap();
        assert_eq!(a.failed(&p, Failure::Timeout).unwrap_err().status, 504);
        assert_eq!(svc.http_stats.response_timeouts.load(Ordering::Relaxed), 1);
        let l = a.failed(&p, Failure::Bad("bad status line")).unwrap_err();
        assert_eq!((l.status, l.body.is_empty()), (502, false));
    }

    #[test]
    fn snat_exhaustion_answers_503_without_blaming_the_member() {
        let svc = service(2, "", "");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let p = a.next(&req, &c).unwrap();
        let e = io::Error::from(io::ErrorKind::AddrNotAvailable);
        let l = a.failed(&p, Failure::Connect(e)).unwrap_err();
        assert_eq!((l.status, l.retry_after), (503, true));
        assert_eq!(p.member.health.report().consecutive_failures, 0);
    }

    #[test]
    fn an_answer_is_remembered_for_persistence_and_followed_next_time() {
        let svc = service(3, "persistence = \"s\"", "type = \"source_ip\"");
        let (req, c) = (request("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), client());
        let mut a = Attempts::new(route(&svc), &req, &c, true);
        let p = a.next(&req, &c).unwrap();
        a.answered(&p, 200, Duration::from_millis(1));
        for _ in 0..3 {
            let mut b = Attempts::new(route(&svc), &req, &c, true);
            assert_eq!(b.next(&req, &c).unwrap().index, p.index);
        }
    }
}
